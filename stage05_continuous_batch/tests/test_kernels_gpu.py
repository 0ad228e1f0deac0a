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


@cases("T, nh, nkv, hd, max_len", [(1, 4, 2, 16, 8), (13, 32, 8, 64, 40), (5, 6, 3, 32, 1100),
                                   (70, 8, 8, 64, 300)])
def test_rope_rotates_each_row_by_its_own_position(kernels, rng, T, nh, nkv, hd, max_len):
    from dataclasses import replace

    from common.rope import rope_cos_sin
    from common.synthetic import PRESETS

    gpu = kernels.gpu
    cfg = replace(PRESETS["llama-3.2-1b"], head_dim=hd)                 # llama3 frequency scaling included
    cos, sin = rope_cos_sin(cfg, np.arange(max_len))
    positions = rng.integers(0, max_len, T).astype(np.int32)            # rows of different sequences
    positions[0] = max_len - 1
    width = (nh + 2 * nkv) * hd
    qkv, qkvf = bf16(gpu, rng.normal(0, 1, (T, width)))
    kernels.rope(qkv, gpu.to_device(cos), gpu.to_device(sin), gpu.to_device(positions), nh + nkv, hd)
    got = read(gpu, qkv)
    c, s = cos[positions], sin[positions]
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


def attention_reference(q, k, v, positions):
    """q (R, nh, hd), each row at its position, over its sequence's k and v (>= max position + 1, nkv, hd)
    -> out (R, nh*hd), probabilities (nh, R, keys) with zeros past each row's position."""
    R, nh, hd = q.shape
    group = nh // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)           # (Tk, nh, hd)
    Tk = int(positions.max()) + 1
    k, v = k[:Tk], v[:Tk]
    causal = np.where(np.arange(Tk)[None, :] > positions[:, None], -np.inf, 0.0)   # (R, Tk)
    p = softmax(np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal)         # (nh, R, Tk)
    return np.einsum("hqk,khd->qhd", p, v).reshape(R, nh * hd), p


