"""A GPU test run's outcome per stage, from pytest's JUnit XML: the file committed as
`benchmarks/results/<GPU>_<date>_gpu-tests.json`, from which the README's status of each stage is generated.

    python -m common.bench.gpu_tests gpu-tests.xml --commit SHA --gpu "NVIDIA H200" --out DIR

    {"commit": SHA, "gpu": ..., "date": ..., "wall_s": ...,
     "stages": {"stage01_loading": {"passed": N, "failed": 0, "skipped": K}, ..., "tests": {...}}}

A case counts under the top folder of its file (stageNN_name, or tests for the cross-stage ones); an error in a
fixture counts as failed, as pytest's own summary counts it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def per_stage(xml_text: str) -> tuple[dict[str, dict[str, int]], float]:
    """{top folder: {"passed", "failed", "skipped"}} and the run's wall time, from JUnit XML."""
    root = ET.fromstring(xml_text)
    counts: dict[str, dict[str, int]] = {}
    wall = 0.0
    for suite in root.iter("testsuite"):
        wall += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            # classname: "stage07_paged_attention.tests.test_kernels_gpu" (importlib mode) or "tests.test_x"
            top = case.get("classname", "").split(".")[0] or "tests"
            kind = ("failed" if case.find("failure") is not None or case.find("error") is not None
                    else "skipped" if case.find("skipped") is not None else "passed")
            c = counts.setdefault(top, {"passed": 0, "failed": 0, "skipped": 0})
            c[kind] += 1
    return dict(sorted(counts.items())), wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m common.bench.gpu_tests", description=__doc__.split("\n\n")[0])
    ap.add_argument("xml", type=Path, help="pytest --junitxml output of the GPU test run")
    ap.add_argument("--commit", required=True, help="the commit whose code ran")
    ap.add_argument("--gpu", required=True, help="the GPU's name, as nvidia-smi gives it")
    ap.add_argument("--out", type=Path, required=True, help="the folder the summary goes into")
    a = ap.parse_args(argv)
    if not a.xml.is_file():
        print(f"{a.xml}: no such JUnit XML file (pytest --junitxml writes it)", file=sys.stderr)
        return 2
    stages, wall = per_stage(a.xml.read_text())
    day = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    record = {"commit": a.commit, "gpu": a.gpu, "date": day, "wall_s": round(wall, 1), "stages": stages}
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"{a.gpu.replace(' ', '-')}_{day}_gpu-tests.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    total = {k: sum(s[k] for s in stages.values()) for k in ("passed", "failed", "skipped")}
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped in {wall:.0f} s "
          f"over {len(stages)} folders: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
