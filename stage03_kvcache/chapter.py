"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

from common import results
from common.readme import RESULTS, split_table


def kvcache_split() -> str:
    return split_table("pytest-bench-kvcache", "cache_length", "cached positions")


def latency_runs() -> str:
    """`latency` (a 128-token prompt, 256 new tokens, batch 1) in every committed harness run that had this stage,
    each engine of the run beside it; the floor reads the weights once at the copy bandwidth measured in that run."""
    rows = ["| run | engine | ms per decode step | floor | time to first token | output tok/s |",
            "| --- | --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("*_latency-*.json")):
        r = results.load(path)
        if __package__ not in r["stages"] or r.get("kv_cache_gib"):
            continue
        bandwidth = r["environment"]["copy_bandwidth_gb_per_s"]
        for name, s in r["stages"].items():
            rows.append(f"| {r['date']}, `{path.stem.split('_', 2)[2]}` | `{name}` | {s['ms_per_decode_step']:.2f} | "
                        f"{s['weight_bytes'] / bandwidth / 1e6:.2f} ms | {s['ttft_ms']:.2f} ms | "
                        f"{s['output_tok_per_s']:.1f} |")
    return "\n".join(rows)


GENERATORS = {"kvcache-split": kvcache_split, "latency-runs": latency_runs}
