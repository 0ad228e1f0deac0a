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
"""
from __future__ import annotations

import json
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
