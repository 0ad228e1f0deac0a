"""Tables in the READMEs, generated from code and committed results (never typed by hand).

    python -m common.readme          # rewrite every generated block
    python -m common.readme --check  # exit 1 if a README is out of date (tests/test_readme.py runs this)

A generated block sits between `<!-- generated:NAME -->` and `<!-- end:NAME -->`; NAME picks the generator: one
of GENERATORS below (data-driven, naming no stage), or, in a stage's chapter, one its `chapter.py` declares.
Results are the files git tracks in benchmarks/results/ (results.committed). The front page's stage-status reads
each chapter's `<!-- short-of: ... -->` line and the GPU tests' summaries (`*_gpu-tests.json`).
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

from common.course import blocks, results
from common.course.report import table as cross_stage

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def stages() -> list[Path]:
    """Every stage folder that has a chapter, in ladder order."""
    return sorted(p for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "README.md").exists())


def stage_ladder() -> str:
    """The stage table of the top README: every stage folder with the first line of its chapter."""
    rows = ["| stage | the one idea | chapter |", "| --- | --- | --- |"]
    for stage in stages():
        title = (stage / "README.md").read_text().splitlines()[0].lstrip("# ").strip()
        idea = title.split(":", 1)[-1].strip()
        rows.append(f"| `{stage.name}` | {idea} | [{stage.name}/README.md]({stage.name}/README.md) |")
    return "\n".join(rows)


SHORT_OF = "short-of"          # the chapter's line `<!-- short-of: ... -->`, under its "## Caveats" heading
GPU_TESTS = "*_gpu-tests*.json"  # GPU_date_gpu-tests.json: {"commit": SHA, "stages": {stage: {passed, failed, skipped}}}


def gpu_tests() -> dict[str, tuple[str, str]]:
    """stage -> (its GPU tests in the newest committed summary that names it, that file's name). A summary is
    `benchmarks/results/<GPU>_<date>_gpu-tests.json`, the counts of one run of a commit's GPU tests a stage."""
    found = {}
    runs = sorted(results.committed(RESULTS, GPU_TESTS), key=lambda p: (p.name.split("_")[1], p.name))
    for path in runs:                                   # oldest first: a newer summary replaces an older one
        r = json.loads(path.read_text())
        gpu, date = path.name.split("_")[:2]             # the record's own, where it has them
        gpu, date = r.get("gpu") or gpu.replace("-", " "), r.get("date") or date
        for stage, n in r["stages"].items():
            counts = [f"{n.get('passed', 0)} passed"] + [
                (f"**{n[k]} {k}**" if k == "failed" else f"{n[k]} {k}") for k in ("failed", "skipped") if n.get(k)]
            found[stage] = (", ".join(counts) + f"; {gpu}, {date}, `{r['commit'][:7]}`", path.name)
    return found


def short_of(stage: Path) -> str:
    """What the stage's chapter says it falls short of, from its `<!-- short-of: ... -->` line."""
    value = blocks.field((stage / "README.md").read_text(), SHORT_OF)
    if value is None:
        raise ValueError(f"{stage.name}/README.md has no `<!-- {SHORT_OF}: ... -->` line (under its \"## Caveats\" "
                         "heading: what the stage falls short of, or \"none\")")
    return value


def stage_status() -> str:
    """The top README's status of each stage: its GPU tests (the newest committed summary that names it, or "no
    summary yet") and what its chapter says it falls short of."""
    tests = gpu_tests()
    rows = ["| stage | GPU tests: passed, failed, skipped; GPU, date, commit | short of its goal (its chapter's "
            "Caveats) |", "| --- | --- | --- |"]
    for stage in stages():
        cell = tests.get(stage.name, ("no summary yet", None))[0]
        rows.append(f"| [`{stage.name}`]({stage.name}/README.md#caveats) | {cell} | {short_of(stage)} |")
    files = sorted({tests[s.name][1] for s in stages() if s.name in tests})
    rows += ["", ("GPU tests from " + ", ".join(f"`{n}`" for n in files) if files else
                  "GPU tests: no summary committed yet (a run's is `benchmarks/results/<GPU>_<date>_gpu-tests.json`)")
             + f"; what a stage is short of from the `<!-- {SHORT_OF}: ... -->` line of its chapter."]
    return "\n".join(rows)


def presets() -> str:
    from common.synthetic import PRESETS

    rows = ["| preset | layers | hidden | heads / KV heads | head_dim | MLP | vocab | parameters | bf16 bytes |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, c in PRESETS.items():
        n = c.num_parameters()
        rows.append(f"| `{name}` | {c.num_hidden_layers} | {c.hidden_size} | {c.num_attention_heads} / "
                    f"{c.num_key_value_heads} | {c.head_dim} | {c.intermediate_size} | {c.vocab_size:,} | "
                    f"{n:,} | {2 * n / 1e9:.3f} GB |")
    return "\n".join(rows)


def pytest_bench(suffix: str) -> list[tuple[str, str, dict]]:
    """(date and time "YYYY-MM-DD HH:MM", GPU, {test name: benchmark}) of every committed pytest-benchmark JSON
    named *_{suffix}.json, oldest first."""
    out = []
    for path in results.committed(RESULTS, f"*_{suffix}.json"):
        r = json.loads(path.read_text())
        out.append((r["datetime"][:16].replace("T", " "), path.name.split("_")[0].replace("-", " "),
                    {b["name"]: b for b in r["benchmarks"]}))
    return sorted(out, key=lambda run: run[0])


def _harness(workload: str, kv_budget: bool = False) -> list[dict]:
    """Every committed harness result of one workload, oldest first (by date, then start time where recorded):
    those run at each engine's own KV cache size, or (kv_budget) those that gave every engine the same one."""
    runs = [results.load(p) for p in results.committed(RESULTS, f"*_{workload}-*.json")]
    runs = [r for r in runs if bool(r.get("kv_cache_gib")) == kv_budget]
    return sorted(runs, key=lambda r: (r["date"], r.get("time", "")))


def growth_results() -> str:
    """`growth`: decode tok/s by generated length (512-token prompt, 1024 new tokens), and the ratio."""
    rows = ["| date | GPU | engine | decode tok/s, first 64 new | first 256 | first 1024 |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in _harness("growth"):
        stages = list(r["stages"].values())
        for name, s in r["stages"].items():
            rows.append(f"| {r['date']} | {r['environment']['gpu']} | `{name}` | " + " | ".join(
                f"{s[f'decode_tok_per_s_at_{n}']:.1f}" for n in (64, 256, 1024)) + " |")
        if len(stages) == 2:
            rows.append("| | | ratio, second / first | " + " | ".join(
                f"{stages[1][f'decode_tok_per_s_at_{n}'] / stages[0][f'decode_tok_per_s_at_{n}']:.2f}x"
                for n in (64, 256, 1024)) + " |")
    return "\n".join(rows)


def split_table(suffix: str, param: str, label: str) -> str:
    """The decode-step split of a pytest-benchmark file: one row per test_decode_step_split[...] case."""
    lines = []
    for date, gpu, b in pytest_bench(suffix):
        cases = sorted((n for n in b if n.startswith("test_decode_step_split")),
                       key=lambda n: b[n]["extra_info"][param])
        loop = any("host_loop_ms" in b[n]["extra_info"] for n in cases)   # engines that time their own loop
        lines += [f"Measured {date} on {gpu} (`test_decode_step_split`, median of 20 steps):", "",
                  f"| {label} | wall | GPU work alone | host time to queue it | "
                  + ("the loop's host time (plan, pack, record) | " if loop else "")
                  + "bandwidth floor | GPU / floor |",
                  "| --- | --- | --- | --- | " + ("--- | " if loop else "") + "--- | --- |"]
        for name in cases:
            e = b[name]["extra_info"]
            lines.append(f"| {e[param]} | {e['wall_ms']:.2f} ms | {e['gpu_ms']:.2f} ms | {e['host_queue_ms']:.2f} ms"
                         + (f" | {e['host_loop_ms']:.2f} ms" if loop else "")
                         + f" | {e['bandwidth_floor_ms']:.2f} ms | {e['gpu_ms'] / e['bandwidth_floor_ms']:.1f}x |")
    return "\n".join(lines)


def ragged_budget_results() -> str:
    """`ragged` with every engine given the same KV cache memory (common.bench --kv-cache-gib): throughput and the
    sequences running at once, each against the run's first engine, and the preemptions it took."""
    rows = ["| date | GPU | KV cache | max_model_len | engine | output tok/s (min-max) | against the first | "
            "sequences running (mean over steps; most) | against the first | preemptions | ms per decode step | "
            "time to first token |", "|" + " --- |" * 12]
    for r in _harness("ragged", kv_budget=True):
        (_, first), *_ = r["stages"].items()
        for name, s in r["stages"].items():
            lo, hi = s.get("spread", {}).get("output_tok_per_s", [s["output_tok_per_s"]] * 2)
            most = s.get("max_running")
            rows.append(f"| {r['date']} | {r['environment']['gpu']} | {r['kv_cache_gib']:g} GiB | "
                        f"{r['max_model_len']:,} | `{name}` | {s['output_tok_per_s']:,.0f} ({lo:,.0f}-{hi:,.0f}) | "
                        f"{s['output_tok_per_s'] / first['output_tok_per_s']:.2f}x | {s['mean_running']:.1f}"
                        f"{'' if most is None else f'; {most:.0f}'} | "
                        f"{s['mean_running'] / first['mean_running']:.2f}x | {s.get('preemptions', '-')} | "
                        f"{s['ms_per_decode_step']:.2f} | {s['ttft_ms'] / 1e3:.2f} s |")
    return "\n".join(rows)


def serving_results() -> str:
    """common.bench_serving: the server under load against the engine alone, and its fault run."""
    rows = ["| date | GPU | engine | clients; arrivals | output tok/s via the server (min-max) | the engine alone | "
            "overhead | TTFT p50; p99 | ITL p50; p99 (per chunk) | the server's mean step; gap between steps | "
            "fault run: completed, disconnected, malformed; problems | idle after every run |", "|" + " --- |" * 12]
    for p in results.committed(RESULTS, "*_serving-*.json"):
        r = results.load(p)
        s, srv = r["summary"], r["server"]
        lo, hi = s["output_tok_per_s_range"]
        rate = "at once" if r["request_rate"] == float("inf") else f"{r['request_rate']:g}/s"
        direct = (f"{s['direct_output_tok_per_s']:,.0f} | {100 * s['overhead']:.0f}%" if "overhead" in s
                  else "- | -")
        f = srv.get("fault")
        fault = (f"{f['completed']}, {f['disconnected']}, {f['malformed']}; {len(f['problems'])}" if f else "-")
        idle = [x["idle_after"] for x in srv["runs"]] + ([f["idle_after"]] if f else [])
        steps = ("-" if "mean_step_ms" not in srv["runs"][0] else
                 f"{statistics.median(x['mean_step_ms'] for x in srv['runs']):.1f}; "
                 f"{statistics.median(x['mean_gap_ms'] for x in srv['runs']):.2f} ms")
        where = " (own process)" if r.get("engine") == "its own process" else " (thread)"   # older: a thread
        rows.append(f"| {r['date']} | {r['environment']['gpu']} | `{r['stage']}`{where} | {r['concurrency']}; {rate} | "
                    f"{s['output_tok_per_s']:,.0f} ({lo:,.0f}-{hi:,.0f}) | {direct} | "
                    f"{s['ttft_p50_ms'] / 1e3:.2f}; {s['ttft_p99_ms'] / 1e3:.2f} s | "
                    f"{s['itl_p50_ms']:.1f}; {s['itl_p99_ms']:.0f} ms | {steps} | {fault} | "
                    f"{'yes' if not any(v for m in idle for v in m.values()) else 'no'} |")
    return "\n".join(rows)


GENERATORS = {"stage-ladder": stage_ladder, "stage-status": stage_status, "cross-stage": cross_stage,
              "presets": presets,
              "growth-results": growth_results, "ragged-budget-results": ragged_budget_results,
              "serving-results": serving_results}
# (the generators above are data-driven: they read results, and name no stage)


def generators(readme: Path) -> dict:
    """The common generators, and for a stage's chapter those its own `chapter.py` declares (GENERATORS)."""
    found = dict(GENERATORS)
    if readme.parent != ROOT and (readme.parent / "chapter.py").exists():
        found |= importlib.import_module(f"{readme.parent.name}.chapter").GENERATORS
    return found


def render(text: str, readme: Path = ROOT / "README.md") -> str:
    return blocks.render(text, generators(readme), str(readme.relative_to(ROOT)))


def readmes() -> list[Path]:
    return [ROOT / "README.md", ROOT / "common" / "serve" / "README.md",
            *sorted(ROOT.glob("stage[0-9][0-9]_*/README.md"))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.readme", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a README is out of date")
    check = ap.parse_args(argv).check
    stale, found = [], 0
    for path in readmes():
        old = path.read_text()
        new = render(old, path)
        found += blocks.count(old)
        if new != old:
            stale.append(str(path.relative_to(ROOT)))
            if not check:
                path.write_text(new)
    left_out = results.untracked(RESULTS)
    checked = f"{found} generated blocks in {len(readmes())} READMEs" + (
        f"; {len(left_out)} untracked result files in {RESULTS.relative_to(ROOT)} left out (`git add` them to count)"
        if left_out else "")
    if check and stale:
        print("out of date (run python -m common.readme): " + ", ".join(stale))
        return 1
    print(f"up to date: {checked}" if not stale else f"rewrote {', '.join(stale)} ({checked})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
