"""A stage beside the one before it in the ladder runs, for a chapter whose own tables come from a run of the two.

A ladder run (`python -m common.bench --ladder --workload W`) has every stage and the baselines of a workload in one
run on one machine, each engine in its own process; the front page's table is drawn from the newest of them
(common.course.report). A chapter that measured its stage against the previous one in a run of the pair shows
the two again as the newest complete ladders show them, in the front page's columns, so that a reader can set the
chapter's figures beside the README's:

    newest(engines) -> {workload: (file name, result)}  each workload's newest complete ladder run holding `engines`
    pair(previous, stage) -> str                         the two engines in those runs, one column a figure, the ratio

The load column is left out: the loader is stage01's subject, and a load's spread between processes (10-14% in
one run) is larger than any later stage's change to it.
"""
from __future__ import annotations

from common.course import results
from common.course.report import COLUMNS, RESULTS

LOWER_IS_BETTER = ("ms_", "ttft_")      # figure keys where less is faster


def newest(engines) -> dict[str, tuple[str, dict]]:
    """workload -> (file name, result) of its newest complete ladder run in which every engine of `engines` ran; a
    ladder at one KV cache memory for every engine counts as workload "NAME-kv", as on the front page."""
    found = {}
    for path in results.committed(RESULTS):
        r = results.load(path)
        if not (r.get("ladder") and isinstance(r.get("workload"), dict)) or r.get("complete") is False:
            continue
        ran = {e for e, s in r["stages"].items() if "skipped" not in s}
        if not set(engines) <= ran:
            continue
        workload = r["workload"]["name"] + ("-kv" if r.get("kv_cache_gib") else "")
        when = (r["date"], r.get("time", ""), path.name)
        if workload not in found or when > found[workload][0]:
            found[workload] = (when, path.name, r)
    return {w: (name, r) for w, (_, name, r) in found.items()}


def _cell(s: dict, key: str, fmt: str) -> str:
    lo, hi = s.get("spread", {}).get(key, (s[key], s[key]))
    return fmt.format(s[key]) + (f" ({fmt.format(lo)}-{fmt.format(hi)})" if fmt.format(lo) != fmt.format(hi) else "")


def pair(previous: str, stage: str) -> str:
    """The two engines in each workload's newest complete ladder run that holds both: a column a figure of the
    front page's (less load), the ratio of stage to previous (above 1x: this stage is the faster), and the runs."""
    runs = newest((previous, stage))
    cols = [(title, w, key, fmt) for title, w, key, fmt in COLUMNS if w in runs and w != "load"
            and all(key in runs[w][1]["stages"][e] for e in (previous, stage))]
    if not cols:
        return (f"No complete ladder run holds `{previous}` and `{stage}` yet: `python -m common.bench --ladder "
                "--workload W` runs one (every stage and the baselines; `bash scripts/gpu_check.sh LOGS ladder-W`).")
    short = [e[:7] for e in (previous, stage)]
    lines = ["| engine | " + " | ".join(title for title, *_ in cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    lines += [f"| `{e}` | " + " | ".join(_cell(runs[w][1]["stages"][e], key, fmt) for _, w, key, fmt in cols) + " |"
              for e in (previous, stage)]
    ratios = []
    for _, w, key, _ in cols:
        a, b = (runs[w][1]["stages"][e][key] for e in (previous, stage))
        ratios.append(f"{(a / b if key.startswith(LOWER_IS_BETTER) else b / a):.2f}x")
    lines.append(f"| {short[1]} against {short[0]} (above 1x: {short[1]} faster) | " + " | ".join(ratios) + " |")
    by_machine: dict[tuple[str, str], list[str]] = {}
    for w in dict.fromkeys(w for _, w, _, _ in cols):
        name, r = runs[w]
        by_machine.setdefault((r["environment"]["gpu"], r["date"]), []).append(f"`{name.split('_', 2)[2][:-5]}`")
    said = "; ".join(f"{gpu}, {date}, " + ", ".join(names) for (gpu, date), names in by_machine.items())
    if "latency" in runs:
        r = runs["latency"][1]
        floor = r["stages"][stage]["weight_bytes"] / r["environment"]["copy_bandwidth_gb_per_s"] / 1e6
        said += (f"; the batch-1 floor of its `latency` run (the weights read once at the run's copy bandwidth): "
                 f"{floor:.2f} ms")
    lines += ["", "From each workload's newest complete ladder run holding both (`python -m common.bench --ladder`: "
              "every stage and the baselines in one run, each engine in its own process; medians of its repeats, "
              f"min-max), in `benchmarks/results/`: {said}."]
    return "\n".join(lines)
