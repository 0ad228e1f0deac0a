"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  placeholder-timeline  three requests through scheduler.py and packing.py in the order of an asynchronous
                        step(): what each launch packs (tokens, prev_rows), what each record reads back, and
                        each request's tokens with their placeholders; against the same requests run in turn
  step-split            the newest run of this stage's test_decode_step_split (bench_batch.py), or the command
                        that measures it
  against-previous      this stage against the previous one in one harness run per workload (`latency`, `batch`,
                        `ragged`), or the command that measures it
  persistent-batch-host the loop's host time at B = 256 on the H200 before and after the persistent batch, in one
                        run alternating the two trees (host_profile's summaries in the log folder)
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from common.course import results
from common.outputs import Timing
from common.course.readme import RESULTS, pytest_bench
from common.sampling import SamplingParams

from .block_manager import BlockManager
from .packing import pack
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus

HERE = Path(__file__).resolve().parent
AB_LOGS = RESULTS.parent / "logs" / "2026-12-05-H200-persistent-batch"   # before/after, alternated in one run
PERSISTENT_BATCH_RUNS = "2026-12-05 03:40"      # results from this time (UTC) on ran with the persistent batch
PREVIOUS = sorted(p.name for p in HERE.parent.glob("stage[0-9][0-9]_*") if p.name < HERE.name)[-1]
NN, PREV_NN = HERE.name[5:7], PREVIOUS[5:7]
BATCH = (1, 8, 32, 64, 128, 256)


# ---------------------------------------------------------------------- the worked example (CPU, from the code)
def _requests():
    """A: 3 prompt tokens, 3 new. B: 2 prompt tokens, stops on token 7. C: waits for a seq_slot (two of them)."""
    def seq(name, prompt, max_tokens, stop=()):
        return Sequence(name, prompt, SamplingParams(max_tokens=max_tokens), frozenset(stop), 0, Timing(len(prompt)))

    seqs = [seq("A", [11, 12, 13], 3), seq("B", [21, 22], 8, stop=[7]), seq("C", [51, 52], 2)]
    ids = {"A": iter([31, 32, 33]), "B": iter([41, 7, 43]), "C": iter([61, 62])}   # what "the GPU" samples
    sched = Scheduler(2, 16, BlockManager(8, 4), 64)
    for s in seqs:
        sched.add(s)
    return sched, seqs, ids



def _run(asynchronous: bool):
    """Drive the scheduler as LLMEngine.step() does; per call: (plan, its packed inputs, the requests' tokens
    as packed, the ids recorded in that call, the tokens after it). Also the rows computed for nothing."""
    sched, seqs, ids = _requests()
    in_flight, calls, wasted = None, [], []
    while sched.has_unfinished() or in_flight:
        if in_flight:
            wasted += [c for c in in_flight[0].chunks if c.seq.finished]      # advance() drops their rows
            sched.advance(in_flight[0])
        plan = sched.schedule()
        launched = x = None
        if plan.chunks:
            x = pack(plan, 64, 4)
            launched = (plan, [next(ids[c.seq.request_id]) for c in plan.sampling])
        packed = [None if s.status is SequenceStatus.WAITING and not s.new else list(s.new) for s in seqs]
        if asynchronous:
            done, in_flight = in_flight, launched
        else:
            done = launched
            if launched:
                sched.advance(plan)
        if done:
            sched.record(*done)
        calls.append((plan, x, packed, done[1] if done else None, [(list(s.new), s.finish_reason) for s in seqs]))
    return calls, wasted


def _rows(plan) -> str:
    return ", ".join(f"{c.seq.request_id}@{c.start}" + (f"..{c.start + c.n - 1}" if c.n > 1 else "")
                     for c in plan.chunks) or "-"


def placeholder_timeline() -> str:
    calls, wasted = _run(asynchronous=True)
    lines = ["| `step()` call | launched: rows (request@positions) | their tokens | prev_rows | read back: the ids of "
             "the step before | A's new tokens (as packed -> after the record) | B's | C's |", "|" + " --- |" * 8]
    for k, (plan, x, packed, ids, after) in enumerate(calls, 1):
        cells = []
        for was, (now, reason) in zip(packed, after):
            if was is None and not now:
                cells.append("waiting")
            else:                                      # a token recorded in this call: as packed -> after
                cells.append((f"{was} -> {now}" if was != now else f"{now}") + (f" {reason}" if reason else ""))
        prev = "-" if x is None or x.prev_rows is None else ", ".join(map(str, x.prev_rows))
        lines.append(f"| {k} | {_rows(plan)} | {'-' if x is None else ', '.join(map(str, x.tokens))} | {prev} | "
                     f"{'-' if ids is None else ', '.join(map(str, ids))} | " + " | ".join(cells) + " |")
    sync, _ = _run(asynchronous=False)

    def admitted(run):
        return next(k for k, (plan, *_) in enumerate(run, 1) if any(c.seq.request_id == "C" for c in plan.chunks))

    launches = [sum(1 for plan, *_ in run if plan.chunks) for run in (sync, calls)]
    rows = [sum(plan.num_rows for plan, *_ in run) for run in (sync, calls)]
    lines += ["", f"The same requests run in turn (`async_scheduling=False`) take {launches[0]} launched steps of "
              f"{rows[0]} rows, C admitted at step {admitted(sync)}; here {launches[1]} launched steps of {rows[1]} "
              f"rows ({len(calls)} `step()` calls: the last launches nothing and records the one before), C admitted "
              "at "
              f"step {admitted(calls)}, and the row{'s' * (len(wasted) > 1)} "
              + ", ".join(f"{c.seq.request_id}@{c.start}" for c in wasted) + " computed for nothing."]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the decode step's split
def _split_table(b: dict) -> list[str]:
    """The rows of test_decode_step_split's cases in one pytest-benchmark file, by batch size."""
    cases = sorted((n for n in b if n.startswith("test_decode_step_split")),
                   key=lambda n: b[n]["extra_info"]["batch_size"])
    lines = ["| B | wall, asynchronous | wall, synchronous | GPU, the replay alone | host, to queue the replay | "
             "the loop's host time a step | floor |", "|" + " --- |" * 7]
    for name in cases:
        e = b[name]["extra_info"]
        lines.append(f"| {e['batch_size']} | " + " | ".join(f"{e[k]:.2f} ms" for k in (
            "wall_ms", "wall_sync_ms", "graph_gpu_ms", "graph_host_queue_ms", "host_loop_ms",
            "bandwidth_floor_ms")) + " |")
    return lines


SPLIT_HOW = ("`bench_batch.py::test_decode_step_split`: B sequences of 256 cached positions, all decoding; the walls "
             "the median of 20 `step()` calls, each way; GPU and queueing times from events")


def step_split() -> str:
    """The newest committed run of this stage's test_decode_step_split."""
    runs = pytest_bench(f"pytest-bench-step-{NN}")
    if not runs:
        return (f"The decode step's split on this stage's tree: not measured yet. `bash scripts/gpu_check.sh LOGS "
                f"bench{NN}` measures it on a GPU, writing `*_pytest-bench-step-{NN}.json` into the folder LOGS; "
                "copied into `benchmarks/results/` and committed, it fills this table.")
    when, gpu, b = runs[-1]
    tree = "with the persistent batch" if when >= PERSISTENT_BATCH_RUNS else "before the persistent batch"
    return "\n".join([f"Measured {when} UTC on {gpu}, {tree} ({SPLIT_HOW}):", "", *_split_table(b)])


# ---------------------------------------------------------------------- the persistent batch, before and after
HOST_LINE = re.compile(r"step wall ([\d.]+) ms; the runner's launch/run ([\d.]+) ms a step; the loop's host time "
                       r"\(host_s\) ([\d.]+) ms")


def persistent_batch_host() -> str:
    """The loop's host time at B = 256 on the H200, this stage before and after the persistent batch, alternated
    in one run (host_profile's summary lines in the log folder)."""
    runs = {}
    for path in sorted(AB_LOGS.glob(f"host-profile-{NN}-*-*-[0-9].txt")):
        *_, tree, output, _ = path.stem.split("-")       # host-profile-NN-before-ids-1
        wall, runner, host = map(float, HOST_LINE.search(path.read_text()).groups())
        runs.setdefault((output, tree), []).append((host, wall))
    if not runs:
        return "Not measured on a GPU yet: `python -m common.bench.host_profile --stage 09 --batch 256` measures it."

    def cell(values):
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    rows = ["| outputs | the loop's host time, before | after | step wall, before | after |", "|" + " --- |" * 5]
    for output, label in (("ids", "token ids (the server)"), ("text", "text, streamed")):
        before, after = runs[(output, "before")], runs[(output, "after")]
        rows.append(f"| {label} | {cell([h for h, _ in before])} ms | {cell([h for h, _ in after])} ms | "
                    f"{cell([w for _, w in before])} ms | {cell([w for _, w in after])} ms |")
    n = len(runs[("ids", "before")])
    return "\n".join([f"Measured 2026-12-05 on an NVIDIA H200 (`benchmarks/logs/{AB_LOGS.name}/`): "
                      f"`python -m common.bench.host_profile --stage {NN} --batch 256 [--text]`, 256 sequences "
                      f"decoding, medians of 50 steps a run, then the median (min-max) of {n} runs alternating the "
                      "tree before the persistent batch and this one (prompts of 100 tokens: a shorter step than the "
                      "split's, whose sequences hold 256 positions):", "", *rows])


# ---------------------------------------------------------------------- harness runs
FIGURES = [("latency", "ms per decode step, batch 1", "ms_per_decode_step", True),
           ("latency", "time to first token, ms", "ttft_ms", True),
           *(("batch", f"output tok/s, B = {n}", f"output_tok_per_s_at_B{n}", False) for n in BATCH),
           ("ragged", "output tok/s", "output_tok_per_s", False),
           ("ragged", "ms per decode step", "ms_per_decode_step", True),
           ("ragged", "the loop's time outside the wait (host_time_share)", "host_time_share", None)]


def _cell(s: dict, key: str, lower_is_better) -> str:
    if lower_is_better is None:
        return f"{100 * s[key]:.1f}%"
    fmt = "{:.2f}" if lower_is_better else "{:,.0f}"
    lo_hi = s.get("spread", {}).get(key)
    return fmt.format(s[key]) + (f" ({'-'.join(fmt.format(v) for v in lo_hi)})" if lo_hi else "")


def _faster(a: dict, b: dict, key: str, lower_is_better) -> str:
    """b's speed against a's (above 1x: b is faster, whichever way the figure points)."""
    if lower_is_better is None:
        return "-"
    return f"{(a[key] / b[key] if lower_is_better else b[key] / a[key]):.2f}x"


def against_previous() -> str:
    """The newest committed harness run holding both this stage and the previous one, for each workload (each
    engine sizing its own KV cache)."""
    runs = {}
    loaded = [r for r in map(results.load, RESULTS.glob("*.json")) if isinstance(r.get("workload"), dict)]
    for r in sorted((r for r in loaded if "date" in r), key=lambda r: (r["date"], r.get("time", ""))):
        if {PREVIOUS, HERE.name} <= set(r["stages"]) and not r.get("kv_cache_gib"):
            runs[r["workload"]["name"]] = r                # the newest run of each workload comes last
    command = (f"`LATENCY_STAGES={PREV_NN},{NN} BATCH_STAGES={PREV_NN},{NN} RAGGED_STAGES={PREV_NN},{NN} "
               "bash scripts/gpu_check.sh LOGS latency,batch,ragged`")
    if not runs:
        return (f"This stage against stage{PREV_NN}: not measured yet. {command} measures it on a GPU (one harness "
                "run a workload, 3 repeats each), writing its JSON files into the folder LOGS; copied into "
                "`benchmarks/results/` and committed, they fill this table.")
    rows = [f"| workload | figure | run | `{PREVIOUS}` | `{HERE.name}` | stage{NN} against stage{PREV_NN} |",
            "|" + " --- |" * 6]
    for workload, label, key, lower in FIGURES:
        r = runs.get(workload)
        if r is None:
            rows.append(f"| `{workload}` | {label} | not measured yet | | | |")
            continue
        a, b = r["stages"][PREVIOUS], r["stages"][HERE.name]
        rows.append(f"| `{workload}` | {label} | {r['date']} {r.get('time', '')[:5]}, {r['environment']['gpu']} | "
                    f"{_cell(a, key, lower)} | {_cell(b, key, lower)} | {_faster(a, b, key, lower)} |")
    if len(runs) < len({w for w, *_ in FIGURES}):
        rows += ["", f"The rows not measured yet: {command} measures them."]
    return "\n".join(rows)


GENERATORS = {"placeholder-timeline": placeholder_timeline, "step-split": step_split,
              "against-previous": against_previous, "persistent-batch-host": persistent_batch_host}
