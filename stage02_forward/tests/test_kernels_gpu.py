"""GPU tier: each kernel against numpy on fresh random inputs, poisoned outputs (0xFF bytes = NaN, so a value the
kernel forgot to write fails) and sizes that are not multiples of the block. Tolerances are the design's:
relative L2 below 1e-2 for a bf16 result, 1e-4 for an fp32 one."""
import numpy as np
import pytest

from common.bf16 import bf16_to_f32, f32_to_bf16, round_to_bf16
from common.device import get_gpu
from common.reference import apply_rope, rms_norm, silu, softmax
from common.testing import cases

pytestmark = pytest.mark.gpu


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert not np.isnan(got).any(), "NaN in the output (an element was never written)"
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.fixture(scope="module")
def kernels():
    from ..kernels import Kernels

    return Kernels(get_gpu())


@pytest.fixture
def rng():
    return np.random.default_rng()          # fresh inputs every run


def bf16(gpu, a):
    """Upload float data as bf16, and return the device array with the bf16-rounded values the GPU sees."""
    bits = f32_to_bf16(np.asarray(a, np.float32))
    return gpu.to_device(bits, "bf16"), bf16_to_f32(bits)


def poisoned(gpu, shape, dtype="bf16"):
    out = gpu.empty(shape, dtype)
    gpu.fill_bytes(out, 0xFF)
    return out


def read(gpu, arr):
    host = gpu.to_host(arr)
    return bf16_to_f32(host) if arr.dtype == "bf16" else host


@cases("T, H", [(1, 64), (7, 2048), (33, 1000), (5, 257 * 2)])
def test_rms_norm(kernels, rng, T, H):
    gpu = kernels.gpu
    x, xf = bf16(gpu, rng.normal(0, 3, (T, H)))
    w, wf = bf16(gpu, rng.normal(1, 0.2, H))
    y = poisoned(gpu, (T, H))
    kernels.rms_norm(x, w, y, 1e-5)
    assert rel_l2(read(gpu, y), rms_norm(xf, wf, 1e-5)) < 1e-2


@cases("T, H", [(1, 64), (9, 2048), (31, 998)])
def test_add_rms_norm_updates_the_residual_and_norms_the_sum(kernels, rng, T, H):
    gpu = kernels.gpu
    x, xf = bf16(gpu, rng.normal(0, 2, (T, H)))
    d, df = bf16(gpu, rng.normal(0, 2, (T, H)))
    w, wf = bf16(gpu, rng.normal(1, 0.2, H))
    y = poisoned(gpu, (T, H))
    kernels.add_rms_norm(x, d, w, y, 1e-5)
    s = xf + df
    assert np.array_equal(read(gpu, x), round_to_bf16(s))          # the residual: the bf16-rounded sum, exactly
    assert rel_l2(read(gpu, y), rms_norm(round_to_bf16(s), wf, 1e-5)) < 1e-2


@cases("T, nh, nkv, hd, pos0", [(1, 4, 2, 16, 0), (13, 32, 8, 64, 0), (5, 6, 3, 32, 1000),
                                (70, 8, 8, 64, 3)])
def test_rope_rotates_q_and_k_and_leaves_v(kernels, rng, T, nh, nkv, hd, pos0):
    from dataclasses import replace

    from common.rope import rope_cos_sin
    from common.synthetic import PRESETS

    gpu = kernels.gpu
    cfg = replace(PRESETS["llama-3.2-1b"], head_dim=hd)                 # llama3 frequency scaling included
    max_len = pos0 + T + 5
    cos, sin = rope_cos_sin(cfg, np.arange(max_len))
    width = (nh + 2 * nkv) * hd
    qkv, qkvf = bf16(gpu, rng.normal(0, 1, (T, width)))
    kernels.rope(qkv, gpu.to_device(cos), gpu.to_device(sin), pos0, nh + nkv, hd)
    got = read(gpu, qkv)
    c, s = cos[pos0:pos0 + T], sin[pos0:pos0 + T]
    rot = (nh + nkv) * hd
    want = apply_rope(qkvf[:, :rot].reshape(T, nh + nkv, hd), c, s).reshape(T, rot)
    assert rel_l2(got[:, :rot], want) < 1e-2
    assert np.array_equal(got[:, rot:], qkvf[:, rot:])                   # v untouched


@cases("T, inter", [(1, 8192), (11, 192), (4, 1002)])
def test_silu_mul(kernels, rng, T, inter):
    gpu = kernels.gpu
    gu, guf = bf16(gpu, rng.normal(0, 3, (T, 2 * inter)))
    act = poisoned(gpu, (T, inter))
    kernels.silu_mul(gu, act)
    assert rel_l2(read(gpu, act), silu(guf[:, :inter]) * guf[:, inter:]) < 1e-2


def attention_reference(qkvf, T, nh, nkv, hd):
    q = qkvf[:, :nh * hd].reshape(T, nh, hd)
    k = np.repeat(qkvf[:, nh * hd:(nh + nkv) * hd].reshape(T, nkv, hd), nh // nkv, axis=1)
    v = np.repeat(qkvf[:, (nh + nkv) * hd:].reshape(T, nkv, hd), nh // nkv, axis=1)
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    p = softmax(np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal)         # (nh, T, T)
    return np.einsum("hqk,khd->qhd", p, v).reshape(T, nh * hd), p


# GQA ratios 1, 2, 4, 8; T not a multiple of the 256-thread block; T > 256 makes threads loop
@cases("T, nh, nkv, hd", [(1, 4, 4, 16), (17, 8, 4, 32), (300, 32, 8, 64), (65, 8, 1, 64),
                          (3, 2, 1, 128)])
def test_attention_causal_gqa(kernels, rng, T, nh, nkv, hd):
    gpu = kernels.gpu
    qkv, qkvf = bf16(gpu, rng.normal(0, 1.5, (T, (nh + 2 * nkv) * hd)))
    scores = poisoned(gpu, (nh * T * T,), "f32")
    out = poisoned(gpu, (T, nh * hd))
    kernels.attention(qkv, scores, out, nh, nkv, hd)
    want, p = attention_reference(qkvf, T, nh, nkv, hd)
    assert rel_l2(read(gpu, out), want) < 1e-2
    lower = np.tril(np.ones((T, T), bool))[None].repeat(nh, 0)               # the materialised probabilities
    got_p = read(gpu, scores).reshape(nh, T, T)
    assert rel_l2(got_p[lower], p[lower]) < 1e-4                              # fp32 softmax


def test_attention_is_stable_for_huge_scores(kernels, rng):
    gpu = kernels.gpu
    T, nh, nkv, hd = 40, 4, 2, 64
    qkv, qkvf = bf16(gpu, rng.normal(0, 30, (T, (nh + 2 * nkv) * hd)))      # scores ~ 1e4: exp overflows naively
    out = poisoned(gpu, (T, nh * hd))
    kernels.attention(qkv, gpu.empty((nh * T * T,), "f32"), out, nh, nkv, hd)
    assert rel_l2(read(gpu, out), attention_reference(qkvf, T, nh, nkv, hd)[0]) < 1e-2


def test_launchers_reject_bad_shapes(kernels):
    gpu = kernels.gpu
    with pytest.raises(ValueError, match="rms_norm"):
        kernels.rms_norm(gpu.empty((3, 8), "bf16"), gpu.empty((9,), "bf16"), gpu.empty((3, 8), "bf16"), 1e-5)
    with pytest.raises(ValueError, match="attention"):
        kernels.attention(gpu.empty((3, 48), "bf16"), gpu.empty((8,), "f32"), gpu.empty((3, 16), "bf16"), 2, 1, 8)
