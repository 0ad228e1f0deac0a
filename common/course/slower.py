"""Where a stage reads slower than the one before it in a column of the front page's table, and why.

A ladder shows each stage beside the one before it, so a reader who sees a stage slower asks why. Within 2% of the
stage before, or where the two engines' spreads (min-max over their runs) overlap, the run cannot tell them apart:
the table says so in one line. Beyond that a sentence is owed: WHY holds it, keyed by the engine and the figure,
with the run it was written for (the result file's GPU and day), and `python -m common.report` fails
(tests/test_report.py) on a slower cell whose sentence is missing or was written for another run, so a new run
cannot reach the README with a loss unexplained or a sentence quoting the last run's figures. The sentences say
what the run and the chapters show; where nothing shows the cause yet, they say that.
"""
from __future__ import annotations

LEVEL = 0.02     # a stage within 2% of the one before reads level with it (the ladder's own noise between processes)
H100_1208 = "NVIDIA-H100-80GB-HBM3_2026-12-08"      # the ladders the sentences below were written for

WHY = {
    ("stage03_kvcache", "ttft_ms"): (H100_1208,
        "its prefill also writes every prompt position's K and V into the cache, which stage02's forward, recomputing "
        "every step, never keeps: the likely cost of the 0.24 ms on a 128-token prompt, not profiled"),
    ("stage10_fused_kernels", "ttft_ms"): (H100_1208,
        "not explained yet: stage11, with stage10's prefill code, is level with stage09 in the same run, and stage10 is"
        " the first engine of the run to time its GEMM choices (gemm_timings.py keeps them for the engines after it); a"
        " profile of its first measured prompt is owed"),
    ("stage05_continuous_batch", "output_tok_per_s_at_B64"): (H100_1208,
        "`batch`'s requests all have one length, so continuous batching has no finished row to refill, and its "
        "scheduler's host work each step (plan, pack, check stops) is what stage04's static batch does not pay"),
    ("stage05_continuous_batch", "output_tok_per_s_at_B256"): (H100_1208,
        "as at B = 64: equal lengths leave continuous batching nothing to gain, and its scheduler's host work each step"
        " shows more at 256 rows"),
    ("stage07_paged_attention", "output_tok_per_s_at_B64"): (H100_1208,
        "its decode attention reads each sequence's keys through the block table, and its eager loop plans per row "
        "(chapter 7's caveats); the run's spread is wide (13,765-18,634) and at B = 256 it is ahead of stage06"),
    ("stage07_paged_attention", "prefill_tok_per_s_at_2048"): (H100_1208,
        "prefill through the block tables: each copy of a key tile waits on a table read (7-11% slower in chapter 7's "
        "kernel runs)"),
    ("stage07_paged_attention", "prefill_tok_per_s_at_32768"): (H100_1208,
        "prefill through the block tables, as at 2,048 tokens"),
    ("stage07_paged_attention", "load_gb_per_s"): (H100_1208,
        "the same loader as stage06 (weights.py unchanged); an engine's three loads spread 10-14% in this run, which "
        "makes a 10% step between two processes noise of the host's disk cache and memory, not code"),
}


def slower_cells(results: dict, stages: list[str], columns: list[tuple]) -> list[tuple]:
    """(engine, the stage before, column title, figure key, ratio, level, its result file) for every cell of a
    stage that reads slower than the stage before it in the same column; ratio > 1 means slower by that factor;
    level: within LEVEL, or the two spreads overlap."""
    out = []
    for title, workload, key, _ in columns:
        lower_is_better = key.startswith("ms_") or key == "ttft_ms"
        prev = None
        for e in stages:
            s, names = results.get(workload, {}).get(e, (None, []))
            if not s or key not in s:
                continue
            if prev is not None:
                p, ps = prev
                a, b = ps[key], s[key]
                ratio = b / a if lower_is_better else a / b
                if ratio > 1:
                    pa, pb = ps.get("spread", {}).get(key, (a, a)), s.get("spread", {}).get(key, (b, b))
                    overlap = pb[0] <= pa[1] and pa[0] <= pb[1]
                    out.append((e, p, title, key, ratio, ratio <= 1 + LEVEL or overlap, names[-1]))
            prev = (e, s)
    return out


def lines(results: dict, stages: list[str], columns: list[tuple]) -> tuple[list[str], list[str]]:
    """The table's sentences on its slower cells, and the cells that lack one (engine: figure)."""
    cells = slower_cells(results, stages, columns)
    level = [f"{e[:7]} in \"{title}\"" for e, _, title, key, _, lv, _ in cells if lv]
    out = [f"Where a stage reads slower than the one before it: {len(cells)} cells."]
    if level:
        out.append(f"- Level within this run's noise (within {LEVEL:.0%}, or the two spreads overlap): "
                   + "; ".join(level) + ".")
    missing = []
    for e, p, title, key, ratio, lv, source in cells:
        if lv:
            continue
        run, why = WHY.get((e, key), ("", None))
        if why is None or not source.startswith(run):
            why = None
            missing.append(f"{e}: {key} ({source})")
        out.append(f"- `{e}`, {title}: {ratio:.2f}x slower than `{p}`: " + (why or "**not explained**") + ".")
    return out, missing
