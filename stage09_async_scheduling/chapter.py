"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  graph-ladder    which captured graph a decode step of R rows replays, and how many padding rows it carries:
                  computed by graphs.py for the default max_num_seqs
  decode-profile  the committed runs of `python -m common.profile`: a decode step's kernels, group by group (time
                  on the critical path), against their floors, one column per run, one table per batch size
  step-split      the committed runs of bench_batch.py's test_decode_step_split: a decode step's wall time with
                  and without asynchronous scheduling, and its GPU and host time kernel by kernel and replayed
"""
from __future__ import annotations

import json
from pathlib import Path

from common.profile import ORDER
from common.readme import RESULTS, pytest_bench

from .cache import MAX_NUM_SEQS
from .graphs import capture_sizes, graph_size

ROWS = (1, 2, 3, 5, 8, 9, 24, 33, 64, 65, 100, 129, 200, 256)
STAGE = Path(__file__).parent.name   # this stage's profiles: the runs with graphs


def graph_ladder() -> str:
    sizes = capture_sizes(MAX_NUM_SEQS)
    lines = [f"Captured sizes at max_num_seqs={MAX_NUM_SEQS}: {', '.join(map(str, sizes))}.", "",
             "| decode rows | graph replayed | padding rows | share of the GEMMs' rows that are padding |",
             "| --- | --- | --- | --- |"]
    for r in ROWS:
        size = graph_size(r, sizes)
        lines.append(f"| {r} | {size} | {size - r} | {(size - r) / size:.0%} |")
    return "\n".join(lines)


def _eager(p: dict) -> bool:
    """A run without this stage's graphs (an earlier stage, or enforce_eager): every GEMM through cuBLAS."""
    return p["enforce_eager"] or p["stage"] != STAGE


def _label(p: dict) -> str:
    return f"`{p['stage'][:7]}` {'eager' if _eager(p) else 'graphs'}, {p['date'][11:16]}"


def decode_profile() -> str:
    runs = sorted((json.loads(f.read_text()) for f in RESULTS.glob("*_profile-*.json")),   # the stages in order,
                  key=lambda p: (p["stage"], not p["enforce_eager"], p["date"]))       # eager before graphs
    lines = []
    for batch in sorted({p["batch"] for p in runs}):
        mine = [p for p in runs if p["batch"] == batch]
        first = mine[0]                              # the floors: the same shapes in every run of this batch
        lines += [f"Batch {batch}, {first['cache_length']} prompt tokens a request, {first['gpu']}, "
                  f"{first['date'][:10]}: us a decode step, the median of {first['steps']} steps (the floors at "
                  f"the copy bandwidth each run measured, {first['copy_gb_per_s']:,.0f} GB/s in the first):", "",
                  "| kernels | floor | " + " | ".join(_label(p) for p in mine) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in mine) + " |"]
        for group in ORDER:                         # a run fusing two groups' kernels has the fused group instead
            ran = [p["groups"][group] for p in mine if p["groups"].get(group, {}).get("us")]
            if not ran:
                continue
            cells = []
            for p in mine:
                g = p["groups"].get(group, {"us": 0.0})
                ratio = f" ({g['us'] / g['floor_us']:.1f}x)" if g["us"] and g["floor_us"] >= 1 else ""
                cells.append(f"{g['us']:.1f}{ratio}" if g["us"] else "-")
            lines.append(f"| {group} | {ran[0]['floor_us']:.1f} | " + " | ".join(cells) + " |")
        for key, name in (("exposed_us", "all kernels, on the critical path"),
                          ("span_us", "GPU span, first start to last end"),
                          ("wall_us", "the step's wall time, through step()")):
            floor = f"{first['floor_us']:.1f}" if key == "exposed_us" else ""
            # (a run before exposed_us had no overlapping kernels: its busy time is the same sum)
            lines.append(f"| **{name}** | {floor} | " + " | ".join(f"{p.get(key, p['busy_us']):.0f}" for p in mine)
                         + " |")
        lines.append("| kernels a step | | " + " | ".join(f"{p['kernels_per_step']:.0f}" for p in mine) + " |")
        lines.append("| GEMMs through gemv.cu (M x N x K) | | " + " | ".join(
            "none" if _eager(p) else ", ".join("x".join(map(str, g)) for g in p["gemv_shapes"]) or "none"
            if "gemv_shapes" in p else "not recorded" for p in mine) + " |")
        lines.append("| GEMMs through a cuBLASLt pick (M x N x K) | | " + " | ".join(
            "none" if _eager(p) else ", ".join(p["cublaslt_shapes"]) or "none"
            if "cublaslt_shapes" in p else "not recorded" for p in mine) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def step_split() -> str:
    lines = []
    for date, gpu, b in pytest_bench("pytest-bench-graphs"):
        cases = sorted((n for n in b if n.startswith("test_decode_step_split")),
                       key=lambda n: b[n]["extra_info"]["batch_size"])
        if not cases or "wall_sync_ms" not in b[cases[0]]["extra_info"]:
            continue                                 # a run from before asynchronous scheduling
        lines += [f"Measured {date} on {gpu} (`bench_batch.py::test_decode_step_split`, 256 cached positions a "
                  "sequence; walls the median of 20 steps through `step()`, GPU and queueing times from events):",
                  "", "| B | wall, async | wall, sync | GPU, replayed | host to queue the replay | GPU, kernel by "
                  "kernel | host to queue them | the loop's host time | floor |", "|" + " --- |" * 9]
        for name in cases:
            e = b[name]["extra_info"]
            lines.append(f"| {e['batch_size']} | " + " | ".join(f"{e[k]:.2f} ms" for k in (
                "wall_ms", "wall_sync_ms", "graph_gpu_ms", "graph_host_queue_ms", "gpu_ms", "host_queue_ms",
                "host_loop_ms", "bandwidth_floor_ms")) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


GENERATORS = {"graph-ladder": graph_ladder, "decode-profile": decode_profile, "step-split": step_split}
