"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

Every figure is read through common.course.results.load. A result dated before the course's split
(common.course.results.SPLIT_DATE) ran the tree this stage was cut from (the eight-stage course's last stage, at some
point of its day); the tables label such a column "before the split" and name the log folder that holds its copy
and says which tree it ran. A table whose figures would come from this stage's own tree says, in generated text,
whether that tree has been measured yet and which command measures it.

  kernel-history   every committed batch-1 profile of this stage's code with graphs on the chapter's GPU (that of
                   this stage's first profile, where its story was measured): one column a run (first, the previous
                   stage's newest on that GPU, where there is one), each kernel group's time on the critical path
                   against its floor
  profile-pair     the newest run that profiled this stage and the previous one at batch 1 on one GPU: group by
                   group, each against its floor
  gemv-kinds       bench_gemv.py's newest full run on the chapter's GPU: every gemv.cu kind alone at the 1B's layer
                   shapes, its floor
  gemv-folded      bench_gemv.py's newest run of the kinds with a norm, with g and with g folded into W
  gemv-boundaries  bench_gemv.py's newest one-launch run on the chapter's GPU: a kind over a GEMM's 16 layers in 16
                   launches and in one, the difference what a kernel boundary costs
  step-split       bench_batch.py's test_decode_step_split: a decode step's wall time, its replay's GPU time,
                   the loop's host time and the floor
  harness          the newest harness runs (not the ladders) of `latency`, `batch` and `ragged` that hold this
                   stage, on the GPU of the newest `latency` run: every engine of each run, medians of its repeats
                   with their spread
  ladder-pair      the previous stage and this one in each workload's newest complete ladder run (common.course.ladders)
"""
from __future__ import annotations

import functools
from datetime import datetime, timedelta
from pathlib import Path

from common.course import ladders, results
from common.bench.profile import ORDER
from common.course.readme import RESULTS, ROOT

STAGE = Path(__file__).parent.name
PREVIOUS = max(p.name for p in ROOT.glob("stage[0-9][0-9]_*") if p.name < STAGE)
NN, PREV_NN = STAGE[5:7], PREVIOUS[5:7]
LOGS = ROOT / "benchmarks" / "logs"
HARNESS = ("latency", "batch", "ragged")


@functools.cache
def _log_folder(name: str) -> str:
    """The log folder holding a byte-identical copy of the result file `name` (its README says which tree ran it)."""
    data = (RESULTS / name).read_bytes()
    for copy in sorted(LOGS.glob("*/*.json")):
        if copy.stat().st_size == len(data) and copy.read_bytes() == data:
            return f"`benchmarks/logs/{copy.parent.name}/`"
    return "no log folder"


def _before_split(r: dict) -> bool:
    return str(r.get("date") or r.get("datetime"))[:10] < results.SPLIT_DATE


def _loaded(pattern: str) -> list[tuple[str, dict]]:
    """(file name, result with today's names) of every committed result matching `pattern`, oldest first."""
    runs = [(p.name, results.load(p)) for p in RESULTS.glob(pattern)]
    return sorted(runs, key=lambda nr: (str(nr[1].get("date") or nr[1].get("datetime")), nr[1].get("time", "")))


def _not_measured(what: str, command: str) -> str:
    return f"{what}: not measured yet since the split; `{command}` measures it."


# ---------------------------------------------------------------------------------------------------- profiles
def _profiles(batch: int | None = None) -> list[tuple[str, dict]]:
    """This stage's profiles with graphs (results.load names the tree it was cut from as this stage)."""
    return [(n, p) for n, p in _loaded("*_profile-*.json")
            if p["stage"] == STAGE and not p["enforce_eager"] and batch in (None, p["batch"])]


def _cell(g: dict | None) -> str:
    if not g or not g["us"]:
        return "-"
    return f"{g['us']:.1f}" + (f" ({g['us'] / g['floor_us']:.1f}x)" if g["floor_us"] >= 1 else "")


def _totals(runs: list[dict]) -> list[str]:
    """The step's lines under the groups: critical path against the floor, the GPU's span, kernels a step."""
    first = runs[0]
    lines = [f"| **all kernels, on the critical path** | {first['floor_us']:.1f} | "
             + " | ".join(f"{p.get('exposed_us', p['busy_us']):.0f}" for p in runs) + " |"]
    # (a run before exposed_us had no kernel launched early: its busy time is the same sum)
    lines.append("| GPU span, first kernel start to last end | | " + " | ".join(f"{p['span_us']:.0f}" for p in runs)
                 + " |")
    lines.append("| kernels a step | | " + " | ".join(f"{p['kernels_per_step']:.0f}" for p in runs) + " |")
    return lines


def _by_gpu(runs: list, gpu) -> dict[str, list]:
    """`runs` grouped by the GPU that ran each (gpu(run) names it), in the order the GPUs first appear."""
    groups: dict[str, list] = {}
    for run in runs:
        groups.setdefault(gpu(run), []).append(run)
    return groups


def _previous_profiles(gpu: str) -> list[tuple[str, dict]]:
    """The previous stage's batch-1 profiles on `gpu`, oldest first."""
    return [nq for nq in _loaded(f"*_profile-{PREV_NN}-b1_*.json") if nq[1]["stage"] == PREVIOUS and nq[1]["gpu"] == gpu]


def _chapter_gpu() -> str:
    """The GPU of this stage's first batch-1 profile: where the chapter's story was measured."""
    return _profiles(1)[0][1]["gpu"]


def kernel_history() -> str:
    """Every batch-1 profile with graphs on the chapter's GPU (floors and times are the GPU's own; other GPUs'
    runs are profile-pair's or stay in their log folders), a column a run, oldest first, each labelled by its time
    and keyed to its log folder below the table; a group a run does not have (rope and kv_write once fused) is '-'."""
    tables = [_history_table(_previous_profiles(gpu)[-1:] + named)
              for gpu, named in _by_gpu(_profiles(1), lambda np_: np_[1]["gpu"]).items() if gpu == _chapter_gpu()]
    if all(_before_split(p) for _, p in _profiles(1)):
        tables.append(_not_measured(f"`{STAGE}`'s own tree", f"PROFILE_RUNS='{NN}:1 {NN}:64' bash "
                                                            "scripts/gpu_check.sh LOGS profile"))
    return "\n\n".join(tables)


def profile_pair() -> str:
    """The newest run that profiled the previous stage and this one at batch 1 on one GPU (started within ten
    minutes of each other): each kernel group's time against its floor, side by side, and what changed."""
    pairs = [(prev, this) for this in _profiles(1) for prev in _previous_profiles(this[1]["gpu"])
             if abs(_when(this[1]) - _when(prev[1])) <= timedelta(minutes=10)]
    if not pairs:
        return _not_measured(f"`{PREVIOUS}` beside this stage in one run",
                             f"PROFILE_RUNS='{PREV_NN}:1 {NN}:1' bash scripts/gpu_check.sh LOGS profile")
    (n0, p0), (n1, p1) = pairs[-1]
    lines = [f"Batch 1, {p1['cache_length']} cached positions, {p1['gpu']}, {p1['date'][:10]} {p1['date'][11:16]} "
             f"({_log_folder(n1)}): us a decode step on the critical path, the median of {p1['steps']} steps; the floor "
             f"column at this stage's {p1['copy_gb_per_s']:,.0f} GB/s copy bandwidth, each time against its own run's "
             f"floor ({PREV_NN}: {p0['copy_gb_per_s']:,.0f} GB/s):", "",
             f"| kernels | floor | `{PREVIOUS}` | `{STAGE}` | change |", "|" + " --- |" * 5]
    for group in ORDER:
        g0, g1 = p0["groups"].get(group), p1["groups"].get(group)
        if (g0 and g0["us"]) or (g1 and g1["us"]):
            floor = (g1 if g1 and g1["us"] else g0)["floor_us"]
            change = (g1["us"] if g1 else 0.0) - (g0["us"] if g0 else 0.0)
            lines.append(f"| {group} | {floor:.1f} | {_cell(g0)} | {_cell(g1)} | {change:+.1f} |")
    t0, t1 = (p.get("exposed_us", p["busy_us"]) for p in (p0, p1))
    lines.append(f"| **all kernels, on the critical path** | {p1['floor_us']:.1f} | "
                 f"{t0:.0f} ({t0 / p0['floor_us']:.2f}x) | {t1:.0f} ({t1 / p1['floor_us']:.2f}x) | {t1 - t0:+.0f} |")
    lines.append(f"| kernels a step | | {p0['kernels_per_step']:.0f} | {p1['kernels_per_step']:.0f} | |")
    return "\n".join(lines)


def _when(profile: dict) -> datetime:
    return datetime.fromisoformat(profile["date"][:19])


def _through_gemv(p: dict) -> list:
    """The step's GEMMs gemv.cu streamed: the fused ones where the profiled size fused, else the plain ones (older
    profiles recorded only gemv_shapes, which then meant the plain ones)."""
    return ([s for s in p["gemv_shapes"] if s[0] == p["batch"]]
            or [s for s in p.get("plain_shapes", ()) if s[0] == p["batch"]])


def _history_table(named: list[tuple[str, dict]]) -> str:
    runs = [p for _, p in named]
    labels = [(f"`{p['stage']}` " if p["stage"] != STAGE else "") + p["date"][11:16]
              + ("" if _before_split(p) else f", {p['date'][:10]}") for p in runs]
    split = [p for p in runs if _before_split(p)]
    before = (f" A column labelled by its time alone ran the tree before the split, on {split[0]['date'][:10]}, at the "
              "point its log folder (below) describes." if split else "")
    lines = [f"Batch 1, {runs[0]['cache_length']} cached positions, {runs[0]['gpu']}: us a decode step on the critical "
             f"path, the median of {runs[0]['steps']} steps; floors at the copy bandwidth measured in the first "
             f"run.{before}", "",
             "| kernels | floor | " + " | ".join(labels) + " |", "|" + " --- |" * (len(runs) + 2)]
    for group in ORDER:
        ran = [p["groups"][group] for p in runs if p["groups"].get(group, {}).get("us")]
        if ran:
            lines.append(f"| {group} | {ran[0]['floor_us']:.1f} | "
                         + " | ".join(_cell(p["groups"].get(group)) for p in runs) + " |")
    lines += _totals(runs)
    lines.append("| GEMMs through gemv.cu (M x N x K) | | " + " | ".join(
        ", ".join("x".join(map(str, s)) for s in _through_gemv(p)) or "none" if "gemv_shapes" in p
        else "not recorded" for p in runs) + " |")
    lines += ["", "The runs' log folders: " + "; ".join(f"{label} {_log_folder(n)}" for label, (n, _) in
                                                     zip(labels, named)) + "."]
    return "\n".join(lines)


def _gemv_rows(run: dict) -> list[dict]:
    """bench_gemv.py's rows of a run (a run may hold other files' benchmarks too): their extra_info."""
    return [b["extra_info"] for b in run["benchmarks"] if b["name"].startswith("test_gemv")]


def _gpu_of(name: str) -> str:
    """The GPU a pytest-benchmark result ran on, from its file name."""
    return name.split("_")[0].replace("-", " ")


def _caption(name: str, run: dict) -> str:
    gpu = _gpu_of(name)
    return f"on {gpu} by `bench_gemv.py`, {run['datetime'][:10]} {run['datetime'][11:16]} ({_log_folder(name)})"


def gemv_kinds() -> str:
    """bench_gemv.py's newest full run (every kind at M = 1, 2, 4, 8): each gemv.cu kind alone at the 1B's layer
    shapes, 16 launches a pass, us a layer and times its floor; kind against kind at one shape is what a fusion
    adds."""
    def full(run: dict) -> bool:                     # every (GEMM, kind) of 16 launches at M = 1, 2, 4 and 8
        sizes: dict[tuple[str, str], set[int]] = {}
        for e in _gemv_rows(run):
            if e.get("launches", 16) > 1:
                sizes.setdefault((e["gemm"], e["kind"]), set()).add(e["rows"])
        return bool(sizes) and all(m >= {1, 2, 4, 8} for m in sizes.values())

    runs = [nr for nr in _loaded("*_pytest-bench-gemv10.json") if full(nr[1]) and _gpu_of(nr[0]) == _chapter_gpu()]
    if not runs:
        return _not_measured("gemv.cu's kinds alone", "bash scripts/gpu_check.sh LOGS bench10-gemv")
    name, run = runs[-1]
    cells: dict[tuple[str, str], dict[int, dict]] = {}
    for e in _gemv_rows(run):
        if e.get("launches", 16) > 1:
            kind, *how = e["kind"].split(", ")                         # "gemv_norm, g in W": g folded into W
            if not how:                                  # the folded kinds: gemv_folded's table
                cells.setdefault((e["gemm"], f"`{kind}`"), {})[e["rows"]] = e
    sizes = sorted({m for row in cells.values() for m in row})
    lines = [f"us a layer (times its floor) {_caption(name, run)}:", "",
             "| GEMM | kind | floor | " + " | ".join(f"M = {m}" for m in sizes) + " |",
             "|" + " --- |" * (len(sizes) + 3)]
    for (gemm, kind), row in cells.items():
        floor = next(iter(row.values()))["floor_us"]
        lines.append(f"| {gemm} | {kind} | {floor:.1f} | " + " | ".join(
            f"{row[m]['us_per_layer']:.1f} ({row[m]['times_floor']:.1f}x)" if m in row else "-" for m in sizes) + " |")
    return "\n".join(lines)


def gemv_folded() -> str:
    """bench_gemv.py's newest run of the paired kinds (those a fused step launches) twice, g scaled in the stream and
    g folded into W at load time ("g in W"): us a layer at each M."""
    runs = [nr for nr in _loaded("*_pytest-bench-gemv10.json") if any(", " in e["kind"] for e in _gemv_rows(nr[1]))]
    if not runs:
        return _not_measured("the norm's weight folded into W", "bash scripts/gpu_check.sh LOGS bench10-gemv")
    name, run = runs[-1]
    rows = {(e["gemm"], e["kind"], e["rows"]): e for e in _gemv_rows(run) if e.get("launches", 16) > 1}
    sizes = sorted({m for _, _, m in rows})
    lines = [f"us a layer, g in the stream -> g in W {_caption(name, run)}:", "",
             "| GEMM | kind | floor | " + " | ".join(f"M = {m}" for m in sizes) + " |",
             "|" + " --- |" * (len(sizes) + 3)]
    for gemm, kind, _ in dict.fromkeys((g, k.split(", ")[0], 0) for g, k, _ in rows if ", " in k):
        if kind == "gemv_norm":                          # the norm alone: the engine launches the paired kinds
            continue
        cells = []
        for m in sizes:
            plain, folded = rows.get((gemm, kind, m)), rows.get((gemm, f"{kind}, g in W", m))
            cells.append(f"{plain['us_per_layer']:.1f} -> {folded['us_per_layer']:.1f}" if plain and folded else "-")
        floor = next(e["floor_us"] for (g, _, _), e in rows.items() if g == gemm)
        lines.append(f"| {gemm} | `{kind}` | {floor:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gemv_boundaries() -> str:
    """bench_gemv.py's newest run of test_gemv_one_launch: a kind over a GEMM's 16 layers as 16 launches and as one
    launch of the layers stacked, in the same run; the difference is what a kernel boundary costs."""
    runs = [nr for nr in _loaded("*_pytest-bench-gemv10.json")
            if any(e.get("launches") == 1 for e in _gemv_rows(nr[1])) and _gpu_of(nr[0]) == _chapter_gpu()]
    if not runs:
        return _not_measured("a kernel boundary's cost", "bash scripts/gpu_check.sh LOGS bench10-gemv")
    name, run = runs[-1]
    rows = {(e["gemm"], e["kind"], e["rows"], e.get("launches", 16) == 1): e for e in _gemv_rows(run)}
    pairs = list(dict.fromkeys((g, k) for g, k, _, one in rows if one))      # (GEMM, kind) timed in one launch
    sizes = sorted({m for g, k, m, one in rows if one and (g, k, m, False) in rows})
    plain = [g for g, k in pairs if k == "gemv"]
    complete = [m for m in sizes if all((g, "gemv", m, one) in rows for g in plain for one in (False, True))]
    lines = [f"16 layers' weights, us a layer (times its floor) {_caption(name, run)}:", "",
             "| GEMM | kind | floor | " + " | ".join(f"M = {m}: 16 launches | one launch | a boundary" for m in sizes)
             + " |", "|" + " --- |" * (3 + 3 * len(sizes))]
    total = dict.fromkeys(complete, 0.0)               # M -> a layer's boundaries of the plain kind
    for gemm, kind in pairs:
        cells = []
        for m in sizes:
            many, one = rows.get((gemm, kind, m, False)), rows.get((gemm, kind, m, True))
            if many is None or one is None:
                cells += ["-"] * 3
                continue
            cost = many["us_per_layer"] - one["us_per_layer"]
            if kind == "gemv" and m in total:
                total[m] += cost
            cells += [f"{many['us_per_layer']:.1f} ({many['times_floor']:.1f}x)",
                      f"{one['us_per_layer']:.1f} ({one['times_floor']:.1f}x)", f"{cost:.1f}"]
        floor = next(e["floor_us"] for (g, _, _, _), e in rows.items() if g == gemm)
        lines.append(f"| {gemm} | `{kind}` | {floor:.1f} | " + " | ".join(cells) + " |")
    lines += ["", f"A layer's {len(plain)} boundaries of the plain kind: " + ", ".join(
        f"{t:.1f} us at M = {m} ({16 * t:.0f} us a step)" for m, t in total.items()) + "."]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- the step
def step_split() -> str:
    """The decode-step split of this stage's bench_batch.py, its newest run (pytest-bench-step-NN), or until there is
    one, the tree's before the split (its files were named pytest-bench-graphs)."""
    lines = []
    files = _loaded(f"*_pytest-bench-step-{NN}.json")[-1:] or \
        [nr for nr in _loaded("*_pytest-bench-graphs.json") if _before_split(nr[1])]
    for name, r in files:
        cases = sorted((b["extra_info"] for b in r["benchmarks"] if b["name"].startswith("test_decode_step_split")),
                       key=lambda e: e["batch_size"])
        if not cases or "graph_gpu_ms" not in cases[0]:
            continue
        tree = "the tree before the split" if _before_split(r) else "this stage"
        lines += [f"Measured {r['datetime'][:10]} on {name.split('_')[0].replace('-', ' ')}, {tree} "
                  f"({_log_folder(name)}; `bench_batch.py::test_decode_step_split`, {cases[0]['cache_length']} "
                  "cached positions a sequence, medians of 20 steps):", "",
                  "| B | wall of step() | GPU time of the replayed step | the loop's host time | floor | GPU / floor |",
                  "|" + " --- |" * 6]
        for e in cases:
            lines.append(f"| {e['batch_size']} | {e['wall_ms']:.2f} ms | {e['graph_gpu_ms']:.2f} ms | "
                         f"{e['host_loop_ms']:.2f} ms | {e['bandwidth_floor_ms']:.2f} ms | "
                         f"{e['graph_gpu_ms'] / e['bandwidth_floor_ms']:.2f}x |")
        lines.append("")
    if not any(not _before_split(r) for _, r in files):
        lines.append(_not_measured(f"`{STAGE}`'s own tree", f"bash scripts/gpu_check.sh LOGS bench{NN}"))
    return "\n".join(lines).rstrip()


# ---------------------------------------------------------------------------------------------------- the harness
FIGURES = {"latency": [("ms per decode step", "ms_per_decode_step", "{:.3f}"),
                       ("ms to the first token", "ttft_ms", "{:.1f}")],
           "batch": [(f"output tok/s, B = {b}", f"output_tok_per_s_at_B{b}", "{:,.0f}") for b in (1, 8, 32, 64, 128, 256)],
           "ragged": [("output tok/s", "output_tok_per_s", "{:,.0f}"), ("ms per decode step", "ms_per_decode_step",
                                                                       "{:.2f}")]}


def _with_stage(workload: str) -> list[tuple[str, dict]]:
    """The runs of `workload` that hold this stage, at the default KV memory; not the ladders (every stage at once:
    the course README's table), whose columns would bury the two this chapter compares."""
    return [(n, r) for n, r in _loaded(f"*_{workload}-*.json")
            if STAGE in r["stages"] and not r.get("kv_cache_gib") and not r.get("ladder")]


def _figure(s: dict | None, key: str, fmt: str) -> str:
    if not s or key not in s:
        return "-"
    lo, hi = s.get("spread", {}).get(key, (s[key], s[key]))
    return f"{fmt.format(s[key])} ({fmt.format(lo)}-{fmt.format(hi)})"


def harness() -> str:
    """The newest run of each workload that holds this stage on the GPU of the newest `latency` run, every engine
    of it; the floor of a batch-1 step reads the weights once at the copy bandwidth that run measured."""
    gpu = _with_stage("latency")[-1][1]["environment"]["gpu"]
    newest = {w: on[-1] for w in HARNESS if (on := [nr for nr in _with_stage(w) if nr[1]["environment"]["gpu"] == gpu])}
    engines = list(dict.fromkeys(e for _, r in newest.values() for e in r["stages"]))
    lines = ["| workload | figure | " + " | ".join(f"`{e}`" for e in engines) + " |",
             "|" + " --- |" * (len(engines) + 2)]
    for w, (_, r) in newest.items():
        for label, key, fmt in FIGURES[w]:
            if key == "ms_per_decode_step" and w == "latency":
                s = r["stages"][STAGE]
                label += f" (floor {s['weight_bytes'] / r['environment']['copy_bandwidth_gb_per_s'] / 1e6:.2f} ms)"
            lines.append(f"| `{w}` | {label} | " + " | ".join(_figure(r["stages"].get(e), key, fmt) for e in engines)
                         + " |")
    lines += ["", "Medians of each engine's runs (min-max); " + "; ".join(
        f"`{w}` {r['date']} {r.get('time', '')[:5]} on {r['environment']['gpu']}, "
        + ("the tree before the split" if _before_split(r) else f"`{STAGE}`") + f", {_log_folder(name)}"
        for w, (name, r) in newest.items()) + "."]
    if not any(PREVIOUS in r["stages"] for w in HARNESS for _, r in _with_stage(w)):
        lines += ["", _not_measured(
            f"`{STAGE}` against `{PREVIOUS}`",
            f"LATENCY_STAGES=hf-compile,{PREV_NN},{NN} BATCH_STAGES={PREV_NN},{NN} RAGGED_STAGES={PREV_NN},{NN} "
            "bash scripts/gpu_check.sh LOGS latency,batch,ragged")]
    return "\n".join(lines)


GENERATORS = {"kernel-history": kernel_history, "profile-pair": profile_pair,
              "gemv-kinds": gemv_kinds, "gemv-folded": gemv_folded, "gemv-boundaries": gemv_boundaries,
              "step-split": step_split, "harness": harness, "ladder-pair": lambda: ladders.pair(PREVIOUS, STAGE)}
