"""What one kernel launch still costs inside a graph (pytest-benchmark): common/kernels/chain.cu, a kernel that does
nothing but wait for the one before it and add 1 to its elements, launched LAUNCHES times in a row, captured in a
graph and replayed as a decode step is, with programmatic dependent launch (kernels/pdl.cuh, stage10 on) and without,
at one block, one block an SM and four an SM.

    pytest tests/bench_launch.py --benchmark-only -m gpu

A figure is one replay's GPU time (two events around it) over LAUNCHES, the median of REPLAYS: what a kernel
boundary costs whatever the kernel does. Fusing kernels removes boundaries; a persistent kernel removes all of them
(stage10's chapter, section 5). Every replay is checked: each element gained LAUNCHES, so no launch ran early.
"""
from pathlib import Path

import numpy as np
import pytest

from common.compile import KernelModule
from common.device import get_gpu

pytestmark = pytest.mark.gpu
CHAIN = Path(__file__).resolve().parents[1] / "common" / "kernels" / "chain.cu"
LAUNCHES, THREADS, REPLAYS = 64, 128, 20


@pytest.fixture(scope="module")
def gpu():
    return get_gpu()


@pytest.mark.parametrize("blocks_per_sm", [0, 1, 4], ids=["one-block", "a-block-an-sm", "four-an-sm"])
@pytest.mark.parametrize("pdl", [False, True], ids=["serial", "pdl"])
def test_launch(benchmark, gpu, pdl, blocks_per_sm):
    from cuda.core import LaunchConfig

    blocks = max(1, blocks_per_sm * gpu.device.properties.multiprocessor_count)
    kernel = KernelModule(CHAIN, gpu.arch).kernel("chain")
    config = LaunchConfig(grid=blocks, block=THREADS, programmatic_stream_serialization=pdl)
    x = gpu.to_device(np.zeros(blocks * THREADS, np.int32))
    graph = gpu.capture(lambda: [gpu.launch(kernel, config, x.arg) for _ in range(LAUNCHES)])
    graph.launch()                                                     # its first replay, untimed
    ms = []

    def replay():
        start = gpu.record()
        graph.launch()
        end = gpu.record()
        end.sync()
        ms.append(end - start)

    benchmark.pedantic(replay, rounds=REPLAYS)
    got = gpu.to_host(x)
    assert (got == LAUNCHES * (REPLAYS + 1)).all(), f"elements at {sorted(set(got.tolist()))[:5]}, not all " \
                                                    f"{LAUNCHES * (REPLAYS + 1)}: a launch ran before the one ahead"
    us = [1e3 * m / LAUNCHES for m in ms]
    benchmark.extra_info.update(pdl=pdl, blocks=blocks, threads=THREADS, launches=LAUNCHES,
                                us_per_launch=round(float(np.median(us)), 3), us_min=round(min(us), 3),
                                us_max=round(max(us), 3))
