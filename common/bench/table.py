"""The harness's results as a table: runs merged per engine, medians and spreads, the speed-up of each headline
figure against the engine above, and the spread warnings.
"""
from __future__ import annotations

import statistics

from common.bench.workloads import Workload

SPREAD_WARNING = 0.10   # (max - min) / median of a headline figure above this is called out


def merge(results: list[dict]) -> dict:
    """Several workers' results for one engine (processes, or `long`'s lengths) -> one: runs concatenated
    per figure, info merged, unsupported lengths kept by name."""
    out: dict = {"runs": [], "info": {}}
    for r in results:
        if "unsupported" in r:
            key = "unsupported" + (f"_at_{r['prompt_tokens']}" if "prompt_tokens" in r else "")
            out["info"][key] = r["unsupported"]
            continue
        out["runs"] += r["runs"]
        out["info"] |= r.get("info", {})
    return out


def summarise(results: dict[str, dict]) -> dict[str, dict]:
    """Per engine: the median of every figure over its runs, `spread` {figure: [min, max]}, the number of runs,
    and its info (warm-up time, memory, unsupported lengths)."""
    out = {}
    for name, r in results.items():
        if "skipped" in r:
            out[name] = {"skipped": r["skipped"]}
            continue
        s: dict = {k: v for k, v in r["info"].items()}
        keys = dict.fromkeys(k for run in r["runs"] for k, v in run.items() if isinstance(v, (int, float)))
        for k in keys:
            vals = [run[k] for run in r["runs"] if k in run]
            s[k] = statistics.median(vals)
            s.setdefault("spread", {})[k] = [min(vals), max(vals)]
        s["repeats"] = max([len([run for run in r["runs"] if k in run]) for k in keys] or [0])   # runs per figure
        if not r["runs"] and "unsupported" not in s:
            s["unsupported"] = "; ".join(f"{k[len('unsupported_at_'):]} tokens: {v}" for k, v in r["info"].items()
                                         if k.startswith("unsupported_at_"))
        out[name] = s
    return out


def spread_warnings(summary: dict[str, dict], workload: Workload) -> list[str]:
    notes = []
    for name, s in summary.items():
        for k in workload.headline:
            if k in s.get("spread", {}) and s[k]:
                lo, hi = s["spread"][k]
                if (hi - lo) / s[k] > SPREAD_WARNING:
                    notes.append(f"{name} {k}: spread {100 * (hi - lo) / s[k]:.0f}% over {s['repeats']} runs "
                                 f"(min {fmt(lo)}, max {fmt(hi)})")
    return notes


def fmt(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}" if abs(x) >= 0.1 \
        else f"{x:.3f}"


def speedup(workload: Workload, key: str, this: dict, prev: dict | None) -> str:
    """This engine against the previous one on a headline figure: >1 is better (faster or more tok/s)."""
    if not prev or key not in prev or key not in this or not this[key] or not prev[key]:
        return "-"
    r = prev[key] / this[key] if workload.lower_is_better else this[key] / prev[key]
    return f"{r:.2f}x"


def format_table(summary: dict[str, dict], workload: Workload) -> str:
    """Medians (min-max) of the headline and other figures, and the speed-up of each headline figure against
    the engine in the row above."""
    keys = [k for k in (*workload.headline, *workload.columns)
            if any(k in s or f"unsupported_at_{k.rsplit('_', 1)[-1]}" in s for s in summary.values())]
    short = {k: k.replace("output_tok_per_s_at_", "tok/s ").replace("prefill_tok_per_s_at_", "prefill tok/s ")
             .replace("decode_tok_per_s_at_", "decode tok/s ").replace("memory_beyond_weights_gb_at_", "GB beyond "
             "weights ") for k in keys}
    heads = [k for k in workload.headline if k in keys]
    if not keys:
        return "| engine | result |\n| --- | --- |\n" + "\n".join(
            f"| {name} | {s.get('skipped') or 'unsupported: ' + s.get('unsupported', '?')} |"
            for name, s in summary.items())
    lines = ["| engine | " + " | ".join(short[k] for k in keys) + " | "
             + " | ".join(f"speed-up: {short[k]}" for k in heads) + " |",
             "|" + " --- |" * (1 + len(keys) + len(heads))]
    prev = None
    for name, s in summary.items():
        if "skipped" in s or ("unsupported" in s and not s.get("repeats")):
            lines.append(f"| {name} | {s.get('skipped') or 'unsupported: ' + s['unsupported']} |")
            continue
        cells = []
        for k in keys:
            if k not in s:
                cells.append("unsupported" if f"unsupported_at_{k.rsplit('_', 1)[-1]}" in s else "n/a")
            elif k in s.get("spread", {}) and s["repeats"] > 1:
                lo, hi = s["spread"][k]
                cells.append(f"{fmt(s[k])} ({fmt(lo)}-{fmt(hi)})")
            else:
                cells.append(fmt(s[k]))
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + " | ".join(speedup(workload, k, s, prev) for k in heads) + " |")
        prev = s
    return "\n".join(lines)
