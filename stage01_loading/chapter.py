"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

import json

from common.course.readme import RESULTS


def load_results() -> str:
    """Every committed load result of this stage (harness JSON and pytest-benchmark JSON)."""
    rows = ["| date | GPU | measured by | load to GPU, GB/s | plain read of the same bytes, GB/s |",
            "| --- | --- | --- | --- | --- |"]
    for path in sorted(RESULTS.glob("*_load-*.json"), key=lambda p: p.name.split("_")[1:]):   # by date, any GPU
        r = json.loads(path.read_text())
        s = r["stages"][__package__]
        procs = r["raw"][__package__]           # one entry a process: its runs (older files: one figure each)
        loads = sum(len(p.get("runs", [p])) for p in procs)
        how = (f"{len(procs)} processes" if loads == len(procs) else
               f"{loads} loads in " + ("one process" if len(procs) == 1 else f"{len(procs)} processes"))
        rows.append(f"| {r['date']} | {r['environment']['gpu']} | `common.bench` (median of {how}) | "
                    f"{s['load_gb_per_s']:.2f} | {s['plain_read_gb_per_s']:.2f} |")
    for path in sorted(RESULTS.glob("*_pytest-bench-load.json")):
        r = json.loads(path.read_text())
        read = next(b for b in r["benchmarks"] if b["name"] == "test_plain_read")
        gpu = path.name.split("_")[0].replace("-", " ")
        for load in (b for b in r["benchmarks"] if b["name"].startswith("test_load_to_gpu")):
            variant = load["name"].partition("[")[2].rstrip("]") or "default"
            gbps = [b["extra_info"]["bytes"] / b["stats"]["median"] / 1e9 for b in (load, read)]
            rows.append(f"| {r['datetime'][:10]} | {gpu} | `bench_load.py` {variant} (median of "
                        f"{load['stats']['rounds']}) | {gbps[0]:.2f} | {gbps[1]:.2f} |")
    return "\n".join(rows)


GENERATORS = {"load-results": load_results}
