"""Committed results, read with the engine names the course uses today.

A result file keeps the names it was written with; two kinds have changed since, and every reader of the results
(the README's tables and chart, the chapters' generators) goes through load() so that each figure is shown under
the engine that ran it:

  - the first harness named the baselines by their module: `common.hf_engine` is `hf`, `common.reference` `numpy`;
  - until 2026-12-05 the eighth stage held CUDA graphs, asynchronous scheduling and the fused kernels at once,
    named `stage08_cuda_graphs`. That tree is today's `stage10_fused_kernels` (less a cuBLASLt algorithm search
    that took no GEMM of the 1B: stage10's chapter says why it went); stage08 and stage09 are its first two ideas
    on their own. A result from before the split that names stage08 is stage10's.

    load(path) -> dict     a harness, serving or profile result with today's names
    engine_name(name, date) -> str
    committed(folder, pattern) -> list[Path]   the result files git tracks: what the tables are generated from
    untracked(folder) -> list[str]             the others (a run copied in and not yet added)

A user's own runs are written elsewhere by default (common.bench's USER_RESULTS, `bench-results/`, which git
ignores); a result copied into benchmarks/results/ counts once it is `git add`ed, so that a run on this machine
never changes what the committed READMEs show.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

BASELINE_MODULES = {"common.hf_engine": "hf", "common.reference": "numpy"}
SPLIT_DATE = "2026-12-05"              # results dated before it ran the eight-stage course
BEFORE_SPLIT = {"stage08_cuda_graphs": "stage10_fused_kernels"}


def engine_name(name: str, date: str) -> str:
    """The name today of the engine a result dated `date` (YYYY-MM-DD...) calls `name`."""
    name = BASELINE_MODULES.get(name, name)
    return BEFORE_SPLIT.get(name, name) if date[:10] < SPLIT_DATE else name


def load(path: Path) -> dict:
    """A committed result with its engines under today's names: the keys of "stages" (harness runs) and the
    "stage" of a serving run or a profile."""
    r = json.loads(Path(path).read_text())
    date = str(r.get("date") or r.get("datetime", ""))
    if isinstance(r.get("stages"), dict):
        r["stages"] = {engine_name(k, date): v for k, v in r["stages"].items()}
    if isinstance(r.get("stage"), str):
        r["stage"] = engine_name(r["stage"], date)
    return r


def _tracked(folder: Path) -> set[str] | None:
    """The names of the files directly in `folder` that git tracks, or None outside a git checkout (an unpacked
    archive, no git): there every file counts."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=folder, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode:
        return None
    return {name for name in done.stdout.decode().split("\0") if name and "/" not in name}


def committed(folder: Path, pattern: str = "*.json") -> list[Path]:
    """The files of `folder` matching `pattern` that git tracks (committed, or added to be), sorted by name."""
    paths = sorted(Path(folder).glob(pattern))
    tracked = _tracked(Path(folder)) if Path(folder).is_dir() else None
    return paths if tracked is None else [p for p in paths if p.name in tracked]


def untracked(folder: Path, pattern: str = "*.json") -> list[str]:
    """The names of the files of `folder` matching `pattern` that committed() leaves out."""
    kept = set(committed(folder, pattern))
    return [p.name for p in sorted(Path(folder).glob(pattern)) if p not in kept]
