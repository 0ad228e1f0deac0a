"""The course's front page: every engine on every workload it ran, from the committed harness results.

    python -m common.report          # rewrite the README's cross-stage table and benchmarks/report.png
    python -m common.report --check  # exit 1 if either is stale (tests/test_report.py runs this)

It reads only the result files git tracks in benchmarks/results/ (results.committed): a user's own runs go to
`bench-results/` by default, and one copied in counts once it is added. A workload that has a complete ladder
run (`python -m common.bench --ladder`: every stage and its baselines in one run on one machine) takes all its
figures from the newest one, and nothing else: the H200s differ by up to 1.4x from one machine or day to the next,
so figures of separate runs do not compare. The ladders are one GPU's, the one with ladder runs of the most
workloads (a ladder on another GPU waits until that GPU has more). A workload with no ladder run yet falls back to
the newest GPU result per engine and figure (by date and start time; a run cut off by its time limit keeps the
figures it measured, and a later run of the lengths it missed fills in only those), and the table says so. The
chart carries a digest of the figures it was drawn from in its PNG metadata, so --check needs no matplotlib and
no pixel-exact redraw.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from common.bench.workloads import LADDERS
from common.course import blocks, results, slower

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CHART = ROOT / "benchmarks" / "report.png"
LONG_LENGTHS = (2048, 8192, 32768)
_GIB, _LEN, _ = LADDERS["ragged"].budget     # ragged's second ladder: every engine given the same KV cache memory
# (column title, workload, figure key, format)
COLUMNS = [("latency: ms per decode step (B = 1)", "latency", "ms_per_decode_step", "{:.2f}"),
           ("latency: time to first token, ms", "latency", "ttft_ms", "{:.1f}"),
           ("batch: output tok/s at B = 64", "batch", "output_tok_per_s_at_B64", "{:,.0f}"),
           ("batch: output tok/s at B = 256", "batch", "output_tok_per_s_at_B256", "{:,.0f}"),
           ("ragged: output tok/s", "ragged", "output_tok_per_s", "{:,.0f}"),
           (f"ragged at {_GIB:g} GiB of KV cache, max_model_len {_LEN}: output tok/s", "ragged-kv",
            "output_tok_per_s", "{:,.0f}"),
           *[(f"long: prefill tok/s at {n}", "long", f"prefill_tok_per_s_at_{n}", "{:,.0f}") for n in LONG_LENGTHS],
           ("load: GB/s onto the GPU", "load", "load_gb_per_s", "{:.2f}")]


def newest() -> dict[str, dict[str, tuple[dict, list[str]]]]:
    """workload -> engine -> (its figures, newest per figure, with their spreads; the files they came from)."""
    files = []
    for path in results.committed(RESULTS):             # a run copied in and not yet `git add`ed does not count
        r = results.load(path)
        if not (isinstance(r.get("workload"), dict) and r.get("environment", {}).get("gpu")):
            continue
        if r.get("kv_cache_gib"):     # the same KV cache memory for every engine: only at a ladder's budget
            spec = LADDERS.get(r["workload"]["name"])
            if not (spec and spec.budget and (r["kv_cache_gib"], r.get("max_model_len")) == spec.budget[:2]):
                continue
            r = {**r, "workload": {**r["workload"], "name": r["workload"]["name"] + "-kv"}}
        files.append(((r["date"], "repeats" in r, r.get("time", ""), path.name), r, path.name))
    ladders = [(r["environment"]["gpu"], r["workload"]["name"], name) for _, r, name in sorted(files)
               if r.get("ladder") and r.get("complete") is not False]
    # the table is one machine's: the GPU with ladder runs of the most workloads (ties: the newest run's)
    workloads = {gpu: len({w for g, w, _ in ladders if g == gpu}) for gpu, _, _ in ladders}
    newest = {gpu: i for i, (gpu, _, _) in enumerate(ladders)}        # each GPU's newest ladder run, in order
    gpu = max(workloads, key=lambda g: (workloads[g], newest[g]), default=None)
    ladder = {w: name for g, w, name in ladders if g == gpu}            # the newest complete one wins
    ran = {name: (r["date"], set(r["stages"])) for _, r, name in files if name in ladder.values()}

    def alone(r: dict) -> bool:
        """A baseline the ladder leaves out (hf-cb on ragged), run on its own on the ladder's GPU and day: it
        joins the ladder's column, its file named beside it."""
        date, engines_there = ran[ladder[r["workload"]["name"]]]
        return (not r.get("ladder") and r["environment"]["gpu"] == gpu and r["date"] == date
                and all(not e.startswith("stage") and e not in engines_there for e in r["stages"]))

    out: dict[str, dict[str, tuple[dict, list[str]]]] = {}
    for _, r, name in sorted(files, key=lambda f: f[0]):
        if ladder.get(r["workload"]["name"], name) != name and not alone(r):
            continue
        for engine, s in r["stages"].items():
            if "skipped" in s:
                continue
            merged, names = out.setdefault(r["workload"]["name"], {}).setdefault(engine, ({"spread": {}}, []))
            merged.update({k: v for k, v in s.items() if k != "spread"})
            merged["spread"].update(s.get("spread", {}))
            names[:] = [n for n in names if any(_drew_from(n, engine, k, merged) for k in merged)] + [name]
    return out


