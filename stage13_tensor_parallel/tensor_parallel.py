"""Tensor parallelism's arithmetic: which part of every weight each of N ranks holds, and why the partial sums add
up to the model (Megatron-LM's split, as vLLM, SGLang and nano-vllm make it).

A layer of N ranks, rank r (nh query heads, nkv K/V heads, I MLP columns; x (R, H) the same on every rank):

    qkv      column-parallel: its nh / N query heads, r nh / N ..., and the K/V heads they read: nkv / N of them,
             or, where there are fewer K/V heads than ranks, the one its query heads share (a copy on N / nkv ranks)
    attention over its own heads alone: no rank needs another's
    o        row-parallel: the columns of Wo that its heads' outputs meet; x += all-reduce(sum of the N products)
    gate_up  column-parallel: its I / N columns of gate and of up (SwiGLU needs no other rank's)
    down     row-parallel: Wdown's columns of its I / N; x += all-reduce(sum)
    norms    on every rank, whole (they read x, which every rank holds after each all-reduce)

and around the layers: the embedding whole on every rank (a lookup reads R of its rows, so a copy costs memory
only, no bandwidth, and spares an all-reduce: vLLM splits it to save the memory), and the LM head cut in N slices
of ceil(V / N) vocabulary rows (each rank the logits of its slice, gathered into every rank's whole rows; a
tied head is the rank's rows of the embedding it holds).

    shards = plan(config, N)                          one Shard a rank (ValueError, one line, where N cannot split)
    shard_tensor(name, array, config, shards[r])      rank r's part of a checkpoint tensor (a view where it can)
    rank_config(config, shards[r])                    the model as rank r computes it: its heads and MLP columns
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from common.config import LlamaConfig


@dataclass(frozen=True)
class Shard:
    rank: int
    size: int             # N, the ranks
    heads: range          # its query heads
    kv_heads: range       # the K/V heads they read
    mlp: range            # its MLP columns (of I)
    vocab: range          # its rows of the LM head


def plan(config: LlamaConfig, size: int) -> list[Shard]:
    """Every rank's shard of a model of `config` over `size` ranks; refused with the figure that does not divide."""
    nh, nkv, inter, V = (config.num_attention_heads, config.num_key_value_heads, config.intermediate_size,
                         config.vocab_size)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel_size={size!r} must be an integer >= 1")
    if nh % size:
        raise ValueError(f"tensor_parallel_size={size} does not divide num_attention_heads={nh}")
    if nkv % size and size % nkv:
        raise ValueError(f"tensor_parallel_size={size} and num_key_value_heads={nkv}: one must divide the other "
                         "(K/V heads split, or copied to each rank of a group)")
    if inter % size:
        raise ValueError(f"tensor_parallel_size={size} does not divide intermediate_size={inter}")
    heads, mlp, rows = nh // size, inter // size, -(-V // size)
    if (size - 1) * rows >= V:
        raise ValueError(f"tensor_parallel_size={size} leaves the last rank no rows of vocab_size={V}")
    shards = []
    for r in range(size):
        first_kv = r * nkv // size if nkv < size else r * (nkv // size)   # a copy: the head its queries read
        shards.append(Shard(r, size, range(r * heads, (r + 1) * heads),
                            range(first_kv, first_kv + max(nkv // size, 1)), range(r * mlp, (r + 1) * mlp),
                            range(min(r * rows, V), min((r + 1) * rows, V))))
    return shards


def shard_tensor(name: str, array: np.ndarray, config: LlamaConfig, shard: Shard) -> np.ndarray:
    """Rank `shard.rank`'s part of the checkpoint tensor `name` (Hugging Face's names and (out, in) layout)."""
    hd = config.head_dim

    def rows(r: range, per: int = 1) -> np.ndarray:   # output rows r.start * per .. r.stop * per
        return array[r.start * per:r.stop * per]

    def cols(r: range, per: int = 1) -> np.ndarray:
        return array[:, r.start * per:r.stop * per]

    if name.endswith("self_attn.q_proj.weight"):
        return rows(shard.heads, hd)
    if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
        return rows(shard.kv_heads, hd)
    if name.endswith("self_attn.o_proj.weight"):
        return cols(shard.heads, hd)
    if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
        return rows(shard.mlp)
    if name.endswith("mlp.down_proj.weight"):
        return cols(shard.mlp)
    if name == "lm_head.weight":
        return rows(shard.vocab)
    if name == "model.embed_tokens.weight" or name.endswith("norm.weight"):
        return array
    raise ValueError(f"{name}: no tensor-parallel rule for this tensor")


def rank_config(config: LlamaConfig, shard: Shard) -> LlamaConfig:
    """The model as rank `shard.rank` computes it: its query heads, the K/V heads they read and its MLP columns
    (hidden size, head_dim, layers and vocabulary as they were: the ranks meet on whole rows of x and logits)."""
    return replace(config, num_attention_heads=len(shard.heads), num_key_value_heads=len(shard.kv_heads),
                   intermediate_size=len(shard.mlp))
