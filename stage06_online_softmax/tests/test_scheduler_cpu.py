"""CPU: the scheduler plans every step within its budgets, first come first served, with chunked prefill, seq_slot
reuse and aborts; and a randomised property test over seeded arrival / finish / abort patterns (a few hundred
seeds in every run, thousands under the slow marker)."""
import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams
from common.testing import for_each_seed, seed_ranges

from ..scheduler import Scheduler, SchedulerError
from ..sequence import Sequence, SequenceStatus


def seq(rid, prompt_len, max_tokens=4):
    return Sequence(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                    frozenset(), 0, Timing(prompt_len))


def by_length(s):
    """The engine's rule, reduced: finish at max_tokens."""
    return "length" if len(s.new) >= s.params.max_tokens else None


def step(sched, token=7, finish=by_length):
    plan = sched.schedule()
    sched.update(plan, [token] * len(plan.sampling), finish)
    return plan


def test_budgets_are_checked():
    with pytest.raises(SchedulerError, match="max_num_seqs=0"):
        Scheduler(0, 16)
    with pytest.raises(SchedulerError, match="max_num_batched_tokens=4 must be >= max_num_seqs=8"):
        Scheduler(8, 4)


def test_first_come_first_served_and_the_lowest_free_seq_slot():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    a, b, c = seq("a", 3), seq("b", 3), seq("c", 3)
    for s in (a, b, c):
        sched.add(s)
    plan = sched.schedule()
    assert [(ch.seq.request_id, ch.start, ch.n) for ch in plan.chunks] == [("a", 0, 3), ("b", 0, 3)]
    assert (a.seq_slot, b.seq_slot, c.status) == (0, 1, SequenceStatus.WAITING)


def test_decode_rows_come_first_and_a_long_prompt_is_prefilled_in_chunks():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=8)
    short = seq("short", 2, max_tokens=20)
    sched.add(short)
    step(sched)                                              # short: prefilled, first token sampled
    long = seq("long", 20)
    sched.add(long)
    plans = [[(c.seq.request_id, c.start, c.n) for c in step(sched).chunks] for _ in range(3)]
    assert plans[0] == [("short", 2, 1), ("long", 0, 7)]     # the decode row, then what budget is left
    assert plans[1] == [("short", 3, 1), ("long", 7, 7)]
    assert plans[2] == [("short", 4, 1), ("long", 14, 6)]    # the last chunk ends at the prompt: it samples
    assert len(long.new) == 1 and long.num_computed == 20 and not long.prefilling
    assert sched.stats.rows[-3:] == [8, 8, 7] and sched.stats.decode_rows[-3:] == [1, 1, 1]


def test_a_finished_sequence_frees_its_seq_slot_for_the_next_step():
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=16)
    a, b = seq("a", 3, max_tokens=2), seq("b", 3)
    sched.add(a)
    sched.add(b)
    step(sched)                                              # a: prefill + token 1
    step(sched)                                              # a: token 2, finished: seq_slot 0 is free
    assert a.finish_reason == "length" and a.seq_slot is None and b.status is SequenceStatus.WAITING
    plan = sched.schedule()
    assert [c.seq.request_id for c in plan.chunks] == ["b"] and b.seq_slot == 0


@pytest.mark.parametrize("when", ["waiting", "prefilling", "decoding"])
def test_abort_at_any_status_frees_everything(when):
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=4)
    other, victim = seq("other", 2, max_tokens=50), seq("victim", 10, max_tokens=50)
    sched.add(other)
    if when == "waiting":
        sched.add(victim)
        sched.abort("victim")
    else:
        step(sched)
        sched.add(victim)
        step(sched)                                          # victim gets its first chunk of 3
        if when == "decoding":
            for _ in range(4):
                step(sched)
            assert not victim.prefilling
        assert victim.status is SequenceStatus.RUNNING
        assert sched.abort("victim") is victim
    assert victim.finish_reason == "abort" and victim.seq_slot is None
    assert victim not in sched.running and victim not in sched.waiting
    assert sched.abort("victim") is None and sched.abort("nobody") is None     # no-ops
    n = len(other.new)
    step(sched)
    assert len(other.new) == n + 1                           # the others go on