def _drew_from(name: str, engine: str, key: str, merged: dict) -> bool:
    """Whether a figure the merged summary still shows came from result file `name`."""
    s = results.load(RESULTS / name)["stages"].get(engine, {})
    return key.startswith(("output_", "prefill_", "ms_", "ttft_", "load_")) and s.get(key) == merged.get(key)


def engines(results) -> list[str]:
    """Stages in ladder order, then the baselines."""
    names = {e for w in results.values() for e in w}
    return sorted(n for n in names if n.startswith("stage")) + sorted(n for n in names if not n.startswith("stage"))


def floor_ms(results) -> tuple[float, str] | None:
    """The batch-1 decode floor of the newest latency result: weight bytes / that run's copy bandwidth."""
    latency = results.get("latency", {})
    for s, names in latency.values():
        if "weight_bytes" in s:
            env = json.loads((RESULTS / names[-1]).read_text())["environment"]
            return s["weight_bytes"] / env["copy_bandwidth_gb_per_s"] / 1e6, names[-1]
    return None


def table() -> str:
    results = newest()
    cols = [c for c in COLUMNS if any(c[2] in s for s, _ in results.get(c[1], {}).values())]
    lines = ["| engine | " + " | ".join(c[0] for c in cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    for e in engines(results):
        cells = []
        for _, workload, key, f in cols:
            s = results.get(workload, {}).get(e, (None, None))[0]
            spread = (s or {}).get("spread", {}).get(key)
            if not s or key not in s:
                why = (s or {}).get(f"unsupported_at_{key.rsplit('_', 1)[-1]}") or (s or {}).get("unsupported")
                cells.append("unsupported" if why else "")
            else:
                cut = s.get(f"runs_cut_at_{key.rsplit('_', 1)[-1]}")   # "1 of 3 runs: one takes ~50 s, ..."
                cells.append(f.format(s[key]) + (f" ({f.format(spread[0])}-{f.format(spread[1])})"
                                                 if spread and spread[0] != spread[1] else "")
                             + (f" ({cut.split(':')[0]})" if cut else ""))
        lines.append(f"| `{e}` | " + " | ".join(cells) + " |")
    floor = floor_ms(results)
    if floor:
        lines.append("| bandwidth floor (weights / copy bandwidth) | " + f"{floor[0]:.2f} | "
                     + " | ".join("" for _ in cols[1:]) + " |")
    lines += ["", "Medians (min-max) over the runs of each result; an empty cell: not measured. Engines compared in"
              " one run share a result file (figures of different runs, processes and days differ by more than"
              " their spread; compare within a run). From `benchmarks/results/`:"]
    for workload in dict.fromkeys(c[1] for c in cols):
        by_file: dict[str, list[str]] = {}
        for e, (_, names) in results[workload].items():
            for name in names:
                by_file.setdefault(name, []).append(f"`{e}`")
        cut = {name for name in by_file if json.loads((RESULTS / name).read_text()).get("complete") is False}
        runs = {name: json.loads((RESULTS / name).read_text()) for name in by_file}
        ladder_runs = [name for name, r in runs.items() if r.get("ladder")]
        if ladder_runs:
            lines.append(f"- {workload}: the ladder run `{ladder_runs[0]}`" + "".join(
                f"; {', '.join(es)} alone in `{name}` ({runs[name].get('repeats', '?')} repeat(s), on the "
                f"ladder's GPU and day)" + (" (cut off by its time limit)" if name in cut else "")
                for name, es in by_file.items() if name != ladder_runs[0]))
            continue
        sources = [f"{', '.join(es)} from `{name}`" + (" (a run cut off by its time limit: what it had not reached"
                                                      " is not in it)" if name in cut else "")
                   for name, es in by_file.items()]
        lines.append(f"- {workload} (no ladder run yet: the newest of separate runs, which do not compare): "
                     + "; ".join(sources))
    said, _ = slower.lines(results, [e for e in engines(results) if e.startswith("stage")], cols)
    return "\n".join(lines + [""] + said)


def unexplained() -> list[str]:
    """The table's cells where a stage reads slower than the one before beyond the run's noise, with no sentence
    in slower.WHY (engine: figure)."""
    results = newest()
    return slower.lines(results, [e for e in engines(results) if e.startswith("stage")], COLUMNS)[1]


def chart_data() -> dict:
    """What the chart draws: per engine, ragged tok/s, latency ms per step, long prefill tok/s per length."""
    results = newest()
    data = {"ragged": {}, "latency": {}, "long": {}}
    for e in engines(results):
        if (s := results.get("ragged", {}).get(e, (None,))[0]) and "output_tok_per_s" in s:
            data["ragged"][e] = s["output_tok_per_s"]
        if (s := results.get("latency", {}).get(e, (None,))[0]) and "ms_per_decode_step" in s:
            data["latency"][e] = s["ms_per_decode_step"]
        if (s := results.get("long", {}).get(e, (None,))[0]):
            pts = [[n, s[f"prefill_tok_per_s_at_{n}"]] for n in LONG_LENGTHS if f"prefill_tok_per_s_at_{n}" in s]
            if pts:
                data["long"][e] = pts
    floor = floor_ms(results)
    data["floor_ms"] = floor[0] if floor else None
    return data


def digest(data: dict) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _short(engine: str) -> str:
    """A chart label: "07 paged attention" for stage07_paged_attention, a baseline's tag as it is."""
    return engine[5:].replace("_", " ") if engine.startswith("stage") else engine


def draw(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(12, 4.4))
    for ax, key, title, unit in ((a, "ragged", "ragged: output tok/s\n(higher is better)", "tok/s"),
                                 (b, "latency", "latency: ms per decode step, B = 1\n(lower is better)", "ms")):
        names = list(data[key])
        ax.barh([_short(n) for n in names], [data[key][n] for n in names],
                color=["#4c72b0" if n.startswith("stage") else "#999999" for n in names])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(unit)
        ax.invert_yaxis()
        if names and max(data[key].values()) / max(min(data[key].values()), 1e-9) > 30:
            ax.set_xscale("log")
    if data["floor_ms"]:
        b.axvline(data["floor_ms"], color="#c44e52", linestyle="--", label=f"floor {data['floor_ms']:.2f} ms")
        b.legend(fontsize=8)
    for name, pts in data["long"].items():
        c.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=_short(name),
               linestyle="-" if name.startswith("stage") else "--")
    c.set_xscale("log", base=2)
    c.set_yscale("log")
    c.set_title("long: prefill tok/s by prompt length\n(higher is better)", fontsize=10)
    c.set_xlabel("prompt tokens")
    if data["long"]:
        c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90, metadata={"Software": None, "Description": f"tiny-vllm report {digest(data)}"})
    plt.close(fig)


