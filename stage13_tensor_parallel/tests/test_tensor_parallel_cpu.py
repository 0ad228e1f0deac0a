"""CPU: tensor parallelism's arithmetic on the numpy reference. N simulated ranks each hold their shards
(tensor_parallel.shard_tensor) and compute their part of every layer; an all-reduce is the sum of the N partials,
the logits are the N vocabulary slices side by side. They must give the unsharded reference's logits, on shapes
with head_dim 64 and 128, GQA ratios 1, 3 and 4, fewer K/V heads than ranks, tied and untied."""
from dataclasses import replace

import numpy as np
import pytest

from common.checkpoint import Checkpoint
from common.reference import ReferenceModel, apply_rope, rms_norm, rope_cos_sin, silu, softmax
from common.synthetic import PRESETS, write_checkpoint

from ..tensor_parallel import plan, shard_tensor

SHAPES = {   # (shape, the rank counts it splits over)
    "hd64-gqa4": (dict(hidden_size=256, intermediate_size=640, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64), (1, 2, 4, 8)),
    "hd128-gqa3-untied": (dict(hidden_size=384, intermediate_size=1024, num_attention_heads=6, num_key_value_heads=2,
                               head_dim=128, tie_word_embeddings=False), (1, 2)),
    "hd64-gqa1": (dict(hidden_size=256, intermediate_size=384, num_attention_heads=4, num_key_value_heads=4,
                       head_dim=64), (2, 4)),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def reference(request, tmp_path_factory):
    shape, sizes = SHAPES[request.param]
    cfg = replace(PRESETS["tiny"], num_hidden_layers=2, **shape)
    folder = write_checkpoint(cfg, tmp_path_factory.mktemp(request.param) / "model")
    return ReferenceModel(Checkpoint(folder)), sizes


def sharded_logits(ref: ReferenceModel, ids: np.ndarray, size: int) -> np.ndarray:
    """The reference's forward over `size` simulated ranks: each computes with its own shards; the all-reduces
    (after o and down) sum the ranks' partials; the logits are the ranks' slices concatenated (a tied head: each
    rank's rows of the embedding it holds whole)."""
    cfg, w = ref.config, ref.w
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    shards = plan(cfg, size)
    mine = [{name: shard_tensor(name, a, cfg, s) for name, a in w.items()} for s in shards]
    T, hd, eps = len(ids), cfg.head_dim, cfg.rms_norm_eps
    cos, sin = rope_cos_sin(cfg, np.arange(T))
    causal = np.triu(np.full((T, T), -np.inf, np.float32), k=1)

    x = mine[0]["model.embed_tokens.weight"][ids]                            # every rank's lookup, the same
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        partials = []
        for s, part in zip(shards, mine):
            h = rms_norm(x, part[p + "input_layernorm.weight"], eps)
            q = (h @ part[p + "self_attn.q_proj.weight"].T).reshape(T, len(s.heads), hd)
            k = (h @ part[p + "self_attn.k_proj.weight"].T).reshape(T, len(s.kv_heads), hd)
            v = (h @ part[p + "self_attn.v_proj.weight"].T).reshape(T, len(s.kv_heads), hd)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            group = len(s.heads) // len(s.kv_heads)
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal
            attn = np.einsum("hqk,khd->qhd", softmax(scores), v).reshape(T, -1)
            partials.append(attn @ part[p + "self_attn.o_proj.weight"].T)
        x = x + sum(partials)                                                   # all-reduce
        partials = []
        for part in mine:
            h = rms_norm(x, part[p + "post_attention_layernorm.weight"], eps)
            act = silu(h @ part[p + "mlp.gate_proj.weight"].T) * (h @ part[p + "mlp.up_proj.weight"].T)
            partials.append(act @ part[p + "mlp.down_proj.weight"].T)
        x = x + sum(partials)                                                   # all-reduce
    heads = [part[head][s.vocab] if cfg.tie_word_embeddings else part[head] for s, part in zip(shards, mine)]
    return np.concatenate([rms_norm(x, part["model.norm.weight"], eps) @ w.T for part, w in zip(mine, heads)],
                          axis=1)


def test_n_ranks_with_summed_partials_give_the_unsharded_logits(reference):
    ref, sizes = reference
    ids = np.random.default_rng(0).integers(0, ref.config.vocab_size, 13)
    want = ref.forward(ids)
    for size in sizes:
        got = sharded_logits(ref, ids, size)
        assert got.shape == want.shape
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1e-5, f"{size} ranks: relative L2 {err:.2e}"


def test_the_greedy_token_is_the_largest_of_the_slices_maxima_first_on_ties(reference):
    """What the ranks exchange for a greedy token: each slice's (max, first index of it); the token is the largest
    max, the lowest rank's on ties, which is the whole row's first argmax."""
    ref, sizes = reference
    V, rng = ref.config.vocab_size, np.random.default_rng(1)
    for size in sizes:
        shards = plan(ref.config, size)
        for row in (rng.normal(0, 1, V), np.zeros(V), np.r_[np.zeros(V - 1), 1.0]):
            row = row.astype(np.float32)
            row[V // 2] = row[V - 1] = row.max() + 1          # a tie across slices: the lower index wins
            best = [(row[s.vocab].max(), s.vocab.start + int(row[s.vocab].argmax())) for s in shards if len(s.vocab)]
            top = max(m for m, _ in best)
            assert min(i for m, i in best if m == top) == int(row.argmax()) == V // 2


def test_every_tensor_is_split_whole_or_copied(reference):
    """Split tensors: the ranks' parts, side by side along the split axis, are the tensor; norms whole on every
    rank; K/V heads split, or each rank the one its query heads read."""
    ref, sizes = reference
    cfg, w = ref.config, ref.w
    for size in sizes:
        shards = plan(cfg, size)
        for name, a in w.items():
            parts = [shard_tensor(name, a, cfg, s) for s in shards]
            if name.endswith("norm.weight") or name == "model.embed_tokens.weight":
                assert all(part is a for part in parts), name
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                assert np.array_equal(np.concatenate(parts, axis=1), a), name
            elif name.endswith(("k_proj.weight", "v_proj.weight")) and cfg.num_key_value_heads < size:
                for s, part in zip(shards, parts):
                    kv = s.heads.start // (cfg.num_attention_heads // cfg.num_key_value_heads)
                    assert np.array_equal(part, a[kv * cfg.head_dim:(kv + 1) * cfg.head_dim]), (name, s.rank)
            else:
                assert np.array_equal(np.concatenate(parts, axis=0), a), name


@pytest.mark.parametrize("change, size, message", [
    ({}, 3, "tensor_parallel_size=3 does not divide num_attention_heads=32"),
    ({"num_attention_heads": 12, "num_key_value_heads": 3}, 2, "num_key_value_heads=3: one must divide the other"),
    ({"intermediate_size": 8190}, 4, "does not divide intermediate_size=8190"),
    ({}, 0, "tensor_parallel_size=0 must be an integer >= 1"),
])
def test_a_size_that_cannot_split_the_model_is_refused_in_one_line(change, size, message):
    cfg = replace(PRESETS["llama-3.2-1b"], **change)
    with pytest.raises(ValueError, match=message):
        plan(cfg, size)


def test_the_8b_shape_splits_over_2_and_4_and_copies_k_v_heads_over_16():
    cfg = PRESETS["llama-3.1-8b"]
    for size in (2, 4, 8):
        shards = plan(cfg, size)
        assert [len(s.heads) for s in shards] == [32 // size] * size
        assert [len(s.kv_heads) for s in shards] == [8 // size] * size
        assert sum(len(s.vocab) for s in shards) == cfg.vocab_size
    sixteen = plan(cfg, 16)                                   # two query heads a rank; K/V heads copied twice
    assert [s.kv_heads.start for s in sixteen] == [r // 2 for r in range(16)]


def test_the_engine_refuses_a_size_that_cannot_split_the_model_before_any_gpu_work(tiny_dir):
    from ..engine import Engine

    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide num_attention_heads=4"):
        Engine(str(tiny_dir), tensor_parallel_size=3)


def test_a_rank_s_config_is_its_heads_and_columns_and_its_arena_holds_its_parts(tiny_dir):
    """rank_config: the rank's query and K/V heads and MLP columns, the rest of the model as it was; the arena of
    a rank's parts lays each fused group's parts back to back (load_weights with part=)."""
    from ..tensor_parallel import rank_config
    from ..weights import arena_layout
    from ..worker import shard_part

    ckpt = Checkpoint(tiny_dir)
    cfg = ckpt.config
    for shard in plan(cfg, 2):
        mine = rank_config(cfg, shard)
        assert (mine.num_attention_heads, mine.num_key_value_heads, mine.intermediate_size) == (2, 1, 96)
        assert (mine.hidden_size, mine.head_dim, mine.vocab_size) == (cfg.hidden_size, cfg.head_dim, cfg.vocab_size)
        part = shard_part(cfg, shard)
        sizes = {e.name: part(e.name, ckpt.raw(e.name)).nbytes for e in ckpt.file_order()}
        offsets, total = arena_layout(ckpt, sizes)
        q, k, v = (f"model.layers.0.self_attn.{n}_proj.weight" for n in "qkv")
        assert offsets[k] == offsets[q] + sizes[q] and offsets[v] == offsets[k] + sizes[k]
        assert sizes[q] == 2 * 16 * 64 * 2 and sizes["model.embed_tokens.weight"] == cfg.vocab_size * 64 * 2
        assert total < arena_layout(ckpt)[1]


def test_a_rank_s_parts_reach_the_staging_buffers_whole_and_in_order(tiny_dir):
    """The bytes load_weights stages for each part, pieces of at most a staging buffer, put back together, are the
    part's (o and down are column shards: strided views, copied contiguous once), and no copy outlives its
    tensor's last piece."""
    from ..weights import _Contiguous
    from ..worker import shard_part

    ckpt = Checkpoint(tiny_dir)
    part = shard_part(ckpt.config, plan(ckpt.config, 2)[1])
    arrays = {e.name: part(e.name, ckpt.raw(e.name)) for e in ckpt.file_order()}
    size = 1000                                                  # bytes a piece: tensors cut in several
    pieces = [(e, lo, min(size, arrays[e.name].nbytes - lo)) for e in ckpt.file_order()
              for lo in range(0, arrays[e.name].nbytes, size)]
    flat = _Contiguous(arrays, pieces)
    got = {}
    for e, lo, n in pieces:
        got.setdefault(e.name, []).append(flat.piece(e.name, lo, n).copy())
    assert not flat.made
    for name, a in arrays.items():
        assert np.concatenate(got[name]).tobytes() == np.ascontiguousarray(a).tobytes(), name
    assert not arrays["model.layers.0.self_attn.o_proj.weight"].flags.c_contiguous


def test_a_vocabulary_too_small_to_give_every_rank_a_slice_is_refused():
    cfg = replace(PRESETS["tiny"], vocab_size=5, num_attention_heads=4, num_key_value_heads=4)
    with pytest.raises(ValueError, match="tensor_parallel_size=4 leaves the last rank no rows of vocab_size=5"):
        plan(cfg, 4)


def test_the_engine_refuses_more_ranks_than_gpus_before_starting_any(tiny_dir):
    from common.device import gpu_count

    from ..engine import Engine

    if gpu_count() >= 4:
        pytest.skip(f"{gpu_count()} GPUs here: tiny's 4 heads cannot be split over more")
    with pytest.raises(ValueError, match=f"tensor_parallel_size=4 needs 4 GPUs; this machine has {gpu_count()}"):
        Engine(str(tiny_dir), tensor_parallel_size=4)
