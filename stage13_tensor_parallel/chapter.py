"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  layer-split   what one rank of N holds of each layer of the 1B and the 8B shapes (tensor_parallel.plan): query and
                K/V heads, MLP columns, LM head rows, bytes of weights (the embedding whole on every rank)
  when-it-pays  a batch-1 decode step's floor, the weights' bytes a rank reads over the copy bandwidth, against the
                all-reduces a step adds (two a layer), at TP = 1, 2 and 4 for both shapes; the bandwidth is the one
                measured in the stage10 profile, the all-reduce's latency an assumption until measured here
  ladder-pair   stage12 and this stage at TP = 1 in each workload's newest complete ladder run (common.course.ladders)
"""
from __future__ import annotations

from common.course import ladders
from common.synthetic import PRESETS

from .tensor_parallel import plan

PREVIOUS = "stage12_hopper_attention"       # the engine this one is at tensor_parallel_size=1

SHAPES = ("llama-3.2-1b", "llama-3.1-8b")
COPY_GB_PER_S = 4193          # the H200's copy bandwidth, as COPY_SOURCE measured it
COPY_SOURCE = "benchmarks/logs/2026-12-04-H200-stage08-profiles-before-kernel-fixes/"
ALL_REDUCE_US = 6.0           # one small all-reduce over NVLink: assumed (NCCL's latency-bound regime), not measured


def _rank_bytes(name: str, size: int, read: bool = False) -> int:
    """Bytes of weights rank 0 holds (bf16): its shards, the embedding whole and, untied, its slice of the LM head;
    or, with `read`, what a decode step streams: its shards and its LM head slice (of the embedding, only a
    token's row is read)."""
    cfg = PRESETS[name]
    s = plan(cfg, size)[0]
    H, hd, L = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    layer = ((len(s.heads) + 2 * len(s.kv_heads)) * hd * H + len(s.heads) * hd * H + 3 * len(s.mlp) * H + 2 * H)
    vocab = len(s.vocab) * H if read else cfg.vocab_size * H + (0 if cfg.tie_word_embeddings else len(s.vocab) * H)
    return 2 * (L * layer + vocab + H)


def layer_split() -> str:
    lines = ["| model | TP | query heads a rank | K/V heads a rank | MLP columns a rank | LM head rows a rank | "
             "weights a rank |", "|" + " --- |" * 7]
    for name in SHAPES:
        for size in (1, 2, 4):
            s = plan(PRESETS[name], size)[0]
            lines.append(f"| `{name}` | {size} | {len(s.heads)} | {len(s.kv_heads)} | {len(s.mlp):,} | "
                         f"{len(s.vocab):,} | {_rank_bytes(name, size) / 1e9:.2f} GB |")
    return "\n".join(lines)


def when_it_pays() -> str:
    lines = [f"Floors at {COPY_GB_PER_S:,} GB/s (the H200's copy bandwidth, `{COPY_SOURCE}`), all-reduces at an "
             f"assumed {ALL_REDUCE_US:g} us each, the logits' all-gather not counted:", "",
             "| model | TP | weights a rank reads / copy bandwidth | all-reduces a step x assumed latency | step floor | "
             "against TP = 1 |", "|" + " --- |" * 6]
    for name in SHAPES:
        base = None
        for size in (1, 2, 4):
            stream = _rank_bytes(name, size, read=True) / (COPY_GB_PER_S * 1e9) * 1e3   # ms
            reduce = 0.0 if size == 1 else 2 * PRESETS[name].num_hidden_layers * ALL_REDUCE_US / 1e3
            step = stream + reduce
            base = base or step
            lines.append(f"| `{name}` | {size} | {stream:.3f} ms | {reduce:.3f} ms | {step:.3f} ms | "
                         f"{base / step:.2f}x |")
    return "\n".join(lines)


GENERATORS = {"layer-split": layer_split, "when-it-pays": when_it_pays,
              "ladder-pair": lambda: ladders.pair(PREVIOUS, __package__)}
