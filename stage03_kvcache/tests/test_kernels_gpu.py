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


def attention_reference(q, k, v, pos0):
    """q (Tq, nh, hd) at positions pos0.., k and v (pos0 + Tq, nkv, hd) -> out (Tq, nh*hd), probabilities."""
    Tq, nh, hd = q.shape
    group = nh // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)           # (Tk, nh, hd)
    Tk = k.shape[0]
    causal = np.where(np.arange(Tk)[None, :] > pos0 + np.arange(Tq)[:, None], -np.inf, 0.0)   # (Tq, Tk)
    p = softmax(np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal)         # (nh, Tq, Tk)
    return np.einsum("hqk,khd->qhd", p, v).reshape(Tq, nh * hd), p


def run_attention(kernels, rng, Tq, pos0, nh, nkv, hd, max_len=None, scale=1.5):
    """Fill a cache with random K/V for positions < pos0, append Tq new tokens with kv_write, attend; returns
    (out, probabilities, the reference's)."""
    gpu = kernels.gpu
    max_len = max_len or pos0 + Tq + 3
    Tk = pos0 + Tq
    qkv, qkvf = bf16(gpu, rng.normal(0, scale, (Tq, (nh + 2 * nkv) * hd)))
    old_k, old_kf = bf16(gpu, rng.normal(0, scale, (max_len, nkv, hd)))
    old_v, old_vf = bf16(gpu, rng.normal(0, scale, (max_len, nkv, hd)))
    kernels.kv_write(qkv, old_k, old_v, pos0, nh, nkv, hd)
    k = np.concatenate([old_kf[:pos0], qkvf[:, nh * hd:(nh + nkv) * hd].reshape(Tq, nkv, hd)])
    v = np.concatenate([old_vf[:pos0], qkvf[:, (nh + nkv) * hd:].reshape(Tq, nkv, hd)])
    scores = poisoned(gpu, (nh * Tq * Tk,), "f32")
    out = poisoned(gpu, (Tq, nh * hd))
    kernels.attention(qkv, old_k, old_v, scores, out, pos0, nh, nkv, hd)
    want, p = attention_reference(qkvf[:, :nh * hd].reshape(Tq, nh, hd), k, v, pos0)
    return read(gpu, out), read(gpu, scores).reshape(nh, Tq, Tk), want, p


def test_kv_write_appends_exactly(kernels, rng):
    gpu = kernels.gpu
    T, nh, nkv, hd, pos0, max_len = 7, 8, 2, 32, 5, 20
    qkv, qkvf = bf16(gpu, rng.normal(0, 1, (T, (nh + 2 * nkv) * hd)))
    k_cache, v_cache = poisoned(gpu, (max_len, nkv, hd)), poisoned(gpu, (max_len, nkv, hd))
    kernels.kv_write(qkv, k_cache, v_cache, pos0, nh, nkv, hd)
    k, v = read(gpu, k_cache), read(gpu, v_cache)
    assert np.array_equal(k[pos0:pos0 + T], qkvf[:, nh * hd:(nh + nkv) * hd].reshape(T, nkv, hd))
    assert np.array_equal(v[pos0:pos0 + T], qkvf[:, (nh + nkv) * hd:].reshape(T, nkv, hd))
    assert np.isnan(k[:pos0]).all() and np.isnan(k[pos0 + T:]).all()          # nothing else touched


# prefill: GQA ratios 1, 2, 4, 8; T not a multiple of the 256-thread block; T > 256 makes threads loop
@cases("T, nh, nkv, hd", [(1, 4, 4, 16), (17, 8, 4, 32), (300, 32, 8, 64), (65, 8, 1, 64),
                          (3, 2, 1, 128)])
def test_prefill_attention_causal_gqa(kernels, rng, T, nh, nkv, hd):
    got, got_p, want, p = run_attention(kernels, rng, T, 0, nh, nkv, hd)
    assert rel_l2(got, want) < 1e-2
    lower = np.tril(np.ones((T, T), bool))[None].repeat(nh, 0)               # the materialised probabilities
    assert rel_l2(got_p[lower], p[lower]) < 1e-4                              # fp32 softmax


# decode: one query over cache lengths 1, 7, 128, 1000 and the whole cache (max_model_len)
@cases("length, max_len", [(1, 16), (7, 16), (128, 300), (1000, 1001), (2048, 2048)])
def test_decode_attention_over_the_cache(kernels, rng, length, max_len):
    got, got_p, want, p = run_attention(kernels, rng, 1, length - 1, 32, 8, 64, max_len=max_len)
    assert rel_l2(got, want) < 1e-2
    assert rel_l2(got_p, p) < 1e-4


def test_attention_is_stable_for_huge_scores(kernels, rng):
    got, _, want, _ = run_attention(kernels, rng, 40, 0, 4, 2, 64, scale=30)   # scores ~ 1e4: exp overflows
    assert rel_l2(got, want) < 1e-2


def test_launchers_reject_bad_shapes(kernels):
    gpu = kernels.gpu
    with pytest.raises(ValueError, match="rms_norm"):
        kernels.rms_norm(gpu.empty((3, 8), "bf16"), gpu.empty((9,), "bf16"), gpu.empty((3, 8), "bf16"), 1e-5)
    cache = gpu.empty((4, 1, 8), "bf16")
    with pytest.raises(ValueError, match="attention"):                        # 3 queries after 2: 5 > 4 positions
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((30,), "f32"),
                          gpu.empty((3, 16), "bf16"), 2, 2, 1, 8)