def chart_is_current(data: dict, path: Path = CHART) -> bool:
    if not path.exists():
        return False
    from PIL import Image

    with Image.open(path) as im:
        return im.text.get("Description", "") == f"tiny-vllm report {digest(data)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the README's generated blocks or the chart are stale")
    check = ap.parse_args(argv).check
    data = chart_data()
    path = ROOT / "README.md"
    old = path.read_text()
    new = blocks.render(old, {"cross-stage": table}, "README.md", only=True)   # the others: readme.py's
    stale = ([] if new == old else ["README.md"]) + ([] if chart_is_current(data) else [str(CHART.relative_to(ROOT))])
    left_out = results.untracked(RESULTS)
    checked = (f"README.md's generated blocks and {CHART.relative_to(ROOT)} (digest {digest(data)}), from "
               f"{len(results.committed(RESULTS))} committed result files in {RESULTS.relative_to(ROOT)}"
               + (f" ({len(left_out)} untracked left out: `git add` them to count)" if left_out else ""))
    if missing := unexplained():
        print("a stage reads slower than the one before with no sentence saying why (common/course/slower.py's "
              "WHY): " + ", ".join(missing))
        return 1
    if check and stale:
        print("out of date (run python -m common.report): " + ", ".join(stale))
        return 1
    if not check and new != old:
        path.write_text(new)
    if not check and not chart_is_current(data):
        draw(data, CHART)
    print(f"up to date: {checked}" if not stale else f"rewrote {', '.join(stale)}: {checked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