def run_attention(kernels, rng, lengths, rows_per_seq, nh, nkv, hd, max_len, first_seq=0, scale=1.5):
    """A batch cache of random K/V; sequence first_seq + i has lengths[i] valid positions. Prefill-shaped
    (rows_per_seq = T: row t of a sequence at position min(t, len - 1), its new K/V written with kv_write) or
    decode-shaped (rows_per_seq = 1: one row at position len - 1). Returns (out, probabilities, reference's)."""
    gpu = kernels.gpu
    n_seq = len(lengths)
    B = first_seq + n_seq + 1                                                 # seq_slots around the ones used
    R = n_seq * rows_per_seq
    qkv, qkvf = bf16(gpu, rng.normal(0, scale, (R, (nh + 2 * nkv) * hd)))
    k_cache, kf = bf16(gpu, rng.normal(0, scale, (B, max_len, nkv, hd)))
    v_cache, vf = bf16(gpu, rng.normal(0, scale, (B, max_len, nkv, hd)))
    positions = np.concatenate([np.minimum(np.arange(rows_per_seq), n - 1) if rows_per_seq > 1 else [n - 1]
                                for n in lengths]).astype(np.int32)
    slot_mapping = np.full(R, -1, np.int32)
    for i, n in enumerate(lengths):                                           # the rows' own K/V, as in a forward
        t = np.arange(rows_per_seq if rows_per_seq > 1 else 1)
        real = t[t < n] if rows_per_seq > 1 else np.array([0])
        slot_mapping[i * rows_per_seq + real] = (first_seq + i) * max_len + positions[i * rows_per_seq + real]
    kernels.kv_write(qkv, k_cache, v_cache, gpu.to_device(slot_mapping), nh, nkv, hd)
    new_k = qkvf[:, nh * hd:(nh + nkv) * hd].reshape(R, nkv, hd)
    new_v = qkvf[:, (nh + nkv) * hd:].reshape(R, nkv, hd)
    for r in np.flatnonzero(slot_mapping >= 0):
        kf.reshape(-1, nkv, hd)[slot_mapping[r]], vf.reshape(-1, nkv, hd)[slot_mapping[r]] = new_k[r], new_v[r]
    max_keys = int(positions.max()) + 1
    scores = poisoned(gpu, (nh * R * max_keys,), "f32")
    out = poisoned(gpu, (R, nh * hd))
    seq_slots = (first_seq + np.arange(R) // rows_per_seq).astype(np.int32)
    kernels.attention(qkv, k_cache, v_cache, scores, out, gpu.to_device(positions), gpu.to_device(seq_slots),
                      max_keys, nh, nkv, hd)
    got, got_p = read(gpu, out), read(gpu, scores).reshape(nh, R, max_keys)
    q = qkvf[:, :nh * hd].reshape(R, nh, hd)
    for i in range(n_seq):
        rows = slice(i * rows_per_seq, (i + 1) * rows_per_seq)
        want, p = attention_reference(q[rows], kf[first_seq + i], vf[first_seq + i], positions[rows])
        assert rel_l2(got[rows], want) < 1e-2, f"sequence {i}"
        mask = np.arange(p.shape[2])[None, None, :] <= positions[rows][None, :, None]
        mask = np.broadcast_to(mask, p.shape)
        assert rel_l2(got_p[:, rows, :p.shape[2]][mask], p[mask]) < 1e-4, f"sequence {i}"   # fp32 softmax
    return got


def test_kv_write_writes_each_row_to_its_slot_and_skips_minus_one(kernels, rng):
    gpu = kernels.gpu
    T, nh, nkv, hd, B, max_len = 7, 8, 2, 32, 3, 20
    qkv, qkvf = bf16(gpu, rng.normal(0, 1, (T, (nh + 2 * nkv) * hd)))
    k_cache, v_cache = poisoned(gpu, (B, max_len, nkv, hd)), poisoned(gpu, (B, max_len, nkv, hd))
    slot_mapping = np.array([5, 6, -1, max_len + 3, -1, 2 * max_len + 19, 0], np.int32)
    kernels.kv_write(qkv, k_cache, v_cache, gpu.to_device(slot_mapping), nh, nkv, hd)
    k, v = read(gpu, k_cache).reshape(-1, nkv, hd), read(gpu, v_cache).reshape(-1, nkv, hd)
    written = slot_mapping[slot_mapping >= 0]
    assert np.array_equal(k[written], qkvf[slot_mapping >= 0, nh * hd:(nh + nkv) * hd].reshape(-1, nkv, hd))
    assert np.array_equal(v[written], qkvf[slot_mapping >= 0, (nh + nkv) * hd:].reshape(-1, nkv, hd))
    untouched = np.setdiff1d(np.arange(B * max_len), written)
    assert np.isnan(k[untouched]).all() and np.isnan(v[untouched]).all()       # nothing else touched


# prefill: padded sequences of mixed lengths; GQA ratios 1, 2, 4, 8; T > 256 makes threads loop
@cases("lengths, nh, nkv, hd", [([1], 4, 4, 16), ([17, 5, 9], 8, 4, 32), ([300, 257], 32, 8, 64),
                                ([65, 1, 64], 8, 1, 64), ([3, 2], 2, 1, 128)])
def test_prefill_attention_causal_gqa_over_padded_sequences(kernels, rng, lengths, nh, nkv, hd):
    run_attention(kernels, rng, lengths, max(lengths), nh, nkv, hd, max_len=max(lengths) + 3, first_seq=1)


# decode: one row per sequence, each over its own cache length: 1, 7, 128, 1000 and the whole cache
@cases("lengths, max_len", [([1, 7], 16), ([128, 3, 129, 64, 1], 300), ([1000, 1], 1001),
                            ([2048], 2048), (list(range(1, 65)), 80)])
def test_decode_attention_over_per_sequence_lengths(kernels, rng, lengths, max_len):
    run_attention(kernels, rng, lengths, 1, 32, 8, 64, max_len=max_len)


def test_attention_is_stable_for_huge_scores(kernels, rng):
    run_attention(kernels, rng, [40, 13], 40, 4, 2, 64, max_len=48, scale=30)   # scores ~ 1e4: exp overflows


def test_packed_rows_of_many_sequences_in_one_launch(kernels, rng):
    """Rows of four sequences interleaved as a continuous batch packs them: a decode row of seq_slot 3, a whole
    6-token prompt in seq_slot 0, a decode row of seq_slot 1, and the second chunk (positions 4..8) of a prompt
    in seq_slot 2. Each row attends over its own sequence's cache only, keys 0..its position."""
    gpu = kernels.gpu
    nh, nkv, hd, B, max_len = 8, 2, 64, 5, 40
    chunks = [(3, [30]), (0, list(range(6))), (1, [11]), (2, list(range(4, 9)))]   # (seq_slot, positions)
    seq_slots = np.concatenate([[b] * len(ps) for b, ps in chunks]).astype(np.int32)
    positions = np.concatenate([ps for _, ps in chunks]).astype(np.int32)
    R = len(positions)
    qkv, qkvf = bf16(gpu, rng.normal(0, 1.5, (R, (nh + 2 * nkv) * hd)))
    k_cache, kf = bf16(gpu, rng.normal(0, 1.5, (B, max_len, nkv, hd)))
    v_cache, vf = bf16(gpu, rng.normal(0, 1.5, (B, max_len, nkv, hd)))
    slot_mapping = seq_slots * max_len + positions
    kernels.kv_write(qkv, k_cache, v_cache, gpu.to_device(slot_mapping), nh, nkv, hd)
    kf.reshape(-1, nkv, hd)[slot_mapping] = qkvf[:, nh * hd:(nh + nkv) * hd].reshape(R, nkv, hd)
    vf.reshape(-1, nkv, hd)[slot_mapping] = qkvf[:, (nh + nkv) * hd:].reshape(R, nkv, hd)
    max_keys = int(positions.max()) + 1
    out = poisoned(gpu, (R, nh * hd))
    kernels.attention(qkv, k_cache, v_cache, poisoned(gpu, (nh * R * max_keys,), "f32"), out,
                      gpu.to_device(positions), gpu.to_device(seq_slots), max_keys, nh, nkv, hd)
    got, q = read(gpu, out), qkvf[:, :nh * hd].reshape(R, nh, hd)
    first = 0
    for b, ps in chunks:
        rows = slice(first, first + len(ps))
        want, _ = attention_reference(q[rows], kf[b], vf[b], positions[rows])
        assert rel_l2(got[rows], want) < 1e-2, f"seq_slot {b}"
        first += len(ps)


def test_a_real_row_does_not_depend_on_padding_rows(kernels, rng):
    """Two prefills of the same padded batch whose padding rows hold different values: every real row's
    output is bit for bit the same."""
    gpu = kernels.gpu
    nh, nkv, hd, T, lengths, max_len = 8, 2, 64, 12, [5, 12], 16
    width = (nh + 2 * nkv) * hd
    positions = np.concatenate([np.minimum(np.arange(T), n - 1) for n in lengths]).astype(np.int32)
    real = np.concatenate([np.arange(T) < n for n in lengths])
    slot_mapping = np.where(real, np.concatenate([i * max_len + np.arange(T) for i in range(2)]), -1).astype(np.int32)
    base = rng.normal(0, 1, (2 * T, width))
    outs = []
    for pad_value in (0.0, 1e4):
        x = base.copy()
        x[~real] = pad_value
        qkv, _ = bf16(gpu, x)
        cache = [poisoned(gpu, (2, max_len, nkv, hd)) for _ in range(2)]
        kernels.kv_write(qkv, *cache, gpu.to_device(slot_mapping), nh, nkv, hd)
        out = poisoned(gpu, (2 * T, nh * hd))
        seq_slots = gpu.to_device((np.arange(2 * T) // T).astype(np.int32))
        kernels.attention(qkv, *cache, gpu.empty((nh * 2 * T * T,), "f32"), out, gpu.to_device(positions),
                          seq_slots, T, nh, nkv, hd)
        outs.append(gpu.to_host(out))
    assert np.array_equal(outs[0][real], outs[1][real])


def test_launchers_reject_bad_shapes(kernels):
    gpu = kernels.gpu
    with pytest.raises(ValueError, match="rms_norm"):
        kernels.rms_norm(gpu.empty((3, 8), "bf16"), gpu.empty((9,), "bf16"), gpu.empty((3, 8), "bf16"), 1e-5)
    cache = gpu.empty((2, 4, 1, 8), "bf16")
    positions = gpu.empty((3,), "i32")
    with pytest.raises(ValueError, match="attention"):                        # 5 keys > 4 positions a region
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((300,), "f32"),
                          gpu.empty((3, 16), "bf16"), positions, positions, 5, 2, 1, 8)
    with pytest.raises(ValueError, match="attention"):                        # a seq_slot for 2 of the 3 rows
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((300,), "f32"),
                          gpu.empty((3, 16), "bf16"), positions, gpu.empty((2,), "i32"), 4, 2, 1, 8)
