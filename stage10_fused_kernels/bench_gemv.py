"""gemv.cu's kernels alone (pytest-benchmark) at the 1B's layer shapes: what each fusion adds to the stream.

    pytest <this stage>/bench_gemv.py --benchmark-only -m gpu

Each layer GEMM at M = 1, 2, 4 and 8 rows, through the kinds the engine may launch at that shape and gemv_norm
(the norm alone, which the engine does not launch: the step between the plain kind and the paired ones):

  qkv      (3,072 x 2,048)    gemv, gemv_norm (+ the squares and g), gemv_norm_rope (+ RoPE and the cache write)
  o        (2,048 x 2,048)    gemv, gemv_residual (+ x += d)
  gate_up  (16,384 x 2,048)   gemv, gemv_norm, gemv_norm_silu (+ SwiGLU)
  down     (2,048 x 8,192)    gemv, gemv_residual

A figure is one pass's GPU time: a pass over 16 layers' weights of that shape (201 MB for qkv, more than the
L2: they stream from HBM, as in a step), launched back to back with programmatic dependent launch as the model
does, 20 passes queued while a spin kernel holds the GPU (common.bench.measure's gpu_and_host_ms), divided by 16.
test_gemv_one_launch streams the same 16 layers as one matrix in one launch, the plain kind and the fused kinds of o,
gate_up and down (qkv's RoPE kind cannot take a stacked matrix: its heads are checked): test_gemv's figure less this
one is what a kernel boundary costs that kind at that GEMM (the paired kind pairs rows across the stacked layers:
other pairs, the same bytes).
Each kind runs at the warps a column the engine would keep: the fastest of those it times (every count's time is
in extra_info: the paired kinds take at most 4, the others 8). The floor is the weights' bytes at the measured
copy bandwidth. At one shape, kind minus kind is about what a fusion costs: gemv_norm - gemv the norm,
gemv_norm_rope - gemv_norm the RoPE epilogue, gemv_norm_silu - gemv_norm SwiGLU's (at equal warps, where the
fastest differ: us_by_column_warps).
"""
import numpy as np
import pytest

from common.bf16 import f32_to_bf16
from common.bench.measure import gpu_and_host_ms
from common.device import get_gpu

from .kernels import GEMV_COLUMN_WARPS, GEMV_PAIRED_MAX_WARPS, Kernels

pytestmark = pytest.mark.gpu
LAYERS, PASSES = 16, 20
NH, NKV, HD, H, I = 32, 8, 64, 2048, 8192                     # the 1B
SHAPES = {"qkv": ((NH + 2 * NKV) * HD, H), "o": (H, NH * HD), "gate_up": (2 * I, H), "down": (H, I)}
KINDS = {"qkv": ("gemv", "gemv_norm", "gemv_norm_rope"), "o": ("gemv", "gemv_residual"),
         "gate_up": ("gemv", "gemv_norm", "gemv_norm_silu"), "down": ("gemv", "gemv_residual")}
CASES = [(name, kind) for name, kinds in KINDS.items() for kind in kinds]


@pytest.fixture(scope="module")
def kernels():
    return Kernels(get_gpu())


@pytest.fixture(scope="module")
def bandwidth_gbps(kernels):
    return kernels.gpu.copy_bandwidth_gbps()


def host_layers(name: str) -> list[np.ndarray]:
    """LAYERS distinct (N, K) bf16 weights of that shape (random, the same every call; each layer's bits differ)."""
    one = f32_to_bf16(np.random.default_rng(0).normal(0, 0.02, SHAPES[name]).astype(np.float32))
    return [one ^ np.uint16(layer) for layer in range(LAYERS)]


@pytest.fixture(scope="module")
def weights(kernels):
    """name -> its LAYERS weights, one device array each."""
    return {name: [kernels.gpu.to_device(w, "bf16") for w in host_layers(name)] for name in SHAPES}


@pytest.fixture(scope="module")
def stacked(kernels):
    """name -> its LAYERS weights as one (LAYERS N, K) device array: every layer streamed by one launch."""
    return {name: kernels.gpu.to_device(np.concatenate(host_layers(name)), "bf16") for name in SHAPES}


