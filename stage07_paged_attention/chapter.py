"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  worked-example  three sequences through a block manager of 8 blocks of 4 positions: their block tables as they
                  grow and finish, and the slot mapping of one step, computed by block_manager.py
  fragmentation   what a contiguous cache and a paged one reserve for the `ragged` workload's requests, and what
                  they write: from the workload's own seeded lengths, the cache's sizes and the block sizes
  paged-kernels   the committed pytest-benchmark runs of bench_attention.py: the paged kernels by block size,
                  decode against its floor, prefill's TFLOP/s
"""
from __future__ import annotations

import statistics

from common.readme import pytest_bench
from common.synthetic import PRESETS
from common.workloads import make_requests

from .block_manager import BlockManager, blocks_for
from .cache import kv_cache_bytes

ONE_B = PRESETS["llama-3.2-1b"]
BLOCK_SIZES = (8, 16, 32)
BUDGET_GIB = 4


class _Seq:
    def __init__(self, name):
        self.request_id, self.block_table = name, []


def worked_example() -> str:
    bs, pool = 4, BlockManager(8, 4)
    a, b, c = _Seq("A"), _Seq("B"), _Seq("C")
    rows = ["| event | A's block table | B's | C's | free blocks |", "| --- | --- | --- | --- | --- |"]

    def row(event):
        tables = [str(s.block_table) if s.block_table else "-" for s in (a, b, c)]
        rows.append(f"| {event} | " + " | ".join(tables) + f" | {pool.num_free} |")

    pool.grow(a, 6)
    row("A admitted with a 6-token prompt: positions 0..5 need 2 blocks")
    pool.grow(b, 3)
    row("B admitted with a 3-token prompt: 1 block")
    pool.grow(a, 8)
    row("A decodes positions 6 and 7: its second block still has room")
    pool.grow(a, 9)
    row("A decodes position 8: its blocks are full, it gets one more")
    pool.free(b)
    row("B finishes: its block goes back to the free list")
    pool.grow(c, 9)
    row("C admitted with a 9-token prompt: B's old block first, then two never used")
    rows += ["", "The next step packs A's decode row (position 9) and C's prompt (positions 0..8); each row's cache "
             "slot is `block_table[p // 4] * 4 + p % 4`:", "",
             "| row | sequence | position | block (table entry p // 4) | offset p % 4 | slot_mapping |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r, (name, p) in enumerate([("A", 9)] + [("C", p) for p in range(9)]):
        table = (a if name == "A" else c).block_table
        rows.append(f"| {r} | {name} | {p} | {table[p // bs]} (entry {p // bs}) | {p % bs} | "
                    f"{table[p // bs] * bs + p % bs} |")      # packing.pack's slot mapping
    return "\n".join(rows)


def fragmentation() -> str:
    """Each request, at the end of its life, holds its prompt and all its new tokens but the last (whose K/V
    are never computed). A contiguous cache (stage06) reserves max_model_len positions for it from admission;
    a paged one, whole blocks of what it holds."""
    held = [len(ids) + p.max_tokens - 1 for ids, p in make_requests("ragged")]
    mean = statistics.mean(held)
    budget = BUDGET_GIB * 2**30 // kv_cache_bytes(ONE_B, 1)        # positions that fit in the budget (1B)
    rows = ["| cache | positions reserved per sequence (mean) | of them written | never written | "
            f"sequences {BUDGET_GIB} GiB of 1B cache holds at their full length |", "|" + " --- |" * 5]
    for max_model_len in (2048, 4096):
        rows.append(f"| contiguous, max_model_len {max_model_len:,} (stage06) | {max_model_len:,} | {mean:,.0f} | "
                    f"{1 - mean / max_model_len:.1%} | {budget // max_model_len} |")
    for bs in BLOCK_SIZES:
        reserved = statistics.mean(blocks_for(n, bs) * bs for n in held)
        fits = budget / reserved
        rows.append(f"| paged, blocks of {bs} | {reserved:,.1f} | {mean:,.0f} | {1 - mean / reserved:.2%} | "
                    f"{fits:.0f} |")
    return "\n".join(rows)


def paged_kernels() -> str:
    lines = []
    for date, gpu, b in pytest_bench("pytest-bench-paged-attention"):
        decode = sorted((n for n in b if n.startswith("test_decode_attention")),
                        key=lambda n: tuple(b[n]["extra_info"][k] for k in ("batch_size", "cached_positions",
                                                                             "block_size")))
        lines += [f"Measured {date} on {gpu} (`bench_attention.py`: each sequence's blocks at shuffled places of "
                  "the pool; GPU time from events around 20 launches queued while a spin kernel held the GPU; "
                  "median of 5 rounds (min-max); the floor reads the K/V once at the copy bandwidth measured in the "
                  "same run):", "",
                  "| decode rows | cached positions | block size | splits | GPU time per layer | times the floor | "
                  "achieved GB/s |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for n in decode:
            e = b[n]["extra_info"]
            lines.append(f"| {e['batch_size']} | {e['cached_positions']:,} | {e['block_size']} | {e['n_splits']} | "
                         f"{e['us_per_layer']:.1f} us ({1e3 * e['gpu_ms_min']:.1f}-{1e3 * e['gpu_ms_max']:.1f}) | "
                         f"{e['times_floor']:.2f}x | {e['achieved_gb_per_s']:,.0f} |")
        lines += ["", "| prompt tokens | block size | GPU time per layer | achieved TFLOP/s |",
                  "| --- | --- | --- | --- |"]
        prefill = sorted((n for n in b if n.startswith("test_prefill_attention")),
                         key=lambda n: (b[n]["extra_info"]["prompt_tokens"], b[n]["extra_info"]["block_size"]))
        for n in prefill:
            e = b[n]["extra_info"]
            lines.append(f"| {e['prompt_tokens']:,} | {e['block_size']} | {e['ms_per_layer']:.3f} ms | "
                         f"{e['tflop_per_s']:.0f} |")
        lines.append("")
    return "\n".join(lines).rstrip()


GENERATORS = {"worked-example": worked_example, "fragmentation": fragmentation, "paged-kernels": paged_kernels}
