"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

from common.course import results
from common.course.readme import RESULTS, split_table


def kvcache_split() -> str:
    return split_table("pytest-bench-kvcache", "cache_length", "cached positions")


def latency_runs() -> str:
    """`latency` (a 128-token prompt, 256 new tokens, batch 1): one row per committed harness run that had this
    stage, the ms per decode step of each engine it ran, and the floor (the weights read once at the copy
    bandwidth measured in that run)."""
    runs = [(path.stem.split("_", 2)[2], results.load(path))
            for path in sorted(RESULTS.glob("*_latency-*.json"), key=lambda p: p.name.split("_")[1:])]   # by date
    runs = [(name, r) for name, r in runs if __package__ in r["stages"] and not r.get("kv_cache_gib")]
    seen = list(dict.fromkeys(e for _, r in runs for e in r["stages"]))
    engines = sorted(e for e in seen if e.startswith("stage")) + [e for e in seen if not e.startswith("stage")]
    rows = ["| run | floor | " + " | ".join(f"`{e}`" for e in engines) + " |", "|" + " --- |" * (len(engines) + 2)]
    for name, r in runs:
        floor = next(iter(r["stages"].values()))["weight_bytes"] / r["environment"]["copy_bandwidth_gb_per_s"] / 1e6
        cells = [f"{r['stages'][e]['ms_per_decode_step']:.2f}" if e in r["stages"] else "-" for e in engines]
        rows.append(f"| {r['date']}, {r['environment']['gpu']}, `{name}` | {floor:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


GENERATORS = {"kvcache-split": kvcache_split, "latency-runs": latency_runs}
