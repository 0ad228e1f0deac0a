"""A GPU test run's outcome per stage, from pytest's verbose logs (`-v`: one line a case as it ends, so a run cut
off by its time limit still says what it ran): the file committed as `benchmarks/results/<GPU>_<date>_gpu-tests.json`,
from which the README's status of each stage is generated.

    python -m common.bench.gpu_tests gpu-tests-01-06.log gpu-tests-07-13.log ... --commit SHA --gpu NAME --out DIR

    {"commit": SHA, "gpu": ..., "date": ..., "wall_s": ..., "complete": true,
     "stages": {"stage01_loading": {"passed": N, "failed": 0, "skipped": K}, ..., "tests": {...}}}

A case counts under the top folder of its file (stageNN_name, or tests for the cross-stage ones), once, by its
worst outcome: a pass whose teardown errs counts here as a failure (pytest's own line counts it twice, a pass and
an error). A test file that fails to import counts as one failure of its folder. A log without pytest's closing
line (a run cut off), or one pytest interrupted, makes the summary complete: false; the cases it did not reach
are not in it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

CASE = re.compile(r"^(?P<node>[\w./-]+\.py::\S+(?: \S+)*?) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
COLLECTING = re.compile(r"^_+ ERROR collecting (?P<file>\S+) _+$")
CLOSING = re.compile(r"^=+ .*\b(?:passed|failed|skipped|error|errors|deselected)\b.* in (?P<s>[\d.]+)s")
KIND = {"PASSED": "passed", "XPASS": "passed", "XFAIL": "skipped", "SKIPPED": "skipped", "FAILED": "failed",
        "ERROR": "failed"}
WORST = ("failed", "skipped", "passed")


def per_stage(logs: list[str]) -> tuple[dict[str, dict[str, int]], float, bool]:
    """{top folder: {"passed", "failed", "skipped"}}, the runs' wall time added up, and whether every log closed."""
    outcome: dict[str, str] = {}
    wall, complete = 0.0, True
    for text in logs:
        closed, interrupted = False, False
        for line in text.splitlines():
            m = CASE.match(line)
            if m or (m := COLLECTING.match(line)):
                node, kind = (m["node"], KIND[m["outcome"]]) if "outcome" in m.groupdict() else (m["file"], "failed")
                if node not in outcome or WORST.index(kind) < WORST.index(outcome[node]):
                    outcome[node] = kind
            elif m := CLOSING.match(line):
                closed, wall = True, wall + float(m["s"])
            interrupted |= line.startswith("Interrupted:") or (line.startswith("!!!") and "Interrupted" in line)
        complete &= closed and not interrupted
    counts: dict[str, dict[str, int]] = {}
    for node, kind in outcome.items():
        top = node.split("/", 1)[0] if "/" in node else "tests"
        counts.setdefault(top, {"passed": 0, "failed": 0, "skipped": 0})[kind] += 1
    return dict(sorted(counts.items())), wall, complete


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench.gpu_tests", description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", type=Path, nargs="+", help="the output of pytest -v of the GPU test run (or its shards)")
    ap.add_argument("--commit", required=True, help="the commit whose code ran")
    ap.add_argument("--gpu", required=True, help="the GPU's name, as nvidia-smi gives it")
    ap.add_argument("--out", type=Path, required=True, help="the folder the summary goes into")
    ap.add_argument("--selected", default="", help="paths or -k the run was narrowed to: a subset, not complete")
    a = ap.parse_args(argv)
    missing = [str(p) for p in a.logs if not p.is_file()]
    if missing:
        print(f"{', '.join(missing)}: no such log (the output of pytest -v)", file=sys.stderr)
        return 2
    stages, wall, complete = per_stage([p.read_text(errors="replace") for p in a.logs])
    # the run's day, as the log folder's gpu.txt has it (gpu_check.sh's first lines), else today's
    gpu_txt = a.logs[0].parent / "gpu.txt"
    dates = re.findall(r"\b(\d{4}-\d{2}-\d{2})\b", gpu_txt.read_text()) if gpu_txt.is_file() else []
    day = dates[0] if dates else datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    record = {"commit": a.commit, "gpu": a.gpu, "date": day, "wall_s": round(wall, 1),
              "complete": complete and not a.selected, "selected": a.selected or None,
              "logs": [p.name for p in a.logs], "stages": stages}
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{a.gpu.replace(' ', '-')}_{day}_gpu-tests.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    total = {k: sum(s[k] for s in stages.values()) for k in ("passed", "failed", "skipped")}
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped in {wall:.0f} s over "
          f"{len(stages)} folders{'' if complete else ' (a run cut off: not every case ran)'}: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
