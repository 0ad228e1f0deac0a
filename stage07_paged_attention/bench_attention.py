"""The paged attention kernels alone (pytest-benchmark), 1B shape (32 query heads over 8 K/V heads of 64), each
sequence's blocks at shuffled places of the pool, block sizes 8, 16 (the default) and 32:

    pytest <this stage>/bench_attention.py --benchmark-only -m gpu

  decode   B = 1 and 64 rows, each over 128, 1024 and 4096 cached positions: the kernel's GPU time per layer
           (the tensor-core kernel on one-row tiles, and the combine where decode_split() splits), against the
           time to read that K/V once at the measured copy bandwidth, the kernel's floor
  prefill  one prompt of 2048 and 8192 tokens, tiles of 16 rows: GPU time per layer and achieved
           TFLOP/s (4 hd flops per (query, key, head) pair under the causal mask: QK^T and PV)
GPU time is from events around 20 launches queued while a spin kernel holds the GPU (common.bench.measure's
gpu_and_host_ms), so they run back to back and the host's launch cost is not in the figures: they are the
kernels'. (Without the hold, a kernel shorter than the host's time to queue it would time the host.)
pytest-benchmark's own timing is the wall time of one such batch.
"""
import numpy as np
import pytest

from common.bf16 import f32_to_bf16
from common.device import get_gpu
from common.bench.measure import gpu_and_host_ms

from .kernels import Kernels, decode_split, tile_rows
from .packing import plan_attention

pytestmark = pytest.mark.gpu
NH, NKV, HD = 32, 8, 64
LAUNCHES = 20


@pytest.fixture(scope="module")
def kernels():
    return Kernels(get_gpu())


def random_bf16(gpu, shape, rng):
    return gpu.to_device(f32_to_bf16(rng.normal(0, 1, shape).astype(np.float32)), "bf16")


def paged(gpu, rng, B, keys, block_size):
    """K and V caches of B sequences of `keys` positions in a pool of blocks, and their block tables: every
    sequence's blocks in a random order, as a pool that has served many requests hands them out."""
    W = -(-keys // block_size)
    k, v = (random_bf16(gpu, (B * W, block_size, NKV, HD), rng) for _ in range(2))
    return k, v, gpu.to_device(rng.permutation(B * W).astype(np.int32).reshape(B, W))


def timed(benchmark, gpu, launch) -> float:
    """GPU milliseconds per launch: the median over pytest-benchmark's rounds of LAUNCHES event-timed launches
    (their min and max go into extra_info as the spread)."""
    per_round = []

    def one_round():
        def enqueue():
            for _ in range(LAUNCHES):
                launch()
        per_round.append(gpu_and_host_ms(gpu, enqueue, repeats=1)["gpu_ms"] / LAUNCHES)

    benchmark.pedantic(one_round, rounds=5, warmup_rounds=1)
    per_round = per_round[-5:]                   # the timed rounds: pytest-benchmark runs the warm-up round first
    benchmark.extra_info.update(gpu_ms_min=round(min(per_round), 5), gpu_ms_max=round(max(per_round), 5))
    return float(np.median(per_round))


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("B", [1, 64])
@pytest.mark.parametrize("keys", [128, 1024, 4096])
def test_decode_attention(benchmark, kernels, B, keys, block_size):
    gpu, rng = kernels.gpu, np.random.default_rng(0)
    qkv = random_bf16(gpu, (B, (NH + 2 * NKV) * HD), rng)
    k_cache, v_cache, tables = paged(gpu, rng, B, keys, block_size)
    out = gpu.empty((B, NH * HD), "bf16")
    rows = np.arange(B, dtype=np.int32)                              # row b: seq_slot b at position keys - 1
    _, decode = plan_attention(np.stack([rows, rows * 0 + 1, rows, rows * 0 + keys - 1], 1), tile_rows(NH, NKV, HD))
    tiles = gpu.to_device(decode)
    n_splits, per_split = decode_split(B, keys, NKV, kernels.sms, 4 * 256)   # the model's partials for 256 seqs
    partial = gpu.empty((B * n_splits * NH * (HD + 2),), "f32")
    ms = timed(benchmark, gpu, lambda: kernels.attention(qkv, k_cache, v_cache, out, partial, tiles, tables, NH,
                                                         NKV, HD, n_splits, per_split))
    kv_bytes = 2 * B * keys * NKV * HD * 2
    floor_ms = kv_bytes / (gpu.copy_bandwidth_gbps() * 1e9) * 1e3
    benchmark.extra_info.update(block_size=block_size, batch_size=B, cached_positions=keys, n_splits=n_splits,
                                us_per_layer=round(1e3 * ms, 2),
                                floor_us=round(1e3 * floor_ms, 2), times_floor=round(ms / floor_ms, 2),
                                achieved_gb_per_s=round(kv_bytes / ms / 1e6, 1))


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("length", [2048, 8192])
def test_prefill_attention(benchmark, kernels, length, block_size):
    gpu, rng = kernels.gpu, np.random.default_rng(0)
    qkv = random_bf16(gpu, (length, (NH + 2 * NKV) * HD), rng)
    k_cache, v_cache, tables = paged(gpu, rng, 1, length, block_size)
    out = gpu.empty((length, NH * HD), "bf16")
    prompt, _ = plan_attention(np.array([[0, length, 0, 0]], np.int32), tile_rows(NH, NKV, HD))
    tiles, partial = gpu.to_device(prompt), gpu.empty((1,), "f32")
    ms = timed(benchmark, gpu, lambda: kernels.attention(qkv, k_cache, v_cache, out, partial, tiles, tables, NH, NKV,
                                                         HD))
    flops = 4 * HD * NH * length * (length + 1) / 2
    benchmark.extra_info.update(block_size=block_size, prompt_tokens=length, ms_per_layer=round(ms, 3),
                                tflop_per_s=round(flops / ms / 1e9, 1))
