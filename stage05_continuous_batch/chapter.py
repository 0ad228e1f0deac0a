"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

  timeline          ten requests on four seq_slots, static against continuous, drawn from the scheduler's plan
  against-stage04   `latency`, `batch` and `ragged`: this stage beside stage04 in one run of each (and stage04
                    beside HF sdpa on `ragged` in the run that had the baseline), read from the result files named
  step-split        the committed pytest-benchmark run of bench_batch.py: one decode step split into GPU and host
  ladder-pair       stage04 and this stage in each workload's newest complete ladder run (common.course.ladders)

The timeline is the scheduler's real plan, drawn step by step. When every request runs to its max_tokens
(ignore_eos, as in the benchmarks), which tokens are sampled changes nothing in the plan, so the scheduler alone
(no model, no GPU) gives the exact schedule the engine runs. The static side is stage04's rule for the same
requests: batches of max_num_seqs in arrival order, each prefilled in one step and decoded until its longest
request is done.
"""
from __future__ import annotations

import string

from common.course import ladders, results
from common.outputs import Timing
from common.course.readme import RESULTS, split_table
from common.sampling import SamplingParams

from .scheduler import Scheduler
from .sequence import Sequence

# (prompt tokens, max_tokens) of 10 requests; 4 seq_slots, a budget of 16 rows a step
REQUESTS = [(6, 9), (3, 2), (12, 4), (5, 12), (20, 3), (4, 6), (8, 2), (3, 9), (9, 5), (2, 3)]
SLOTS, BUDGET = 4, 16


def _continuous() -> list[list[str]]:
    """Per step, per seq_slot: the request's letter (capital: its prompt's last rows, which sample its first
    token; small: a decode row), '=' a chunk of its prompt that samples nothing yet, ' ' free."""
    sched = Scheduler(SLOTS, BUDGET)
    for i, (p, m) in enumerate(REQUESTS):
        sched.add(Sequence(string.ascii_lowercase[i], [1] * p, SamplingParams(max_tokens=m), frozenset(), 0,
                           Timing(p)))
    steps = []
    while sched.has_unfinished():
        plan = sched.schedule()
        row = [" "] * SLOTS
        for c in plan.chunks:
            row[c.seq.seq_slot] = ("=" if not c.samples else c.seq.request_id.upper() if c.seq.prefilling
                                   else c.seq.request_id)
        sched.update(plan, [0] * len(plan.sampling),
                     lambda s: "length" if len(s.new) >= s.params.max_tokens else None)
        steps.append(row)
    drawn = sum(c != " " for r in steps for c in r), sum(c not in " =" for r in steps for c in r)
    assert drawn == (sched.stats.slot_steps_held, sched.stats.slot_steps_used), "the drawing lost a slot-step"
    return steps


def _static() -> list[list[str]]:
    """The same requests as stage04 runs them; '.': a slot held by a request already finished (an idle row)."""
    steps = []
    for first in range(0, len(REQUESTS), SLOTS):
        batch = list(enumerate(REQUESTS))[first:first + SLOTS]
        longest = max(m for _, (_, m) in batch)
        for t in range(longest):      # step 0 is the batched prefill, which samples each request's first token
            row = [" "] * SLOTS
            for slot, (i, (_, m)) in enumerate(batch):
                letter = string.ascii_lowercase[i]
                row[slot] = letter.upper() if t == 0 else (letter if t < m else ".")
            steps.append(row)
    return steps


def _draw(title: str, steps: list[list[str]]) -> list[str]:
    held = sum(c != " " for row in steps for c in row)
    used = sum(c not in " .=" for row in steps for c in row)
    lines = [(f"{title}: {len(steps)} steps, {held} slot-steps held, {used} gave a token "
              f"(waste {100 * (1 - used / held):.0f}%)")]
    lines += [f"  seq_slot {slot} |" + "".join(row[slot] for row in steps) + "|" for slot in range(SLOTS)]
    return lines


def timeline() -> str:
    head = ", ".join(f"{string.ascii_lowercase[i]} {p}+{m}" for i, (p, m) in enumerate(REQUESTS))
    return "\n".join(["```", f"requests (prompt + max_tokens): {head}",
                      f"{SLOTS} seq_slots, {BUDGET} rows a step; one column per step. A: the prompt rows that",
                      "sample a's first token, a: a decode row, =: a prompt chunk that samples nothing yet,",
                      ".: an idle row (held, its request done)", "",
                      *_draw("static (stage04)", _static()), "",
                      *_draw("continuous (this stage)", _continuous()), "```"])


# The runs of the code this chapter describes (generate()'s requests final only, the lighter packing), stage04
# and stage05 one after the other on one machine; HF sdpa's `ragged` ran beside stage04 earlier the same day
LATENCY, BATCH, RAGGED, RAGGED_HF = ("latency-04-05_192519", "batch-04-05_192538", "ragged-04-05_192614",
                                     "ragged-04-hf-sdpa_172808")
ENGINES = ("stage04_static_batch", __package__, "hf-sdpa")


def _result(name: str) -> dict:
    return results.load(RESULTS / f"NVIDIA-H200_2026-12-03_{name}.json")


def against_stage04() -> str:
    """One row per figure: each engine the run had (median of its repeats, min-max where they differ), this
    stage's gain on stage04 (above 1x: better, whichever way the figure points), and the run's file."""
    def cell(s, key, fmt):
        if key not in s:
            return "-"
        lo, hi = s.get("spread", {}).get(key, (None, None))
        return fmt(s[key]) + (f" ({fmt(lo)}-{fmt(hi)})" if lo is not None and fmt(lo) != fmt(hi) else "")

    def tok(x):
        return f"{x:,.0f}"

    def ms(x):
        return f"{x:.2f}"

    def sec(x):
        return f"{x / 1e3:.1f}"

    def pct(x):
        return f"{100 * x:.{2 if 0 < x < .01 else 1}f}%"

    latency = _result(LATENCY)
    env, date = latency["environment"], latency["date"]
    floor = latency["stages"][__package__]["weight_bytes"] / env["copy_bandwidth_gb_per_s"] / 1e6
    rows = [(f"Measured {date} on {env['gpu']} (`common.bench`, each engine in its own process, medians of "
             f"{latency['repeats']} repeats (min-max); a result file is `benchmarks/results/NVIDIA-H200_{date}_"
             "<name>.json`; the floor of a batch-1 step reads the weights once at the copy bandwidth measured in "
             "the run):"), "",
            "| workload | figure | `stage04` | `stage05` | `hf-sdpa` | stage05 against stage04 | result file |",
            "|" + " --- |" * 7]

    def add(workload, figure, name, key, fmt, lower_is_better=None):
        """lower_is_better None: a share, shown without a gain."""
        s = _result(name)["stages"]
        a, b = s.get(ENGINES[0], {}).get(key), s.get(ENGINES[1], {}).get(key)
        gain = "-" if a is None or b is None or lower_is_better is None else \
            f"{(a / b if lower_is_better else b / a):.2f}x"
        rows.append(f"| {workload} | {figure} | " + " | ".join(cell(s.get(e, {}), key, fmt) for e in ENGINES)
                    + f" | {gain} | `{name}` |")

    add("latency", f"ms per decode step (floor {floor:.2f} ms)", LATENCY, "ms_per_decode_step", ms, True)
    for n in (1, 8, 32, 64):
        add("batch", f"output tok/s, B = {n}", BATCH, f"output_tok_per_s_at_B{n}", tok, False)
    for name, workload in ((RAGGED, "ragged"), (RAGGED_HF, "ragged, the baseline's run")):
        ours = name == RAGGED
        add(workload, "output tok/s", name, "output_tok_per_s", tok, False)
        if ours:
            add(workload, "slot waste", name, "slot_waste", pct)
        add(workload, "median time to first token, s", name, "ttft_ms", sec, True)
        if ours:
            add(workload, "of it queued, s", name, "queue_ms", sec)
        add(workload, "ms between a request's tokens, median", name, "ms_per_decode_step", ms, True)
        add(workload, "the same, p99", name, "itl_p99_ms", ms, True)
        if ours:
            add(workload, "the loop's time in steps with prompt rows", name, "prefill_time_share", pct)
            add(workload, "the loop's time on the host (the GPU waiting)", name, "host_time_share", pct)
    return "\n".join(rows)


def step_split() -> str:
    return split_table("pytest-bench-continuous", "batch_size", "B running sequences (256 cached positions each)")


GENERATORS = {"timeline": timeline, "against-stage04": against_stage04, "step-split": step_split,
              "ladder-pair": lambda: ladders.pair(ENGINES[0], __package__)}