def launcher(kernels, rng, name: str, kind: str, M: int, layers: list):
    """A function that launches `kind` over every layer's weights of `name` at M rows and given warps a column
    (layers: one array a layer, or one array of them all, launched once)."""
    gpu, K = kernels.gpu, SHAPES[name][1]
    N = layers[0].shape[0]
    x = gpu.to_device(f32_to_bf16(rng.normal(0, 1, (M, K)).astype(np.float32)), "bf16")
    g = gpu.to_device(f32_to_bf16(rng.normal(1, 0.1, K).astype(np.float32)), "bf16")
    y = gpu.empty((M, N // 2 if kind == "gemv_norm_silu" else N), "bf16")
    extra = {}
    if kind == "gemv_norm_silu":
        extra = {"norm": (g, 1e-5), "silu": True}
    elif kind == "gemv_norm":
        extra = {"norm": (g, 1e-5)}
    elif kind == "gemv_residual":
        extra = {"residual": True}
    elif kind == "gemv_norm_rope":
        k_cache, v_cache = gpu.empty((64, 16, NKV, HD), "bf16"), gpu.empty((64, 16, NKV, HD), "bf16")
        angles = np.outer(np.arange(1024), 500000.0 ** (-np.arange(HD // 2) / (HD // 2)))
        cos, sin = (gpu.to_device(f(angles).astype(np.float32)) for f in (np.cos, np.sin))
        positions = gpu.to_device(rng.integers(0, 1024, M).astype(np.int32))
        slots = gpu.to_device(rng.permutation(64 * 16)[:M].astype(np.int32))
        extra = {"norm": (g, 1e-5), "rope": (k_cache, v_cache, slots, cos, sin, positions, NH, NKV, HD)}

    def launch(column_warps: int) -> None:
        for w in layers:
            kernels.gemv(x, w, y, column_warps, **extra)
    return launch


def column_warps_timed(name: str, kind: str) -> list[int]:
    """The warps a column the engine times for this kind at this shape (graphs.pick_gemms)."""
    K = SHAPES[name][1]
    most = GEMV_PAIRED_MAX_WARPS if kind in ("gemv_norm_silu", "gemv_norm_rope") else max(GEMV_COLUMN_WARPS)
    return [w for w in GEMV_COLUMN_WARPS if w <= most and (w == 1 or K >= 8 * 32 * w)]


def pass_ms(gpu, launch, column_warps: int) -> float:
    return gpu_and_host_ms(gpu, lambda: [launch(column_warps) for _ in range(PASSES)], repeats=1)["gpu_ms"] / PASSES


def time_layers(benchmark, kernels, bandwidth_gbps, name: str, kind: str, M: int, layers: list) -> None:
    """Time `kind` over `layers` (see launcher) at its fastest warps a column; extra_info in us a layer."""
    gpu = kernels.gpu
    launch = launcher(kernels, np.random.default_rng(M), name, kind, M, layers)
    launch(1)                                                      # compiled and loaded outside the timing
    each = {w: pass_ms(gpu, launch, w) for w in column_warps_timed(name, kind)}
    column_warps = min(each, key=each.get)
    per_round = []
    benchmark.pedantic(lambda: per_round.append(pass_ms(gpu, launch, column_warps)), rounds=5)   # warm: timed above
    us = 1e3 * float(np.median(per_round)) / LAYERS
    N, K = SHAPES[name]
    floor_us = 2 * N * K / (bandwidth_gbps * 1e9) * 1e6
    benchmark.extra_info.update(
        gemm=name, kind=kind, launches=len(layers), rows=M, column_warps=column_warps, us_per_layer=round(us, 2),
        us_min=round(1e3 * min(per_round) / LAYERS, 2), us_max=round(1e3 * max(per_round) / LAYERS, 2),
        floor_us=round(floor_us, 2), times_floor=round(us / floor_us, 3),
        us_by_column_warps={w: round(1e3 * ms / LAYERS, 2) for w, ms in each.items()})


@pytest.mark.parametrize("M", [1, 2, 4, 8])
@pytest.mark.parametrize("name,kind", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_gemv(benchmark, kernels, bandwidth_gbps, weights, name, kind, M):
    time_layers(benchmark, kernels, bandwidth_gbps, name, kind, M, weights[name])


ONE_LAUNCH = [(name, "gemv") for name in SHAPES] + [("o", "gemv_residual"), ("gate_up", "gemv_norm_silu"),
                                                     ("down", "gemv_residual")]


@pytest.mark.parametrize("M", [1, 8])
@pytest.mark.parametrize("name,kind", ONE_LAUNCH, ids=[f"{n}-{k}" for n, k in ONE_LAUNCH])
def test_gemv_one_launch(benchmark, kernels, bandwidth_gbps, stacked, name, kind, M):
    """A kind over all 16 layers' weights of a shape in one launch: test_gemv's bytes with one ramp and one drain
    instead of 16, so the difference is what its 15 kernel boundaries cost, what a persistent kernel streaming every
    layer would save at this GEMM (besides the kernels between the GEMMs)."""
    time_layers(benchmark, kernels, bandwidth_gbps, name, kind, M, [stacked[name]])
