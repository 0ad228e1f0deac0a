"""Load GB/s of a checkpoint onto the GPU against a plain read of the same file bytes (pytest-benchmark).

    pytest <this stage>/bench_load.py --benchmark-only -m gpu      # the 1B preset: 2.47 GB
The first call writes the preset (once) and warms the page cache, so both measure memory, not the disk.
`serial` is one pinned staging buffer filled by one thread (copy, then DMA, then copy...); `4-threads` is the
loader's default.
"""
import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.bench.measure import plain_read_gbps
from common.synthetic import resolve_model

MODEL = "llama-3.2-1b"


@pytest.fixture(scope="module")
def checkpoint():
    return Checkpoint(resolve_model(MODEL))


def test_plain_read(benchmark, checkpoint):
    buf = np.ones(sum(f.stat().st_size for f in checkpoint.files), dtype=np.uint8)  # faulted in once, reused
    gbps = benchmark.pedantic(plain_read_gbps, args=(checkpoint.files, buf, 1), rounds=5, warmup_rounds=1)
    benchmark.extra_info["GB/s"] = round(gbps, 2)
    benchmark.extra_info["bytes"] = sum(f.stat().st_size for f in checkpoint.files)


@pytest.mark.gpu
@pytest.mark.parametrize("buffers", [1, 4], ids=["serial", "4-threads"])
def test_load_to_gpu(benchmark, checkpoint, buffers):
    from common.device import get_gpu
    from .weights import load_weights

    gpu = get_gpu()

    def load():
        w = load_weights(checkpoint, gpu, progress=False, buffers=buffers)
        return w.stats.gb_per_s   # w (and its arena) is freed when it goes out of scope

    gbps = benchmark.pedantic(load, rounds=5, warmup_rounds=1)
    benchmark.extra_info["GB/s"] = round(gbps, 2)
    benchmark.extra_info["bytes"] = checkpoint.total_bytes