def test_abort_between_schedule_and_update_drops_the_rows():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=16)
    a, b = seq("a", 3), seq("b", 3)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    sched.abort("a")
    advanced = sched.update(plan, [5, 6], by_length)
    assert advanced == [b] and a.new == [] and b.new == [6]


@seed_ranges(300, 2000, copy_seeds=20, test_file=__file__)
def test_random_arrivals_finishes_and_aborts(seeds):
    for_each_seed(seeds, random_arrivals)


def random_arrivals(seed):
    """Invariants on every step of a random workload: the budgets hold, no seq_slot is held twice, admission is
    first come first served; at the end every request finished exactly once, within a bounded number of steps,
    with as many tokens as its finish allows, and every seq_slot is free."""
    rng = np.random.default_rng(seed)
    max_seqs, budget = int(rng.integers(1, 9)), int(rng.integers(8, 65))
    budget = max(budget, max_seqs)
    sched = Scheduler(max_seqs, budget)
    n_requests = int(rng.integers(1, 30))
    reqs = [seq(i, int(rng.integers(1, 100)), int(rng.integers(1, 12))) for i in range(n_requests)]
    arrive = sorted(int(x) for x in rng.integers(0, 40, n_requests))
    stop_p, abort_p = rng.uniform(0, 0.2), rng.uniform(0, 0.05)
    finished_order, admitted_order = [], []

    def finish(s):
        if rng.random() < stop_p:
            return "stop"
        return by_length(s)

    t, pending = 0, list(zip(arrive, reqs))
    while pending or sched.has_unfinished():
        assert t < 10_000, "a request waits forever"
        while pending and pending[0][0] <= t:
            sched.add(pending.pop(0)[1])
        if sched.running and rng.random() < abort_p:
            victim = sched.running[int(rng.integers(len(sched.running)))]
            sched.abort(victim.request_id)
            finished_order.append(victim.request_id)
        before = {s.request_id for s in sched.running}
        plan = sched.schedule()
        admitted_order += [s.request_id for s in sched.running if s.request_id not in before]
        assert plan.num_rows <= budget and len(sched.running) <= max_seqs
        slots = [s.seq_slot for s in sched.running]
        assert len(set(slots)) == len(slots) and all(0 <= x < max_seqs for x in slots)
        assert all(c.n >= 1 and c.start == c.seq.num_computed for c in plan.chunks)
        assert len({id(c.seq) for c in plan.chunks}) == len(plan.chunks)        # one chunk per sequence
        for s in sched.update(plan, rng.integers(0, 1000, len(plan.sampling)).tolist(), finish):
            if s.finished:
                finished_order.append(s.request_id)
        t += 1
    assert admitted_order == sorted(admitted_order)                             # FCFS
    assert sorted(finished_order) == list(range(n_requests))                   # each exactly once
    assert sorted(sched._free) == list(range(max_seqs))
    for s in reqs:
        assert s.finished and s.seq_slot is None
        if s.finish_reason == "length":
            assert len(s.new) == s.params.max_tokens
        if s.finish_reason != "abort":
            assert s.num_computed == s.length - 1      # the last token is returned, never run


def test_time_shares_split_the_loop_between_prompt_steps_decode_steps_and_the_host():
    from ..scheduler import SchedulerStats

    s = SchedulerStats(prefill_rows=[5, 0, 3, 0], forward_s=[0.4, 0.1, 0.2, 0.1], host_s=[0.05] * 4)
    assert s.prefill_time_share == pytest.approx(0.6 / 1.0)     # forwards 0.8 s + host 0.2 s
    assert s.host_time_share == pytest.approx(0.2 / 1.0)
    assert SchedulerStats().prefill_time_share == SchedulerStats().host_time_share == 0.0
