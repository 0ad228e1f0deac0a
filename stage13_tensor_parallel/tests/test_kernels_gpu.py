"""GPU tier: each kernel against numpy on fresh random inputs, poisoned outputs (0xFF bytes = NaN, so a value the
kernel forgot to write fails) and sizes that are not multiples of the block. Tolerances are the design's:
relative L2 below 1e-2 for a bf16 result, 1e-4 for an fp32 one."""
import functools

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


# H a multiple of 8: 16-byte loads (4104: 513 loads over 256 threads); 514 and 998: element by element
@cases("T, H", [(1, 64), (7, 2048), (33, 1000), (5, 257 * 2), (3, 4104)])
def test_rms_norm(kernels, rng, T, H):
    gpu = kernels.gpu
    x, xf = bf16(gpu, rng.normal(0, 3, (T, H)))
    w, wf = bf16(gpu, rng.normal(1, 0.2, H))
    y = poisoned(gpu, (T, H))
    kernels.rms_norm(x, w, y, 1e-5)
    assert rel_l2(read(gpu, y), rms_norm(xf, wf, 1e-5)) < 1e-2


@cases("T, H", [(1, 64), (9, 2048), (31, 998), (2, 4104)])
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
def test_rope_rotates_each_row_by_its_own_position_and_its_rotated_k_is_cached(kernels, rng, T, nh, nkv, hd,
                                                                                max_len):
    """rope_kv_write with RoPE: q and k heads rotated in place, v untouched, and each row's rotated k and its v
    written to its cache slot (none for a slot of -1)."""
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
    slots = rng.permutation(2 * T).astype(np.int32)[:T]                 # a pool of 2 T slots, half of them written
    slots[T // 2] = -1
    k_cache, v_cache = poisoned(gpu, (2 * T, 1, nkv, hd)), poisoned(gpu, (2 * T, 1, nkv, hd))
    kernels.rope_kv_write(qkv, k_cache, v_cache, gpu.to_device(slots), nh, nkv, hd,
                          (gpu.to_device(cos), gpu.to_device(sin), gpu.to_device(positions)))
    got = read(gpu, qkv)
    c, s = cos[positions], sin[positions]
    rot = (nh + nkv) * hd
    want = apply_rope(qkvf[:, :rot].reshape(T, nh + nkv, hd), c, s).reshape(T, rot)
    assert rel_l2(got[:, :rot], want) < 1e-2
    assert np.array_equal(got[:, rot:], qkvf[:, rot:])                   # v untouched
    check_cache_writes(gpu, k_cache, v_cache, slots, got[:, nh * hd:rot], qkvf[:, rot:])   # the rotated k


def check_cache_writes(gpu, k_cache, v_cache, slots, k_rows, v_rows):
    """Row t's k and v (T, nkv hd) in cache slot slots[t], exactly; a slot of -1 writes nothing, and every slot
    not named keeps its poison."""
    nkv, hd = k_cache.shape[2:]
    k, v = read(gpu, k_cache).reshape(-1, nkv, hd), read(gpu, v_cache).reshape(-1, nkv, hd)
    kept = slots >= 0
    assert np.array_equal(k[slots[kept]], k_rows[kept].reshape(-1, nkv, hd))
    assert np.array_equal(v[slots[kept]], v_rows[kept].reshape(-1, nkv, hd))
    untouched = np.setdiff1d(np.arange(len(k)), slots[kept])
    assert np.isnan(k[untouched]).all() and np.isnan(v[untouched]).all()


@cases("T, inter", [(1, 8192), (11, 192), (4, 1002)])
def test_silu_mul(kernels, rng, T, inter):
    gpu = kernels.gpu
    gu, guf = bf16(gpu, rng.normal(0, 3, (T, 2 * inter)))
    act = poisoned(gpu, (T, inter))
    kernels.silu_mul(gu, act)
    assert rel_l2(read(gpu, act), silu(guf[:, :inter]) * guf[:, inter:]) < 1e-2


def attention_reference(q, k, v, positions):
    """q (R, nh, hd), each row at its position, over its sequence's k and v (>= max position + 1, nkv, hd)
    -> out (R, nh*hd) float32, by matmuls over blocks of rows (an 8192-key prompt fits in memory)."""
    R, nh, hd = q.shape
    group, keys = nh // k.shape[1], int(positions.max()) + 1
    out = np.empty((R, nh, hd), np.float32)
    for h in range(nh):
        kh, vh = k[:keys, h // group].astype(np.float32), v[:keys, h // group].astype(np.float32)
        for r0 in range(0, R, 1024):
            s = q[r0:r0 + 1024, h].astype(np.float32) @ kh.T / np.float32(np.sqrt(hd))      # (rows, keys)
            s[np.arange(keys)[None, :] > positions[r0:r0 + 1024, None]] = -np.inf              # causal
            out[r0:r0 + 1024, h] = softmax(s) @ vh
    return out.reshape(R, nh * hd)


def attend(kernels, qkv, pool, out, spans, nh, nkv, hd, tile_rows=None, split=None, hopper=None, parts=None):
    """Launch attention as the model does: plan_attention() cuts the spans (first row, rows, seq_slot, first
    position) into prompt tiles and decode tiles; prompt tiles go through attention_hopper where the GPU and the
    shapes allow it (Kernels.hopper_prefill, or as `hopper` says), as split_tail() splits the last wave's, or with
    every tile that reaches `parts` key tiles cut into that many pieces; else attention_tiles; decode_split() (or
    `split`, (n_splits, keys_per_split)) splits the decode tiles' keys. Returns (prompt tiles, decode tiles,
    split) for the caller to check what ran."""
    from types import SimpleNamespace

    from ..kernels import HOPPER_TILE_M, HOPPER_TILE_N, decode_split, hopper_partial_floats
    from ..kernels import tile_rows as rows_a_tile
    from ..packing import cut_tile, plan_attention, split_tail, whole_pieces
    from ..tma import kv_tensor_maps

    gpu = kernels.gpu
    hopper = kernels.hopper_prefill(hd, pool.bs) if hopper is None else hopper
    if tile_rows is None:
        tile_rows = HOPPER_TILE_M[hd] // (nh // nkv) if hopper else rows_a_tile(nh, nkv, hd)
    prompt, decode = plan_attention(np.asarray(spans, np.int32).reshape(-1, 4), tile_rows)
    if len(prompt) and hopper:
        maps = kv_tensor_maps(gpu, SimpleNamespace(k=[pool.k], v=[pool.v]))
        tile_n = HOPPER_TILE_N[hd]
        if parts is None:
            pieces, used = split_tail(prompt, tile_n, nkv, kernels.sms)
        else:                                         # every tile that can be, cut into `parts`
            cut = prompt[:, 3] // tile_n + 1 >= parts
            split = [piece for slot, t in enumerate(prompt[cut]) for piece in cut_tile(t, parts, tile_n, slot)]
            pieces = np.concatenate([np.array(split, np.int32).reshape(-1, 8), whole_pieces(prompt[~cut], tile_n)])
            used = parts
        slots = max(1, int(pieces[:, 6].max()) + 1)
        partial = poisoned(gpu, (hopper_partial_floats(slots, nkv, hd),), "f32")
        arrivals = gpu.to_device(np.zeros(slots * nkv, np.int32))
        kernels.attention_hopper(qkv, out, maps, gpu.to_device(pieces), pool.tables, nh, nkv, hd, pool.bs, used,
                                 partial, arrivals)
        assert not read(gpu, arrivals).any(), "the pieces' merge left its counts for the next launch nonzero"
    elif len(prompt):
        kernels.attention(qkv, pool.k, pool.v, out, gpu.empty((1,), "f32"), gpu.empty((1,), "i32"),
                          gpu.to_device(prompt), pool.tables, nh, nkv, hd)
    if len(decode):
        split = split or decode_split(len(decode), int(decode[:, 3].max()) + 1, nkv, kernels.sms, 4 * len(decode))
        partial = poisoned(gpu, (len(decode) * split[0] * nh * (hd + 2),), "f32")
        arrivals = gpu.to_device(np.zeros(len(decode) * nkv, np.int32))
        n_splits, per_split = split                   # keys_per_split is read from the device
        kernels.attention(qkv, pool.k, pool.v, out, partial, arrivals, gpu.to_device(decode), pool.tables, nh,
                          nkv, hd, n_splits, gpu.to_device(np.array([per_split], np.int32)))
        assert not read(gpu, arrivals).any(), "the split merge left its counts for the next launch nonzero"
    return prompt, decode, split


class PagedPool:
    """A paged K/V pool for B sequences whose logical caches are kf, vf (B, max_len, nkv, hd), bf16-rounded:
    sequence b has blocks for its first held[b] positions, of which the first cached[b] hold K/V (the rest, and
    everything past them, NaN). Its blocks sit at shuffled, non-adjacent places of a pool with spare blocks; the
    spares and the tables' unused entries are NaN, so a key read through a wrong entry poisons the output."""

    def __init__(self, gpu, rng, kf, vf, cached, held, block_size=16, spare=5):
        B, max_len, nkv, hd = kf.shape
        W = -(-max_len // block_size)
        self.bs, self.num_blocks = block_size, B * W + spare
        order = rng.permutation(self.num_blocks)
        table = order[:B * W].reshape(B, W)
        for b, n in enumerate(held):
            table[b, -(-n // block_size):] = order[-1]            # unused entries: a spare block, NaN
        self.table = table.astype(np.int32)
        # the logical caches, for the reference
        self.kf, self.vf = (round_to_bf16(np.asarray(a, np.float32)) for a in (kf, vf))
        for b, n in enumerate(cached):
            self.kf[b, n:] = self.vf[b, n:] = np.nan
        pools = []
        for logical in (self.kf, self.vf):
            phys = np.full((self.num_blocks * block_size, nkv, hd), np.nan, np.float32)
            for b, n in enumerate(held):
                phys[self.slots(np.full(n, b), np.arange(n))] = logical[b, :n]
            pools.append(phys.reshape(self.num_blocks, block_size, nkv, hd))
        self.k, self.v = bf16(gpu, pools[0])[0], bf16(gpu, pools[1])[0]
        self.tables = gpu.to_device(self.table)

    def slots(self, seq_slots, positions):
        """The cache slot of each (seq_slot, position): block_table[p // BS] * BS + p % BS."""
        return (self.table[seq_slots, positions // self.bs] * self.bs + positions % self.bs).astype(np.int32)

    def write(self, kernels, qkv, qkvf, seq_slots, positions, nh, nkv, hd):
        """Write this step's rows' K/V through the slot mapping (rope_kv_write without RoPE); the logical caches
        get the same K/V."""
        kernels.rope_kv_write(qkv, self.k, self.v, kernels.gpu.to_device(self.slots(seq_slots, positions)), nh, nkv,
                              hd)
        R = len(positions)
        self.kf[seq_slots, positions] = qkvf[:, nh * hd:(nh + nkv) * hd].reshape(R, nkv, hd)
        self.vf[seq_slots, positions] = qkvf[:, (nh + nkv) * hd:].reshape(R, nkv, hd)


def run_attention(kernels, rng, lengths, new, nh, nkv, hd, max_len, first_seq=0, scale=1.5, tile_rows=None,
                  split=None, block_size=16, hopper=None, parts=None):
    """A paged cache of random K/V; sequence first_seq + i holds lengths[i] positions, of which the last new[i]
    are this step's rows (packed one after another, their K/V written by rope_kv_write through the block tables; the
    earlier ones were cached by earlier steps): new = lengths is a whole prompt, new = 1 a decode row, anything
    between a later chunk of a chunked prefill. Checks every row against the reference; returns the output and
    what attend() ran."""
    gpu = kernels.gpu
    B = first_seq + len(lengths) + 1                                           # seq_slots around the ones used
    positions = np.concatenate([np.arange(n - m, n) for n, m in zip(lengths, new)]).astype(np.int32)
    seq_slots = np.concatenate([[first_seq + i] * m for i, m in enumerate(new)]).astype(np.int32)
    starts = np.cumsum([0] + list(new))
    spans = [(starts[i], m, first_seq + i, n - m) for i, (n, m) in enumerate(zip(lengths, new))]
    R = len(positions)
    qkv, qkvf = bf16(gpu, rng.normal(0, scale, (R, (nh + 2 * nkv) * hd)))
    cached = [0] * first_seq + [n - m for n, m in zip(lengths, new)] + [0]    # before this step's rows
    held = [0] * first_seq + list(lengths) + [0]                              # blocks for the step's rows too
    kf, vf = (rng.normal(0, scale, (B, max_len, nkv, hd)) for _ in "kv")
    pool = PagedPool(gpu, rng, kf, vf, cached, held, block_size)
    pool.write(kernels, qkv, qkvf, seq_slots, positions, nh, nkv, hd)
    out = poisoned(gpu, (R, nh * hd))
    ran = attend(kernels, qkv, pool, out, spans, nh, nkv, hd, tile_rows, split, hopper, parts)
    got = read(gpu, out)
    assert not np.isnan(got).any(), "an output element was never written, or a key was read through a wrong entry"
    q = qkvf[:, :nh * hd].reshape(R, nh, hd)
    for i in range(len(lengths)):
        rows = slice(starts[i], starts[i + 1])
        want = attention_reference(q[rows], pool.kf[first_seq + i], pool.vf[first_seq + i], positions[rows])
        assert rel_l2(got[rows], want) < 1e-2, f"sequence {i}"
    return got, ran


def test_the_cache_write_puts_each_row_in_its_slot_and_skips_minus_one(kernels, rng):
    gpu = kernels.gpu
    T, nh, nkv, hd, B, max_len = 7, 8, 2, 32, 3, 20
    qkv, qkvf = bf16(gpu, rng.normal(0, 1, (T, (nh + 2 * nkv) * hd)))
    k_cache, v_cache = poisoned(gpu, (B, max_len, nkv, hd)), poisoned(gpu, (B, max_len, nkv, hd))
    slot_mapping = np.array([5, 6, -1, max_len + 3, -1, 2 * max_len + 19, 0], np.int32)
    kernels.rope_kv_write(qkv, k_cache, v_cache, gpu.to_device(slot_mapping), nh, nkv, hd)
    k, v = read(gpu, k_cache).reshape(-1, nkv, hd), read(gpu, v_cache).reshape(-1, nkv, hd)
    written = slot_mapping[slot_mapping >= 0]
    assert np.array_equal(k[written], qkvf[slot_mapping >= 0, nh * hd:(nh + nkv) * hd].reshape(-1, nkv, hd))
    assert np.array_equal(v[written], qkvf[slot_mapping >= 0, (nh + nkv) * hd:].reshape(-1, nkv, hd))
    untouched = np.setdiff1d(np.arange(B * max_len), written)
    assert np.isnan(k[untouched]).all() and np.isnan(v[untouched]).all()       # nothing else touched


# prefill: whole prompts of mixed lengths around the 64-row and 64-key tiles (1, 7, 31..33, 63..65, 127, 1000);
# GQA ratios 1, 2, 3 (64 / 3 rows a tile, one M-row spare), 4, 8 and 32 (2 rows a tile); head_dim 64 and 128 on
# tensor cores, and 16, 32, 80 and 256, which take every row through the row kernel
@cases("lengths, nh, nkv, hd", [([1], 4, 4, 16), ([17, 5, 9], 8, 4, 32), ([300, 257], 32, 8, 64),
                                ([65, 1, 64], 8, 1, 64), ([3, 2], 2, 1, 128),
                                ([7, 63, 127], 12, 4, 64), ([31, 32, 33], 6, 2, 128),
                                ([1000], 32, 8, 64), ([40, 9], 32, 1, 64), ([20, 3], 4, 2, 80),
                                ([50], 4, 2, 256), ([129, 22], 9, 3, 64), ([200], 8, 8, 128),
                                ([70, 64], 16, 2, 128)])
def test_prefill_attention_causal_gqa(kernels, rng, lengths, nh, nkv, hd):
    _, (prompt, decode, _) = run_attention(kernels, rng, lengths, lengths, nh, nkv, hd, max_len=max(lengths) + 3,
                                           first_seq=1)
    if hd in (64, 128):                              # the prompts of several rows went to the tensor-core kernel
        assert len(prompt) and len(decode) == sum(n == 1 for n in lengths)
    else:                                            # every row alone to the row kernel
        assert len(prompt) == 0 and len(decode) == sum(lengths)


# long prompts at the 1B ratio (4 query heads a K/V head): 4097 (one row past a tile) and 8192
@cases("length, hd", [(4097, 64), (8192, 64), (4097, 128)])
def test_long_prefill_attention(kernels, rng, length, hd):
    run_attention(kernels, rng, [length], [length], 4, 1, hd, max_len=length)


# decode: one row per sequence, each over its own cache length: 1, 7, 128, 1000, 4097, 8192 and the whole cache
@cases("lengths, max_len", [([1, 7], 16), ([128, 3, 129, 64, 1], 300), ([1000, 1], 1001),
                            ([2048], 2048), (list(range(1, 65)), 80), ([4097, 8192, 5], 8192)])
def test_decode_attention_over_per_sequence_lengths(kernels, rng, lengths, max_len):
    run_attention(kernels, rng, lengths, [1] * len(lengths), 32, 8, 64, max_len=max_len)


@cases("hd", [64, 128])
def test_decode_gives_the_same_result_for_any_split(kernels, rng, hd):
    """The same decode rows (lengths 1..3000) with their keys split 1, 2, 7 and 32 ways (96 keys each: most
    splits of the short rows are empty), and as decode_split() chooses: every run within bf16 tolerance of the
    reference, and of one another."""
    lengths, nh, nkv, max_len = [3000, 1, 700, 33, 2999], 8, 2, 3000
    seed = int(rng.integers(1 << 31))                     # the same inputs for every split
    outs = []
    for split in [(1, 3000), (2, 1500), (7, 448), (32, 96), None]:
        got, (_, _, used) = run_attention(kernels, np.random.default_rng(seed), lengths, [1] * 5, nh, nkv, hd,
                                          max_len, split=split)
        outs.append(got)
    assert used[0] > 1                                    # decode_split split the 3000 keys
    for got in outs[1:]:
        assert rel_l2(got, outs[0]) < 1e-2


# decode rows at GQA ratios 1, 3, 4, 16 and 32 (a row's query heads fill as many of its tile's M-rows), over keys
# not a multiple of a 32-key tile and over one key; unsplit, split 3 and 8 ways (some splits empty), and as chosen
@cases("hd", [64, 128])
@cases("nh, nkv", [(8, 8), (12, 4), (16, 4), (16, 1), (32, 1)])
def test_decode_rows_split_at_every_gqa_ratio(kernels, rng, nh, nkv, hd):
    for split in [(1, 700), (3, 256), (8, 96), None]:
        run_attention(kernels, rng, [700, 1, 65, 200, 129], [1] * 5, nh, nkv, hd, max_len=700, split=split)


def test_attention_is_stable_for_huge_scores(kernels, rng):
    for hd in (64, 80):                                   # tensor-core tiles, and the row kernel
        run_attention(kernels, rng, [40, 13], [40, 13], 4, 2, hd, max_len=48, scale=30)   # scores ~ 1e4
        run_attention(kernels, rng, [400, 13], [1, 1], 4, 2, hd, max_len=400, scale=30, split=(4, 100))


@cases("hd", [32, 80, 256])
def test_decode_rows_split_on_the_row_kernel(kernels, rng, hd):
    """head_dims without a tensor-core kernel: decode rows over up to 3000 keys, split."""
    run_attention(kernels, rng, [3000, 5, 1200], [1, 1, 1], 8, 2, hd, max_len=3000, split=(6, 512))


@pytest.mark.parametrize("hopper", [True, False], ids=["hopper", "mma"])
@pytest.mark.parametrize("block_size", [8, 16, 64, 256])
# head_dim 64 and 128; GQA 1, 3 (128 / 3 rows a tile: two M-rows spare), 4 (the 1B's) and 32; lengths around the
# key tiles (64 and 128 keys) and the M-row tiles; whole prompts, and later chunks over a cached prefix (new <
# length), among them chunks whose first position ends a key tile (63, 127, 255: the last tile run without a mask)
@cases("lengths, new, nh, nkv, hd", [([1, 63, 64, 65], [1, 63, 64, 65], 4, 4, 64),
                                     ([200, 129], [200, 129], 6, 2, 128),
                                     ([1000, 300], [1000, 31], 32, 8, 64),
                                     ([700, 65], [70, 64], 12, 4, 128),
                                     ([257, 40], [257, 40], 32, 1, 64),
                                     ([384, 300], [257, 45], 8, 2, 64),
                                     ([192, 128], [129, 65], 8, 2, 128)])
def test_prompt_tiles_on_both_kernels(kernels, rng, hopper, block_size, lengths, new, nh, nkv, hd):
    """Prompt tiles through attention_hopper (wgmma, TMA: sm_90 only) and through attention_tiles (mma.sync),
    against the reference: several sequences in one launch, keys through shuffled blocks, NaN in every slot not
    written (a key read past a sequence's end, or V's stale rows not zeroed, poisons the output)."""
    if hopper and not kernels.hopper_prefill(hd, block_size):
        pytest.skip(f"no attention_hopper on {kernels.gpu.name} (sm_90 only)")
    run_attention(kernels, rng, lengths, new, nh, nkv, hd, max_len=max(lengths), block_size=block_size,
                  hopper=hopper)


@pytest.mark.parametrize("block_size", [16, 64])
@cases("parts", [2, 3, 4])
# chunks over a cached prefix (each tile reaches 4 key tiles or more), head_dim 64 and 128, GQA 1, 3 and 4; and
# a whole prompt beside a chunk: its tiles reach one key tile and stay whole in the same launch
@cases("lengths, new, nh, nkv, hd", [([1200, 700], [300, 129], 32, 8, 64),
                                     ([1200, 100], [300, 100], 32, 8, 64),
                                     ([900, 600], [200, 65], 12, 4, 128),
                                     ([1000], [257], 6, 2, 64),
                                     ([700], [131], 3, 3, 128)])
def test_prompt_tiles_split_by_keys(kernels, rng, parts, block_size, lengths, new, nh, nkv, hd):
    """Every prompt tile cut by keys into `parts` pieces, the last holding the diagonal, each leaving its record in
    a NaN-poisoned buffer, merged by the last piece to finish: against the reference, and the merge's counts left
    at zero (attend checks)."""
    if not kernels.hopper_prefill(hd, block_size):
        pytest.skip(f"no attention_hopper on {kernels.gpu.name} (sm_90 only)")
    run_attention(kernels, rng, lengths, new, nh, nkv, hd, max_len=max(lengths), block_size=block_size,
                  hopper=True, parts=parts)


def test_a_chunked_prefill_equals_the_whole_prompt(kernels, rng):
    """One 8192-token prompt (1B shape: 32 heads over 8 K/V heads of 64) attended in one chunk, and again as the
    engine's chunked prefill does: chunks of 2048 rows, each over the keys the earlier chunks cached (on a GPU of
    132 SMs the later chunks' last-wave tiles split by keys, split_tail)."""
    gpu = kernels.gpu
    L, nh, nkv, hd, chunk = 8192, 32, 8, 64, 2048
    qkv, qkvf = bf16(gpu, rng.normal(0, 1.5, (L, (nh + 2 * nkv) * hd)))
    nothing = np.zeros((1, L, nkv, hd))
    pool = PagedPool(gpu, rng, nothing, nothing, [0], [L])
    pool.write(kernels, qkv, qkvf, np.zeros(L, np.int32), np.arange(L, dtype=np.int32), nh, nkv, hd)
    whole = poisoned(gpu, (L, nh * hd))
    attend(kernels, qkv, pool, whole, [(0, L, 0, 0)], nh, nkv, hd)
    chunked = poisoned(gpu, (L, nh * hd))                  # rows of one buffer: each chunk launched on its own
    for first in range(0, L, chunk):
        attend(kernels, qkv, pool, chunked, [(first, chunk, 0, first)], nh, nkv, hd)
    a, b = read(gpu, whole), read(gpu, chunked)
    assert rel_l2(b, a) < 1e-2


@cases("block_size", [1, 8, 16, 32, 256])
@cases("hd", [64, 128, 80])
def test_packed_rows_of_many_sequences_in_one_step(kernels, rng, block_size, hd):
    """Rows of six sequences interleaved as a continuous batch packs them, around block boundaries: decode rows
    at positions 14, 15, 16 (the last of a block of 16, the first of the next) and 999, a whole 17-token prompt,
    and the second chunk (positions 15..999) of a prompt. Each row attends over its own sequence's cache only,
    keys 0..its position, read through its shuffled block table; prompt chunks are tiles of several rows, decode
    rows tiles of one, written into the same output."""
    gpu = kernels.gpu
    nh, nkv, max_len = 8, 2, 1000
    chunks = [(3, [14]), (0, list(range(17))), (1, [15]), (5, [16]), (2, list(range(15, 1000))), (4, [999])]
    seq_slots = np.concatenate([[b] * len(ps) for b, ps in chunks]).astype(np.int32)
    positions = np.concatenate([ps for _, ps in chunks]).astype(np.int32)
    firsts = np.cumsum([0] + [len(ps) for _, ps in chunks])
    spans = [(firsts[i], len(ps), b, ps[0]) for i, (b, ps) in enumerate(chunks)]
    R, B = len(positions), 7
    qkv, qkvf = bf16(gpu, rng.normal(0, 1.5, (R, (nh + 2 * nkv) * hd)))
    cached, held = [0] * B, [0] * B
    for b, ps in chunks:
        cached[b], held[b] = ps[0], ps[-1] + 1
    kf, vf = (rng.normal(0, 1.5, (B, max_len, nkv, hd)) for _ in "kv")
    pool = PagedPool(gpu, rng, kf, vf, cached, held, block_size)
    pool.write(kernels, qkv, qkvf, seq_slots, positions, nh, nkv, hd)
    out = poisoned(gpu, (R, nh * hd))
    prompt, decode, _ = attend(kernels, qkv, pool, out, spans, nh, nkv, hd)
    if hd != 80:
        assert len(prompt) > 2 and decode[:, 0].tolist() == [0, 18, 19, R - 1]
    got, q = read(gpu, out), qkvf[:, :nh * hd].reshape(R, nh, hd)
    assert not np.isnan(got).any()
    for i, (b, ps) in enumerate(chunks):
        rows = slice(firsts[i], firsts[i + 1])
        want = attention_reference(q[rows], pool.kf[b], pool.vf[b], positions[rows])
        assert rel_l2(got[rows], want) < 1e-2, f"seq_slot {b}"


@cases("length", [15, 16, 17, 1000])
@cases("block_size", [8, 16, 32])
def test_prompts_and_decodes_at_block_boundaries(kernels, rng, length, block_size):
    """A whole prompt, a decode row and a last chunk of a prompt, each `length` positions long, at the 1B's shape."""
    for new in (length, 1, max(1, length // 3)):
        run_attention(kernels, rng, [length, length - 1], [new, 1], 32, 8, 64, max_len=length,
                      block_size=block_size)


def test_block_table_write_sets_the_entries_it_is_given_and_no_other(kernels, rng):
    gpu = kernels.gpu
    tables = gpu.to_device(np.full((5, 7), -9, np.int32))
    idx = rng.choice(35, 20, replace=False).astype(np.int32)
    blocks = rng.integers(0, 1000, 20).astype(np.int32)
    kernels.block_table_write(tables, gpu.to_device(np.stack([idx, blocks], 1)))
    want = np.full(35, -9, np.int32)
    want[idx] = blocks
    assert np.array_equal(read(gpu, tables).reshape(-1), want)


@cases("M", range(1, 9))
# N: not whole blocks of columns; K: one warp a column (8, 264, 2048), two (4104) and four (8200)
@cases("N, K", [(37, 8), (1000, 264), (19, 2048), (45, 4104), (7, 8200)])
def test_gemv_matches_numpy(kernels, rng, M, N, K):
    gpu = kernels.gpu
    x, xf = bf16(gpu, rng.normal(0, 1, (M, K)))
    w, wf = bf16(gpu, rng.normal(0, 0.05, (N, K)))
    y = poisoned(gpu, (M, N))
    kernels.gemv(x, w, y)
    assert rel_l2(read(gpu, y), xf @ wf.T) < 1e-2


@cases("column_warps", [1, 2, 4, 8])
@cases("M, N, K", [(1, 37, 8), (3, 1000, 2048), (8, 45, 4104), (2, 19, 520)])
def test_gemv_with_any_warps_a_column_matches_numpy(kernels, rng, column_warps, M, N, K):
    """The warps a column the engine may pick: more warps than a row has loads leave some idle, still exact."""
    gpu = kernels.gpu
    x, xf = bf16(gpu, rng.normal(0, 1, (M, K)))
    w, wf = bf16(gpu, rng.normal(0, 0.05, (N, K)))
    y = poisoned(gpu, (M, N))
    kernels.gemv(x, w, y, column_warps)
    assert rel_l2(read(gpu, y), xf @ wf.T) < 1e-2


# the fused kinds: N (or SwiGLU's I) not whole blocks of columns; K one warp a column (264, 2048) to four (8200)
FUSED_SHAPES = [(37, 264), (1000, 2048), (19, 4104), (7, 8200)]


def rows_at_scales(rng, M, K):
    """(M, K) residual rows, row m at scale 2^m, and where M > 2 the last row all zeros."""
    x = rng.normal(0, 1, (M, K)) * 2.0 ** np.arange(M)[:, None]
    if M > 2:
        x[-1] = 0.0
    return x


@cases("column_warps", [None, 1, 2, 4, 8])
@cases("M", [1, 2, 3, 8])
@cases("N, K", FUSED_SHAPES)
def test_gemv_norm_matches_numpy(kernels, rng, column_warps, M, N, K):
    """y = rms_norm(x) * g @ w^T: x the residual stream, its norm summed beside the dot products. Each row at its
    own scale (a row given another's norm fails), the last of several all zeros (eps alone keeps it finite)."""
    gpu = kernels.gpu
    x, xf = bf16(gpu, rows_at_scales(rng, M, K))
    g, gf = bf16(gpu, rng.normal(1, 0.2, K))
    w, wf = bf16(gpu, rng.normal(0, 0.05, (N, K)))
    y = poisoned(gpu, (M, N))
    kernels.gemv(x, w, y, column_warps, norm=(g, 1e-5))
    assert rel_l2(read(gpu, y), rms_norm(xf, gf, 1e-5) @ wf.T) < 1e-2
    assert np.array_equal(read(gpu, x), xf)                              # the residual stream is only read


@cases("column_warps", [None, 1, 2, 4, 8])
@cases("M", [1, 2, 5, 8])
@cases("inter, K", FUSED_SHAPES)
def test_gemv_norm_silu_matches_numpy(kernels, rng, column_warps, M, inter, K):
    """act = silu(a_gate) * a_up, a = rms_norm(x) * g @ [W_gate | W_up]^T: each block's gate columns meet their
    up columns; 8 warps a column is taken as 4 (two columns a block)."""
    gpu = kernels.gpu
    x, xf = bf16(gpu, rows_at_scales(rng, M, K))
    g, gf = bf16(gpu, rng.normal(1, 0.2, K))
    w, wf = bf16(gpu, rng.normal(0, 0.05, (2 * inter, K)))
    act = poisoned(gpu, (M, inter))
    kernels.gemv(x, w, act, column_warps, norm=(g, 1e-5), silu=True)
    a = rms_norm(xf, gf, 1e-5) @ wf.T
    assert rel_l2(read(gpu, act), silu(a[:, :inter]) * a[:, inter:]) < 1e-2


@cases("column_warps", [None, 1, 2, 4, 8])
@cases("M", [1, 4, 7, 8])
@cases("N, K", FUSED_SHAPES)
def test_gemv_residual_matches_numpy(kernels, rng, column_warps, M, N, K):
    """y += bf16(x @ w^T), in bf16 as the unfused add (add_rms_norm) does it."""
    gpu = kernels.gpu
    x, xf = bf16(gpu, rng.normal(0, 1, (M, K)))
    w, wf = bf16(gpu, rng.normal(0, 0.05, (N, K)))
    y, yf = bf16(gpu, rng.normal(0, 2, (M, N)))
    kernels.gemv(x, w, y, column_warps, residual=True)
    got, d = read(gpu, y), xf @ wf.T
    want = round_to_bf16(yf + round_to_bf16(d))
    assert rel_l2(got, want) < 1e-2
    # element by element, within 2 bf16 steps of the largest of the terms (the fp32 sum may round to the
    # neighbouring bf16 before the add): an element left unwritten, or added twice, is off by all of d
    scale = np.maximum.reduce([np.abs(want), np.abs(yf), np.abs(d)])
    assert (np.abs(got - want) <= 2 * 2.0 ** -7 * scale).all()


@cases("column_warps", [None, 1, 4, 8])
@cases("M", [1, 3, 8])
# head_dim 64 and 128, GQA ratios 1, 3 and 4; hidden widths that are not a block's columns
# (and head_dim 10: 5 pairs a head, so blocks straddle heads and the last block is partial)
@cases("nh, nkv, hd, K", [(4, 4, 64, 264), (3, 1, 128, 2048), (8, 2, 64, 4104), (3, 1, 10, 264)])
def test_gemv_norm_rope_matches_numpy(kernels, rng, column_warps, M, nh, nkv, hd, K):
    """qkv = rms_norm(x) * g @ Wqkv^T, then rope_kv_write's work: q and k heads rotated at each row's position, v
    as computed, and each row's k and v in its cache slot (none for a slot of -1); poisoned outputs and cache."""
    from dataclasses import replace

    from common.rope import rope_cos_sin
    from common.synthetic import PRESETS

    gpu, max_len = kernels.gpu, 300
    cos, sin = rope_cos_sin(replace(PRESETS["llama-3.2-1b"], head_dim=hd), np.arange(max_len))
    positions = rng.integers(0, max_len, M).astype(np.int32)
    positions[0] = max_len - 1
    slots = rng.permutation(2 * M).astype(np.int32)[:M]                 # a pool of 2 M slots
    slots[M // 2] = -1
    width, rot = (nh + 2 * nkv) * hd, (nh + nkv) * hd
    x, xf = bf16(gpu, rows_at_scales(rng, M, K))
    g, gf = bf16(gpu, rng.normal(1, 0.2, K))
    w, wf = bf16(gpu, rng.normal(0, 0.05, (width, K)))
    qkv = poisoned(gpu, (M, width))
    k_cache, v_cache = poisoned(gpu, (2 * M, 1, nkv, hd)), poisoned(gpu, (2 * M, 1, nkv, hd))
    rope = (k_cache, v_cache, gpu.to_device(slots), gpu.to_device(cos), gpu.to_device(sin), gpu.to_device(positions),
            nh, nkv, hd)
    kernels.gemv(x, w, qkv, column_warps, norm=(g, 1e-5), rope=rope)
    plain = rms_norm(xf, gf, 1e-5) @ wf.T
    want = plain.copy()
    want[:, :rot] = apply_rope(plain[:, :rot].reshape(M, nh + nkv, hd), cos[positions], sin[positions]).reshape(M, rot)
    got = read(gpu, qkv)
    assert rel_l2(got, want) < 1e-2
    check_cache_writes(gpu, k_cache, v_cache, slots, got[:, nh * hd:rot], got[:, rot:])    # what qkv holds


@functools.cache
def head_weights(N, K):
    """(N, K) weights N(0, 0.05) as bf16 bits, drawn once a process for each shape (read-only): at the real
    vocabulary the draw and its rounding take seconds, and each of the head test's 15 cases there plants its own tie
    in a copy. 0.5 GB at 128,256 x 2048."""
    bits = f32_to_bf16(np.random.default_rng().standard_normal((N, K), dtype=np.float32) * np.float32(0.05))
    bits.setflags(write=False)
    return bits


@cases("column_warps", [None, 1, 2, 4, 8])
@cases("M", [1, 3, 8])
@cases("N, K", [(37, 264), (1000, 2048), (128256, 2048), (19, 4104)])
def test_gemv_norm_head_gives_fp32_logits_and_each_row_s_first_argmax(kernels, rng, column_warps, M, N, K):
    """The final norm and the LM head in one GEMV: fp32 logits against numpy, and ids[m] the first argmax of the
    logits it wrote. Row 0 holds a planted tie between two columns of different blocks (the lower one wins); the
    argmax buffers are back at zero after the launch, and a second launch over other rows finds their own."""
    gpu = kernels.gpu
    g, gf = bf16(gpu, rng.normal(1, 0.2, K))
    bits = head_weights(N, K).copy()
    first, second = N // 3, N - 1
    x0 = rows_at_scales(rng, M, K)
    bits[first] = bits[second] = f32_to_bf16(0.2 * np.sign(x0[0] * gf))     # row 0's largest logit, twice
    w, wf = gpu.to_device(bits, "bf16"), bf16_to_f32(bits)
    best, ticket = (gpu.to_device(np.zeros(n, t)) for n, t in ((M + 2, np.uint64), (1, np.int32)))
    ids = poisoned(gpu, (M + 2,), "i32")
    for launch, rows in enumerate((x0, rng.normal(0, 1, (M, K)))):
        x, xf = bf16(gpu, rows)
        y = poisoned(gpu, (M, N), "f32")
        kernels.gemv(x, w, y, column_warps, norm=(g, 1e-5), head=(best, ticket, ids))
        got = read(gpu, y)
        assert rel_l2(got, rms_norm(xf, gf, 1e-5) @ wf.T) < 1e-4
        assert read(gpu, ids)[:M].tolist() == got.argmax(1).tolist(), f"launch {launch}"
        assert not read(gpu, best).any() and read(gpu, ticket)[0] == 0, f"launch {launch} left its argmax state"
        if launch == 0:
            assert got[0, first] == got[0, second] == got[0].max() and read(gpu, ids)[0] == first


def test_gemv_fused_refuses_what_it_cannot_do(kernels):
    gpu = kernels.gpu
    x, w, g = gpu.empty((1, 16), "bf16"), gpu.empty((6, 16), "bf16"), gpu.empty((16,), "bf16")
    with pytest.raises(ValueError, match="gemv"):                          # SwiGLU without the norm
        kernels.gemv(x, w, gpu.empty((1, 3), "bf16"), silu=True)
    with pytest.raises(ValueError, match="gemv"):                          # SwiGLU's output is (M, N / 2)
        kernels.gemv(x, w, gpu.empty((1, 6), "bf16"), norm=(g, 1e-5), silu=True)
    with pytest.raises(ValueError, match="gemv"):                          # a norm of the wrong length
        kernels.gemv(x, w, gpu.empty((1, 6), "bf16"), norm=(gpu.empty((8,), "bf16"), 1e-5))
    with pytest.raises(ValueError, match="gemv"):                          # norm and residual: not one kernel
        kernels.gemv(x, w, gpu.empty((1, 6), "bf16"), norm=(g, 1e-5), residual=True)
    best, ticket = gpu.empty((1,), "u64"), gpu.empty((1,), "i32")
    with pytest.raises(ValueError, match="gemv"):                          # the head's logits are fp32
        kernels.gemv(x, w, gpu.empty((1, 6), "bf16"), norm=(g, 1e-5), head=(best, ticket, ticket))
    with pytest.raises(ValueError, match="gemv"):                          # the head without the norm
        kernels.gemv(x, w, gpu.empty((1, 6), "f32"), head=(best, ticket, ticket))
    with pytest.raises(ValueError, match="head"):                          # best must be u64
        kernels.gemv(x, w, gpu.empty((1, 6), "f32"), norm=(g, 1e-5), head=(ticket, ticket, ticket))
    cache, ids = gpu.empty((4, 1, 1, 4), "bf16"), gpu.empty((1,), "i32")    # right but for the columns
    table = gpu.empty((8, 2), "f32")
    with pytest.raises(ValueError, match="rope"):                          # 6 columns are not 1 + 2 * 1 heads of 4
        kernels.gemv(x, w, gpu.empty((1, 6), "bf16"), norm=(g, 1e-5), rope=(cache, cache, ids, table, table, ids,
                                                                            1, 1, 4))


def test_kernels_launched_early_give_the_bits_of_kernels_launched_in_turn(kernels, rng):
    """Programmatic dependent launch (kernels/pdl.cuh): a layer's chain of kernels, each reading what the one
    before wrote and overwriting what it read, queued 24 times without a sync, gives the same bits whether each
    kernel may start early (gemv.cu loading weights before its input is ready) or only after the one before."""
    from ..kernels import Kernels

    gpu, serial = kernels.gpu, Kernels(kernels.gpu, pdl=False)
    H, inter = 2048, 3000
    w_norm, _ = bf16(gpu, rng.normal(1, 0.1, H))
    w_up, _ = bf16(gpu, rng.normal(0, 0.03, (2 * inter, H)))
    w_down, _ = bf16(gpu, rng.normal(0, 0.03, (H, inter)))
    x0 = f32_to_bf16(rng.normal(0, 1, (1, H)).astype(np.float32))
    results = []
    for k in (kernels, serial):
        x, h, d = gpu.to_device(x0, "bf16"), gpu.empty((1, H), "bf16"), gpu.to_device(np.zeros_like(x0), "bf16")
        gate_up, act = gpu.empty((1, 2 * inter), "bf16"), gpu.empty((1, inter), "bf16")
        for _ in range(24):
            k.add_rms_norm(x, d, w_norm, h, 1e-5)          # x += d, h = norm(x): reads what down wrote
            k.gemv(h, w_up, gate_up, 2)
            k.silu_mul(gate_up, act)
            k.gemv(act, w_down, d, 4)                      # overwrites d, which add_rms_norm read
        for _ in range(24):                                # the fused kinds: x read by one, rewritten by the next
            k.gemv(x, w_up, act, 2, norm=(w_norm, 1e-5), silu=True)
            k.gemv(act, w_down, x, 4, residual=True)
        results.append(gpu.to_host(x))
    assert np.isfinite(bf16_to_f32(results[0])).all()
    np.testing.assert_array_equal(results[0], results[1])


def test_gemv_refuses_what_it_cannot_load(kernels):
    gpu = kernels.gpu
    with pytest.raises(ValueError, match="gemv"):                          # K not a multiple of 8
        kernels.gemv(gpu.empty((1, 12), "bf16"), gpu.empty((4, 12), "bf16"), gpu.empty((1, 4), "bf16"))
    with pytest.raises(ValueError, match="gemv"):                          # 9 rows: no instantiation
        kernels.gemv(gpu.empty((9, 16), "bf16"), gpu.empty((4, 16), "bf16"), gpu.empty((9, 4), "bf16"))
    with pytest.raises(ValueError, match="gemv"):                          # 3 warps a column: not in GEMV_COLUMN_WARPS
        kernels.gemv(gpu.empty((1, 16), "bf16"), gpu.empty((4, 16), "bf16"), gpu.empty((1, 4), "bf16"), 3)


def test_launchers_reject_bad_shapes(kernels):
    gpu = kernels.gpu
    with pytest.raises(ValueError, match="rms_norm"):
        kernels.rms_norm(gpu.empty((3, 8), "bf16"), gpu.empty((9,), "bf16"), gpu.empty((3, 8), "bf16"), 1e-5)
    shifted = gpu.empty((3 * 64 + 1,), "bf16").view(2, (3, 64))                  # 2 bytes past 16: its 16-byte
    with pytest.raises(ValueError, match="add_rms_norm"):                     # loads would fault
        kernels.add_rms_norm(shifted, gpu.empty((3, 64), "bf16"), gpu.empty((64,), "bf16"),
                             gpu.empty((3, 64), "bf16"), 1e-5)
    cache, tables = gpu.empty((2, 4, 1, 8), "bf16"), gpu.empty((3, 2), "i32")
    tiles, partial = gpu.empty((3, 4), "i32"), gpu.empty((3 * 2 * 2 * 10,), "f32")
    arrivals = gpu.empty((3,), "i32")
    with pytest.raises(ValueError, match="attention"):                        # tiles of 3 numbers
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((3, 16), "bf16"), partial, arrivals,
                          gpu.empty((3, 3), "i32"), tables, 2, 1, 8)
    per_split = gpu.to_device(np.array([2], np.int32))
    with pytest.raises(ValueError, match="attention"):                        # partials for 2 of 3 splits
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((3, 16), "bf16"), partial, arrivals,
                          tiles, tables, 2, 1, 8, 3, per_split)
    with pytest.raises(ValueError, match="attention"):                        # counts for 2 of 3 tiles
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((3, 16), "bf16"), partial,
                          gpu.empty((2,), "i32"), tiles, tables, 2, 1, 8, 2, per_split)
    with pytest.raises(ValueError, match="attention"):                        # keys_per_split not on the device
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((3, 16), "bf16"), partial, arrivals,
                          tiles, tables, 2, 1, 8, 2, 2)
    wide = gpu.empty((2, 4, 1, 258), "bf16")                                   # head_dim 258 > 256
    with pytest.raises(ValueError, match="attention"):
        kernels.attention(gpu.empty((3, 774), "bf16"), wide, wide, gpu.empty((3, 258), "bf16"), partial, arrivals,
                          tiles, tables, 1, 1, 258)
    with pytest.raises(ValueError, match="attention"):                        # 33 query heads per K/V head
        kernels.attention(gpu.empty((3, 35 * 8), "bf16"), cache, cache, gpu.empty((3, 33 * 8), "bf16"), partial,
                          arrivals, tiles, tables, 33, 1, 8)
    with pytest.raises(ValueError, match="attention"):                        # 33 splits > MAX_SPLITS
        kernels.attention(gpu.empty((3, 32), "bf16"), cache, cache, gpu.empty((3, 16), "bf16"),
                          gpu.empty((3 * 33 * 2 * 10,), "f32"), arrivals, tiles, tables, 2, 1, 8, 33, per_split)
    odd = gpu.empty((2, 3, 1, 8), "bf16")                                     # a block of 3 positions
    with pytest.raises(ValueError, match="attention"):
        kernels.attention(gpu.empty((3, 32), "bf16"), odd, odd, gpu.empty((3, 16), "bf16"), partial, arrivals,
                          tiles, tables, 2, 1, 8)
