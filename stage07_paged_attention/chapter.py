"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  worked-example  three sequences through a block manager of 8 blocks of 4 positions: their block tables as they
                  grow and finish, and the slot mapping of one step, computed by block_manager.py
  fragmentation   what a contiguous cache and a paged one reserve for the `ragged` workload's requests, and what
                  they write: from the workload's own seeded lengths, the cache's sizes and the block sizes
  paged-kernels   the committed pytest-benchmark runs of bench_attention.py: the paged kernels by block size,
                  beside the previous stage's contiguous ones; decode against its floor, prefill's TFLOP/s
  ample-memory    the committed harness runs of this stage against the previous one alone, each engine sizing
                  its own cache: `latency`, `batch` and `ragged`, the newest run of each
  ladder-pair     the previous stage and this one in each workload's newest complete ladder run (common.course.ladders)
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from common.course import ladders
from common.course.readme import RESULTS, pytest_bench
from common.synthetic import PRESETS
from common.bench.workloads import make_requests

from .block_manager import BlockManager, blocks_for
from .cache import BLOCK_SIZE, kv_cache_bytes

ONE_B = PRESETS["llama-3.2-1b"]
HERE = Path(__file__).resolve().parent
PREVIOUS = sorted(p.name for p in HERE.parent.glob("stage[0-9][0-9]_*") if p.name < HERE.name)[-1]
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


def _by_shape(bench: dict, test: str, keys: tuple) -> dict:
    """{shape: {block size: extra_info}} of one test's cases; a file without block sizes gives {shape: {None: ..}}."""
    found = {}
    for name, x in bench.items():
        if name.startswith(test):
            e = x["extra_info"]
            found.setdefault(tuple(e[k] for k in keys), {})[e.get("block_size")] = e
    return dict(sorted(found.items()))


def paged_kernels() -> str:
    """One row per shape (decode rows x cached positions, or a prompt), one column per block size, beside the
    previous stage's contiguous kernel on the same shape (from its newest benchmark file)."""
    *_, (prev_date, _, contiguous) = pytest_bench("pytest-bench-attention")     # the previous stage's kernels
    decode, prefill = ("test_decode_attention", ("batch_size", "cached_positions")), \
        ("test_prefill_attention", ("prompt_tokens",))
    lines = []
    for date, gpu, b in pytest_bench("pytest-bench-paged-attention"):
        sizes = sorted({x["extra_info"]["block_size"] for x in b.values()})
        lines += [f"Measured {date} on {gpu}, GPU time per layer of the 1B (`bench_attention.py`: events around 20 "
                  "launches queued while a spin kernel held the GPU, median of 5 rounds; each sequence's blocks at "
                  f"shuffled places of the pool; the contiguous kernels are the previous stage's, {prev_date}, on "
                  "another machine; the floor reads the K/V once at the copy bandwidth measured in the same run):",
                  "", "| attention | splits | contiguous | " + " | ".join(f"blocks of {n}" for n in sizes)
                  + f" | blocks of {BLOCK_SIZE}: times the floor; achieved |", "|" + " --- |" * (len(sizes) + 4)]
        old = _by_shape(contiguous, *decode)
        for (rows, positions), e in _by_shape(b, *decode).items():
            ours = e[BLOCK_SIZE]
            lines.append(f"| decode, {rows} row{'s' * (rows > 1)} x {positions:,} positions | {ours['n_splits']} | "
                         f"{old[rows, positions][None]['us_per_layer']:.1f} us | "
                         + " | ".join(f"{e[n]['us_per_layer']:.1f} us" for n in sizes)
                         + f" | {ours['times_floor']:.2f}x; {ours['achieved_gb_per_s']:,.0f} GB/s |")
        old = _by_shape(contiguous, *prefill)
        for (tokens,), e in _by_shape(b, *prefill).items():
            lines.append(f"| prefill, {tokens:,} tokens | - | {old[tokens,][None]['ms_per_layer']:.3f} ms | "
                         + " | ".join(f"{e[n]['ms_per_layer']:.3f} ms" for n in sizes)
                         + f" | {e[BLOCK_SIZE]['tflop_per_s']:.0f} TFLOP/s |")
        lines.append("")
    return "\n".join(lines).rstrip()


def ample_memory() -> str:
    """This stage against the previous one, each engine sizing its own KV cache (no --kv-cache-gib): the newest
    committed harness run of exactly those two engines, for each workload. The ratio is this stage's speed
    against the previous one's: above 1x it is faster, whichever way the figure points."""
    figures = [("latency", "ms per decode step", "ms_per_decode_step", True),
               *(("batch", f"output tok/s, B = {n}", f"output_tok_per_s_at_B{n}", False) for n in (1, 8, 32, 64)),
               ("ragged", "output tok/s", "output_tok_per_s", False),
               ("ragged", "ms per decode step", "ms_per_decode_step", True)]
    runs = {}
    for path in sorted(RESULTS.glob("*.json")):          # named GPU_date_workload-..._time: the newest comes last
        r = json.loads(path.read_text())
        if (isinstance(r.get("workload"), dict) and list(r.get("stages", ())) == [PREVIOUS, HERE.name]
                and not r.get("kv_cache_gib")):
            runs[r["workload"]["name"]] = r
    first, this, prev = runs["latency"], HERE.name[:7], PREVIOUS[:7]                  # "stageNN"
    rows = [f"Measured {first['date']} on {first['environment']['gpu']}, one harness run per workload "
            f"(`python -m common.bench --stages {prev[5:]},{this[5:]} --workload W`, medians of "
            f"{first['repeats']} runs (min-max)); the floor of a batch-1 step reads the weights once at the copy "
            "bandwidth measured in the same run:", "",
            f"| workload | figure | `{PREVIOUS}` | `{HERE.name}` | {this}'s speed against {prev} |", "|" + " --- |" * 5]
    for workload, label, key, lower_is_better in figures:
        r = runs[workload]
        (_, a), (_, b) = r["stages"].items()
        fmt = "{:.2f}" if lower_is_better else "{:,.0f}"
        cells = [f"{fmt.format(s[key])} ({'-'.join(fmt.format(x) for x in s['spread'][key])})" for s in (a, b)]
        if workload == "latency":
            label += f" (floor {b['weight_bytes'] / r['environment']['copy_bandwidth_gb_per_s'] / 1e6:.2f} ms)"
        ratio = a[key] / b[key] if lower_is_better else b[key] / a[key]
        rows.append(f"| `{workload}` | {label} | {cells[0]} | {cells[1]} | {ratio:.2f}x |")
    return "\n".join(rows)


GENERATORS = {"worked-example": worked_example, "fragmentation": fragmentation, "paged-kernels": paged_kernels,
              "ample-memory": ample_memory, "ladder-pair": lambda: ladders.pair(PREVIOUS, HERE.name)}
