"""The paged attention kernels alone (pytest-benchmark), 1B shape (32 query heads over 8 K/V heads of 64), each
sequence's blocks at shuffled places of the pool, block sizes 8, 16 (the default) and 32:

    pytest <this stage>/bench_attention.py --benchmark-only -m gpu

  decode   B = 1 and 64 rows, each over 128, 1024 and 4096 cached positions: the kernel's GPU time per layer
           (the tensor-core kernel on one-row tiles, its splits merged inside where decode_split() splits), against the
           time to read that K/V once at the measured copy bandwidth, the kernel's floor
  split    B = 1 over 256 and 1024 cached positions, the keys cut into 1, 2, 4, 8 and 16 splits whatever
           decode_split() would pick: where a batch-1 step's attention is fastest
  prefill  one prompt of 2048, 8192 and 32768 tokens, head_dim 64 (the 1B's 32 heads over 8) and 128 (16 over
           4), through attention_hopper (wgmma, TMA; 192 M-rows a tile at head_dim 64, 128 at 128) and
           attention_tiles (mma.sync; 64): GPU time per layer and achieved TFLOP/s (4 hd flops per (query, key,
           head) pair under the causal mask: QK^T and PV)
  chunk    one 2,048-row chunk 30,720 positions into a prompt (`long`'s last chunks at 32K), through
           attention_hopper with the launch's last-wave tiles whole and split by keys (packing.split_tail); and,
           split, one launch at a time between events of its own, after nothing, after 256 MiB written (the L2
           emptied of its K/V, and of q) or after a GEMM of down's shape (as in a prompt, where a layer's GEMMs run
           between two attention launches)
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

from .kernels import HOPPER_TILE_N, Kernels, decode_split, hopper_partial_floats, tile_rows
from .packing import plan_attention, split_tail, whole_pieces

pytestmark = pytest.mark.gpu
NH, NKV, HD = 32, 8, 64
LAUNCHES = 20


@pytest.fixture(scope="module")
def kernels():
    return Kernels(get_gpu())


def random_bf16(gpu, shape, rng):
    return gpu.to_device(f32_to_bf16(rng.normal(0, 1, shape).astype(np.float32)), "bf16")


def paged(gpu, rng, B, keys, block_size, nkv=NKV, hd=HD):
    """K and V caches of B sequences of `keys` positions in a pool of blocks, and their block tables: every
    sequence's blocks in a random order, as a pool that has served many requests hands them out."""
    W = -(-keys // block_size)
    k, v = (random_bf16(gpu, (B * W, block_size, nkv, hd), rng) for _ in range(2))
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
    decode_timed(benchmark, kernels, qkv, (k_cache, v_cache, tables), out, tiles, B, keys, n_splits, per_split)
    benchmark.extra_info.update(block_size=block_size)


@pytest.mark.parametrize("keys", [256, 1024])
@pytest.mark.parametrize("n_splits", [1, 2, 4, 8, 16])
def test_decode_split(benchmark, kernels, keys, n_splits):
    gpu, rng = kernels.gpu, np.random.default_rng(0)
    qkv = random_bf16(gpu, (1, (NH + 2 * NKV) * HD), rng)
    out = gpu.empty((1, NH * HD), "bf16")
    _, decode = plan_attention(np.array([[0, 1, 0, keys - 1]], np.int32), tile_rows(NH, NKV, HD))
    per_split = 32 * -(-keys // (32 * n_splits))                     # whole 32-key tiles, as decode_split()
    decode_timed(benchmark, kernels, qkv, paged(gpu, rng, 1, keys, 16), out, gpu.to_device(decode), 1, keys,
                 -(-keys // per_split), per_split)


def decode_timed(benchmark, kernels, qkv, cache, out, tiles, B, keys, n_splits, per_split):
    """Time the decode rows' attention at the given split; the figures into extra_info."""
    gpu, (k_cache, v_cache, tables) = kernels.gpu, cache
    partial = gpu.empty((B * n_splits * NH * (HD + 2),), "f32")
    arrivals = gpu.to_device(np.zeros(B * NKV, np.int32))           # where the splits meet: zero between launches
    split_keys = gpu.to_device(np.array([per_split], np.int32))     # the kernels read it from the device
    ms = timed(benchmark, gpu, lambda: kernels.attention(qkv, k_cache, v_cache, out, partial, arrivals, tiles,
                                                         tables, NH, NKV, HD, n_splits, split_keys))
    kv_bytes = 2 * B * keys * NKV * HD * 2
    floor_ms = kv_bytes / (gpu.copy_bandwidth_gbps() * 1e9) * 1e3
    benchmark.extra_info.update(batch_size=B, cached_positions=keys, n_splits=n_splits,
                                us_per_layer=round(1e3 * ms, 2),
                                floor_us=round(1e3 * floor_ms, 2), times_floor=round(ms / floor_ms, 2),
                                achieved_gb_per_s=round(kv_bytes / ms / 1e6, 1))


@pytest.mark.parametrize("kernel", ["hopper", "mma"])
@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("length", [2048, 8192, 32768])
def test_prefill_attention(benchmark, kernels, length, hd, kernel):
    """One prompt in one launch (the engine cuts a long prompt into 2,048-row chunks; this is the kernel alone)."""
    from types import SimpleNamespace

    from .kernels import HOPPER_TILE_M
    from .tma import kv_tensor_maps

    gpu, rng, block_size = kernels.gpu, np.random.default_rng(0), 16
    if kernel == "hopper" and not kernels.hopper_prefill(hd, block_size):
        pytest.skip(f"no attention_hopper on {gpu.name} (sm_90 only)")
    nh, nkv = NH * HD // hd, NKV * HD // hd                  # 2,048 query dims over 512 K/V dims, as the 1B
    qkv = random_bf16(gpu, (length, (nh + 2 * nkv) * hd), rng)
    k_cache, v_cache, tables = paged(gpu, rng, 1, length, block_size, nkv, hd)
    out = gpu.empty((length, nh * hd), "bf16")
    rows = HOPPER_TILE_M[hd] // (nh // nkv) if kernel == "hopper" else tile_rows(nh, nkv, hd)
    prompt, _ = plan_attention(np.array([[0, length, 0, 0]], np.int32), rows)
    tiles = gpu.to_device(prompt)
    if kernel == "hopper":
        maps = kv_tensor_maps(gpu, SimpleNamespace(k=[k_cache], v=[v_cache]))
        launch = hopper_launch(kernels, qkv, out, maps, tables, split_tail(prompt, HOPPER_TILE_N[hd], nkv,
                                                                           kernels.sms), nh, nkv, hd, block_size)
        ms = timed(benchmark, gpu, launch)
    else:
        partial, arrivals = gpu.empty((1,), "f32"), gpu.empty((1,), "i32")
        ms = timed(benchmark, gpu, lambda: kernels.attention(qkv, k_cache, v_cache, out, partial, arrivals, tiles,
                                                             tables, nh, nkv, hd))
    flops = 4 * hd * nh * length * (length + 1) / 2
    benchmark.extra_info.update(kernel=kernel, head_dim=hd, block_size=block_size, prompt_tokens=length,
                                ms_per_layer=round(ms, 3), tflop_per_s=round(flops / ms / 1e9, 1))


def timed_after(benchmark, gpu, launch, before) -> float:
    """GPU milliseconds of one launch queued right after before(), between events of its own: before(), an event, the
    launch and an event are queued while a spin kernel holds the GPU (gpu_and_host_ms), so they run back to back and
    before()'s time is not in the figure. The median of LAUNCHES launches a round, then over pytest-benchmark's
    rounds."""
    per_round = []

    def one_round():
        marks = []

        def enqueue():
            before()
            marks.append(gpu.record())
            launch()
            marks.append(gpu.record())

        gpu_and_host_ms(gpu, enqueue, repeats=LAUNCHES)
        per_round.append(float(np.median([end - start for start, end in zip(marks[::2], marks[1::2])])))

    benchmark.pedantic(one_round, rounds=5, warmup_rounds=1)
    per_round = per_round[-5:]                   # the timed rounds: pytest-benchmark runs the warm-up round first
    benchmark.extra_info.update(gpu_ms_min=round(min(per_round), 5), gpu_ms_max=round(max(per_round), 5))
    return float(np.median(per_round))


def hopper_launch(kernels, qkv, out, maps, tables, pieces_parts, nh, nkv, hd, block_size):
    """A function that launches attention_hopper over (pieces, parts) from split_tail(), with their records."""
    pieces, parts = pieces_parts
    gpu, slots = kernels.gpu, max(1, int(pieces[:, 6].max()) + 1)
    partial = gpu.empty((hopper_partial_floats(slots, nkv, hd),), "f32")
    arrivals = gpu.to_device(np.zeros(slots * nkv, np.int32))
    on_device = gpu.to_device(pieces)
    return lambda: kernels.attention_hopper(qkv, out, maps, on_device, tables, nh, nkv, hd, block_size, parts,
                                            partial, arrivals)


def deep_chunk(kernels, hd: int, block_size: int = 16):
    """A 2,048-row chunk at position 30,720 of one sequence (as `long`'s 32K prompt's late chunks) at head_dim hd,
    the 1B's 2,048 query dims over 512 K/V dims: its qkv, out, tensor maps, block tables, prompt tiles
    (plan_attention), head counts and FLOPs."""
    from types import SimpleNamespace

    from .kernels import HOPPER_TILE_M
    from .tma import kv_tensor_maps

    gpu, rng, first, rows = kernels.gpu, np.random.default_rng(0), 30720, 2048
    if not kernels.hopper_prefill(hd, block_size):
        pytest.skip(f"no attention_hopper on {gpu.name} (sm_90 only)")
    nh, nkv = NH * HD // hd, NKV * HD // hd
    qkv = random_bf16(gpu, (rows, (nh + 2 * nkv) * hd), rng)
    k_cache, v_cache, tables = paged(gpu, rng, 1, first + rows, block_size, nkv, hd)
    prompt, _ = plan_attention(np.array([[0, rows, 0, first]], np.int32), HOPPER_TILE_M[hd] // (nh // nkv))
    return SimpleNamespace(qkv=qkv, out=gpu.empty((rows, nh * hd), "bf16"), tables=tables, prompt=prompt, nh=nh,
                           nkv=nkv, maps=kv_tensor_maps(gpu, SimpleNamespace(k=[k_cache], v=[v_cache])),
                           caches=(k_cache, v_cache),     # held: the maps point into them, freed they would dangle
                           first=first, rows=rows, flops=4 * hd * nh * rows * (first + (rows + 1) / 2))


@pytest.mark.parametrize("tail", ["whole", "split"])
@pytest.mark.parametrize("hd", [64, 128])
def test_prefill_chunk_attention(benchmark, kernels, hd, tail):
    """The deep chunk: 43 tiles x 8 K/V heads at head_dim 64, 344 blocks, 2.6 waves of 132 SMs; with the last wave's
    tiles whole, and split by keys where split_tail does."""
    c, block_size, tile_n = deep_chunk(kernels, hd), 16, HOPPER_TILE_N[hd]
    whole = (whole_pieces(c.prompt, tile_n), 1)
    pieces = split_tail(c.prompt, tile_n, c.nkv, kernels.sms) if tail == "split" else whole
    launch = hopper_launch(kernels, c.qkv, c.out, c.maps, c.tables, pieces, c.nh, c.nkv, hd, block_size)
    ms = timed(benchmark, kernels.gpu, launch)
    benchmark.extra_info.update(kernel="hopper", head_dim=hd, block_size=block_size, chunk_rows=c.rows,
                                first_position=c.first, tail=tail, parts=pieces[1], blocks=len(pieces[0]) * c.nkv,
                                ms_per_layer=round(ms, 3), tflop_per_s=round(c.flops / ms / 1e9, 1))


@pytest.mark.parametrize("before", ["nothing", "l2-flush", "gemm"])
def test_prefill_chunk_attention_after(benchmark, kernels, before):
    """The deep chunk at head_dim 64, its tail split, one launch at a time after `before`: what `long` has and the
    back-to-back figure above lacks (no K/V left in L2 by the launch before; a GEMM's data there instead)."""
    from common.cublas import Cublas

    gpu, block_size, rows = kernels.gpu, 16, 2048
    c = deep_chunk(kernels, HD, block_size)
    pieces = split_tail(c.prompt, HOPPER_TILE_N[HD], c.nkv, kernels.sms)
    launch = hopper_launch(kernels, c.qkv, c.out, c.maps, c.tables, pieces, c.nh, c.nkv, HD, block_size)
    if before == "l2-flush":                    # more than any Hopper's L2 (50-60 MB), written
        junk = gpu.empty((256 << 20,), "u8")

        def run_before():
            gpu.fill_bytes(junk, 0)
    elif before == "gemm":                      # down at 2,048 rows: x (2048, 8192) @ W (2048, 8192)^T
        cublas, rng = Cublas(gpu), np.random.default_rng(1)
        x, w = random_bf16(gpu, (rows, 8192), rng), random_bf16(gpu, (2048, 8192), rng)
        y = gpu.empty((rows, 2048), "bf16")

        def run_before():
            cublas.linear(x, w, y)
    else:
        def run_before():
            pass
    ms = timed_after(benchmark, gpu, launch, run_before)
    if before == "gemm":
        cublas.close()
    benchmark.extra_info.update(kernel="hopper", head_dim=HD, block_size=block_size, chunk_rows=c.rows,
                                first_position=c.first, tail="split", parts=pieces[1], before=before,
                                ms_per_layer=round(ms, 3), tflop_per_s=round(c.flops / ms / 1e9, 1))
