"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones. Results are read through common.course.results.load, which shows a result of the eight-stage course
(dated before the split) that names this stage under the tree that really ran it.

  launch-gaps       the previous stage's committed batch-1 profile: the step's wall time, the GPU's span, the
                    kernels' busy time, and the gaps between them that the graphs are for
  graph-ladder      which captured graph a decode step of R rows replays, and its padding rows (graphs.py)
  measured-profile  this stage's profiles (`common.profile`), with and without its graphs, beside the previous stage
  measured-runs     this stage's harness runs (`latency`, `batch`, `ragged`): the newest of each workload
  step-split        this stage's bench_batch.py::test_decode_step_split: a step's GPU and host time, kernel by
                    kernel and replayed
  pre-split         the same idea measured on the pre-split tree before its other ideas came in: context only
A generator whose results are not committed yet says so, with the command that measures them.
"""
from __future__ import annotations

from pathlib import Path

from common.course import results
from common.course.readme import RESULTS, pytest_bench
from common.bench.workloads import BATCH_SIZES

from .cache import MAX_NUM_SEQS
from .graphs import capture_sizes, graph_size

HERE = Path(__file__).resolve().parent
STAGES = sorted(p.name for p in HERE.parent.glob("stage[0-9][0-9]_*"))
PREVIOUS = STAGES[STAGES.index(HERE.name) - 1]
NN, PREV = HERE.name[5:7], PREVIOUS[5:7]
LATER = ",".join(s[5:7] for s in STAGES if s > HERE.name)
ROWS = (1, 2, 3, 5, 8, 9, 24, 33, 64, 65, 100, 129, 200, 256)
# The pre-split tree of 2026-12-04 14:30 UTC (benchmarks/logs/2026-12-04-H200-stage08-profiles-before-kernel-fixes/):
# its graph stage then held the decode graphs alone, over the previous stage's kernels, no asynchronous scheduling
PRE_SPLIT = {"profiles": ("NVIDIA-H200_2026-12-04_profile-07-b1_143202.json",
                          "NVIDIA-H200_2026-12-04_profile-08-b1-eager_143158.json",
                          "NVIDIA-H200_2026-12-04_profile-08-b1_143156.json"),
             "latency": "NVIDIA-H200_2026-12-04_latency-hf-compile-07-08_143407.json"}


def _not_measured(what: str, parts: str, env: str = "") -> str:
    return (f"{what}: not measured yet. `{env + ' ' if env else ''}bash scripts/gpu_check.sh LOGS {parts}` measures "
            "it on a GPU, writing its JSON files into the folder LOGS; copied into `benchmarks/results/` and "
            "committed, they fill this table.")


def _profiles(stage: str) -> list[dict]:
    """Every committed profile of `stage` (under today's names), oldest first."""
    runs = [results.load(p) for p in RESULTS.glob("*_profile-*.json")]
    return sorted((p for p in runs if p["stage"] == stage), key=lambda p: p["date"])


def _gaps(p: dict) -> float:
    """The GPU idle inside the span: the profile's own median where it records one, span - busy before that."""
    return p.get("gaps_us", p["span_us"] - p["busy_us"])


def _profile_table(runs: list[tuple[str, dict]]) -> str:
    """(column label, profile) side by side: where a decode step's time goes, in us (medians over its steps)."""
    first = runs[0][1]
    rows = [("the step's wall time, through `step()`", lambda p: p["wall_us"]),
            ("the GPU's span, first kernel start to last kernel end", lambda p: p["span_us"]),
            ("kernels busy, the sum of their times", lambda p: p["busy_us"]),
            ("**the GPU idle between kernels**, inside the span", _gaps),
            ("the host alone, outside the span (wall - span)", lambda p: p["wall_us"] - p["span_us"]),
            ("floor: weights and activations read once", lambda p: p["floor_us"])]
    lines = [f"Batch {first['batch']}, {first['cache_length']} prompt tokens, the 1B preset, {first['gpu']} "
             f"(`python -m common.profile`: CUPTI records every kernel; us a decode step, the median of "
             f"{first['steps']} steps):", "",
             "| us a decode step | " + " | ".join(label for label, _ in runs) + " |", "|" + " --- |" * (len(runs) + 1)]
    lines += [f"| {name} | " + " | ".join(f"{get(p):,.0f}" for _, p in runs) + " |" for name, get in rows]
    lines.append("| kernels a step | " + " | ".join(f"{p['kernels_per_step']:.0f}" for _, p in runs) + " |")
    return "\n".join(lines)


def _label(p: dict) -> str:
    how = "eager" if p["enforce_eager"] or p["stage"] == PREVIOUS else "graphs"
    return f"`{p['stage']}` {how}, {p['date'][:16].replace('T', ' ')}"


def launch_gaps() -> str:
    newest = [p for p in _profiles(PREVIOUS) if p["batch"] == 1][-1]
    return _profile_table([(_label(newest), newest)])


def graph_ladder() -> str:
    sizes = capture_sizes(MAX_NUM_SEQS)
    lines = [f"Captured sizes at max_num_seqs={MAX_NUM_SEQS} (the default): {', '.join(map(str, sizes))}.", "",
             "| decode rows | graph replayed | padding rows | share of the replay's rows that are padding |",
             "| --- | --- | --- | --- |"]
    for r in ROWS:
        size = graph_size(r, sizes)
        lines.append(f"| {r} | {size} | {size - r} | {(size - r) / size:.0%} |")
    return "\n".join(lines)


def measured_profile() -> str:
    """This stage's newest profile with its graphs and without (enforce_eager) at each batch size, beside the
    previous stage's newest at the same batch."""
    mine = [p for p in _profiles(HERE.name) if p["date"][:10] >= results.SPLIT_DATE]
    if not mine:
        return _not_measured("This stage's profile", "profile", f'PROFILE_RUNS="{PREV}:1 {NN}:1:eager {NN}:1"')
    tables = []
    for batch in sorted({p["batch"] for p in mine}):
        runs = [p for p in _profiles(PREVIOUS) if p["batch"] == batch][-1:]
        for eager in (True, False):                  # enforce_eager first, then with the graphs
            runs += [p for p in mine if p["batch"] == batch and p["enforce_eager"] == eager][-1:]
        tables.append(_profile_table([(_label(p), p) for p in runs]))
    return "\n\n".join(tables)


FIGURES = {"latency": [("ms per decode step", "ms_per_decode_step", "{:.2f}", True),
                       ("time to first token, ms", "ttft_ms", "{:.2f}", True)],
           "batch": [(f"output tok/s, B = {n}", f"output_tok_per_s_at_B{n}", "{:,.0f}", False) for n in BATCH_SIZES],
           "ragged": [("output tok/s", "output_tok_per_s", "{:,.0f}", False),
                      ("ms per decode step", "ms_per_decode_step", "{:.2f}", True)]}
ENGINES = {"latency": f"hf-compile,{PREV},{NN},{LATER}", "batch": f"{PREV},{NN}", "ragged": f"{PREV},{NN}"}


def _harness_table(workload: str, r: dict) -> str:
    engines = list(r["stages"].items())
    lines = [f"`{workload}`, measured {r['date']} on {r['environment']['gpu']} (`python -m common.bench --workload "
             f"{workload}`, medians of {r['repeats']} runs (min-max), each engine in its own process):", "",
             "| figure | " + " | ".join(f"`{name}`" for name, _ in engines) + f" | {NN}'s speed against {PREV} |",
             "|" + " --- |" * (len(engines) + 2)]
    for label, key, fmt, lower_is_better in FIGURES[workload]:
        cells = [f"{fmt.format(s[key])} ({'-'.join(fmt.format(x) for x in s['spread'][key])})" if key in s else "-"
                 for _, s in engines]
        a, b = r["stages"].get(PREVIOUS, {}).get(key), r["stages"][HERE.name].get(key)
        ratio = "-" if not (a and b) else f"{a / b if lower_is_better else b / a:.2f}x"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    if workload == "latency":
        weights = next(s["weight_bytes"] for _, s in engines if "weight_bytes" in s)   # (a skipped engine has none)
        floor = weights / r["environment"]["copy_bandwidth_gb_per_s"] / 1e6
        lines.append(f"\nThe floor of a batch-1 step, the weights read once at the copy bandwidth of the run: "
                     f"{floor:.2f} ms.")
    return "\n".join(lines)


def measured_runs() -> str:
    """The newest harness run of each workload that has this stage in it (at each engine's own KV cache size)."""
    out = []
    for workload in FIGURES:
        runs = [results.load(p) for p in RESULTS.glob(f"*_{workload}-*.json")]
        runs = sorted((r for r in runs if HERE.name in r["stages"] and not r.get("kv_cache_gib")
                       and r["date"] >= results.SPLIT_DATE), key=lambda r: (r["date"], r.get("time", "")))
        out.append(_harness_table(workload, runs[-1]) if runs else _not_measured(
            f"`{workload}`", workload, f"{workload.upper()}_STAGES={ENGINES[workload]}"))
    return "\n\n".join(out)


def step_split() -> str:
    keys = ("wall_ms", "gpu_ms", "host_queue_ms", "graph_gpu_ms", "graph_host_queue_ms", "host_loop_ms",
            "bandwidth_floor_ms")
    lines = []
    for date, gpu, b in pytest_bench(f"pytest-bench-step-{NN}")[-1:]:     # the newest run
        cases = sorted((n for n in b if n.startswith("test_decode_step_split")),
                       key=lambda n: b[n]["extra_info"]["batch_size"])
        if date < results.SPLIT_DATE or not cases:
            continue
        lines += [f"Measured {date} on {gpu} (`bench_batch.py::test_decode_step_split`, 256 cached positions a "
                  "sequence; the wall time the median of 20 `step()` calls; GPU and queueing times from events, "
                  "the GPU held by a spin kernel while the host queues):", "",
                  "| B | wall, through `step()` | GPU, kernel by kernel | host to queue them | GPU, replayed | host "
                  "to queue the replay (one graph launch; its inputs copied before) | the loop's host time | floor |", "|" + " --- |" * 8]
        lines += [f"| {b[n]['extra_info']['batch_size']} | "
                  + " | ".join(f"{b[n]['extra_info'][k]:.2f} ms" for k in keys) + " |" for n in cases]
    return "\n".join(lines) or _not_measured("The decode step's split", f"bench{NN}")


def pre_split() -> str:
    """The pre-split tree's first H200 runs (PRE_SPLIT): its profiles with and without graphs beside the previous
    stage's, and the latency run of the same minutes. common.course.results.load shows that tree as the stage it
    became."""
    profiles = [results.load(RESULTS / name) for name in PRE_SPLIT["profiles"]]
    labels = [_label(profiles[0]), "pre-split tree, enforce_eager", "pre-split tree, graphs"]
    r = results.load(RESULTS / PRE_SPLIT["latency"])
    lines = [_profile_table(list(zip(labels, profiles))), "",
             f"`latency` of the same tree, {r['date']} {r['time'][:5]} (medians of {r['repeats']} runs, min-max):", "",
             "| engine | ms per decode step | time to first token |", "| --- | --- | --- |"]
    for name, s in r["stages"].items():
        shown = "the pre-split tree (shown as `" + name + "`)" if name not in (PREVIOUS, "hf-compile") else f"`{name}`"
        lo, hi = s["spread"]["ms_per_decode_step"]
        lines.append(f"| {shown} | {s['ms_per_decode_step']:.2f} ({lo:.2f}-{hi:.2f}) | {s['ttft_ms']:.2f} ms |")
    return "\n".join(lines)


GENERATORS = {"launch-gaps": launch_gaps, "graph-ladder": graph_ladder, "measured-profile": measured_profile,
              "measured-runs": measured_runs, "step-split": step_split, "pre-split": pre_split}
