"""The generated parts of this stage's chapter (README.md); `python -m common.readme` renders them with the common,
data-driven ones.

The timeline is the scheduler's real plan, drawn step by step. When every request runs to its max_tokens
(ignore_eos, as in the benchmarks), which tokens are sampled changes nothing in the plan, so the scheduler alone
(no model, no GPU) gives the exact schedule the engine runs. The static side is stage04's rule for the same
requests: batches of max_num_seqs in arrival order, each prefilled in one step and decoded until its longest
request is done.
"""
from __future__ import annotations

import string

from common.outputs import Timing
from common.readme import split_table
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
    lines = [f"{title}: {len(steps)} steps, {held} slot-steps held, {used} gave a token "
             f"(waste {100 * (1 - used / held):.0f}%)"]
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


def step_split() -> str:
    return split_table("pytest-bench-continuous", "batch_size", "B running sequences (256 cached positions each)")


GENERATORS = {"timeline": timeline, "step-split": step_split}
