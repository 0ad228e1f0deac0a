"""CPU: the scheduler plans every step within its budgets, first come first served, with chunked prefill, seq_slot
reuse, aborts, admission by blocks and preemption when they run out; and a randomised property test over seeded
arrival / finish / abort patterns (a few hundred seeds in every run, thousands under the slow marker) on pools so
small that preemption is common."""
import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams
from common.testing import for_each_seed, seed_ranges

from ..block_manager import BlockManager, blocks_for
from ..scheduler import Scheduler, SchedulerError
from ..sequence import Sequence, SequenceStatus


STOP = 999_999                     # the random workloads' stop id: no request's own token (1000 * id + index)


def scheduler(max_num_seqs, max_num_batched_tokens, num_blocks=1000, block_size=4):
    """Prefix caching off: these prompts share their tokens (1, 2, 3, ...); tests/test_prefix_cache_cpu.py has it on."""
    return Scheduler(max_num_seqs, max_num_batched_tokens, BlockManager(num_blocks, block_size, enable_caching=False),
                     1024)


def seq(rid, prompt_len, max_tokens=4, stop=()):
    return Sequence(rid, list(range(1, prompt_len + 1)), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                    frozenset(stop), 0, Timing(prompt_len))


def step(sched, token=7):
    plan = sched.schedule()
    sched.update(plan, [token] * len(plan.sampling))
    return plan


def test_budgets_are_checked():
    with pytest.raises(SchedulerError, match="max_num_seqs=0"):
        scheduler(0, 16)
    with pytest.raises(SchedulerError, match="max_num_batched_tokens=4 must be >= max_num_seqs=8"):
        scheduler(8, 4)


def test_first_come_first_served_and_the_lowest_free_seq_slot():
    sched = scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    a, b, c = seq("a", 3), seq("b", 3), seq("c", 3)
    for s in (a, b, c):
        sched.add(s)
    plan = sched.schedule()
    assert [(ch.seq.request_id, ch.start, ch.n) for ch in plan.chunks] == [("a", 0, 3), ("b", 0, 3)]
    assert (a.seq_slot, b.seq_slot, c.status) == (0, 1, SequenceStatus.WAITING)


def test_decode_rows_come_first_and_a_long_prompt_is_prefilled_in_chunks():
    sched = scheduler(max_num_seqs=4, max_num_batched_tokens=8)
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
    sched = scheduler(max_num_seqs=1, max_num_batched_tokens=16)
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
    sched = scheduler(max_num_seqs=2, max_num_batched_tokens=4)
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
    sched = scheduler(max_num_seqs=2, max_num_batched_tokens=16)
    a, b = seq("a", 3), seq("b", 3)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    sched.abort("a")
    advanced = sched.update(plan, [5, 6])
    assert advanced == [b] and a.new == [] and b.new == [6]


def test_async_placeholders_are_planned_on_and_a_stop_found_late_frees_everything():
    """Asynchronous scheduling: schedule() for the next step runs between advance() and record(). A decode row
    carries the placeholder (-1 - i), a sequence at max_tokens gets no row, and one preempted while its token was
    on the GPU that then stops on it leaves the queue and holds nothing."""
    sched = scheduler(max_num_seqs=4, max_num_batched_tokens=100, num_blocks=5, block_size=4)
    a, b = seq("a", 8, max_tokens=9, stop=[8]), seq("b", 4, max_tokens=1)   # 2 blocks, 1 block
    sched.add(a)
    sched.add(b)
    first = sched.schedule()
    sched.advance(first)
    assert a.new == [-1] and b.new == [-2]                   # placeholders of the 1st and 2nd sampled ids
    c = seq("c", 8)                                          # 2 blocks: the pool is full
    sched.add(c)
    second = sched.schedule()                                # b is at max_tokens: no row; a decodes
    assert [(ch.seq.request_id, ch.start, ch.n) for ch in second.chunks] == [("a", 8, 1)]
    sched.record(first, [5, 6])
    assert a.new == [5] and b.finished and sched.blocks.num_free == 2   # b gave 1 back, a took 1 for position 8
    sched.advance(second)
    third = sched.schedule()                                 # c is admitted: a decodes, c prefills
    assert [ch.seq.request_id for ch in third.chunks] == ["a", "c"] and a.new == [5, -1]
    sched.record(second, [8])                                # a stops on the token, its stop id
    assert a.finished and a.block_table == [] and sched.running == [c]
    sched.advance(third)                                     # a's row is dropped; c samples its first token
    assert a.new == [5, 8] and a.num_computed == 9 and c.new == [-2]
    sched.record(third, [1, 2])                   # a is skipped; c's is the 2nd id
    assert c.new == [2] and a.new == [5, 8]
    with pytest.raises(RuntimeError, match="not the placeholder -2 of the step being recorded"):
        sched.record(third, [1, 2])               # recorded twice: caught, not silently overwritten
    # preempted while pending: d's row needs a block, none is free, so the newest (e) goes back with its
    # placeholder; then e's token stops it, in the waiting queue
    sched = scheduler(max_num_seqs=4, max_num_batched_tokens=100, num_blocks=3, block_size=4)
    d, e = seq("d", 4, max_tokens=9), seq("e", 8, max_tokens=9, stop=[4])
    sched.add(d)
    sched.add(e)
    plan = sched.schedule()
    sched.advance(plan)
    nxt = sched.schedule()
    assert e.status is SequenceStatus.WAITING and e.new == [-2] and list(sched.waiting) == [e]
    sched.record(plan, [3, 4])                               # e's token is its stop id
    assert e.finished and not sched.waiting and d.new == [3] and [ch.seq for ch in nxt.chunks] == [d]
    assert sched.blocks.num_free == 1


def test_admission_by_blocks_and_the_newest_preempted_when_a_decode_row_needs_one():
    sched = scheduler(max_num_seqs=4, max_num_batched_tokens=100, num_blocks=5, block_size=4)
    a, b, c = seq("a", 8, max_tokens=3), seq("b", 12), seq("c", 1)    # 2, 3 and 1 blocks
    for s in (a, b, c):
        sched.add(s)
    plan = sched.schedule()                                 # c waits: its one block is not free
    assert [ch.seq.request_id for ch in plan.chunks] == ["a", "b"] and sched.blocks.num_free == 0
    assert a.block_table == [0, 1] and b.block_table == [2, 3, 4] and list(sched.waiting) == [c]
    sched.update(plan, [7, 7])
    plan = sched.schedule()                                 # a decodes position 8, in a new block: b goes back
    assert sched.stats.preemptions == 1 and b.status is SequenceStatus.WAITING and b.block_table == []
    assert [(ch.seq.request_id, ch.start, ch.n) for ch in plan.chunks] == [("a", 8, 1)]   # no admission this step
    assert a.block_table == [0, 1, 2] and list(sched.waiting) == [b, c]                    # b first, then c
    sched.update(plan, [7])
    plan = sched.schedule()                                 # b's 13 tokens want 4 blocks, 2 are free: b waits, c too
    assert [(ch.seq.request_id, ch.start, ch.n) for ch in plan.chunks] == [("a", 9, 1)]


def test_a_decode_row_grows_its_table_at_block_boundaries_only():
    sched = scheduler(max_num_seqs=1, max_num_batched_tokens=8, block_size=4)
    a = seq("a", 3, max_tokens=10)
    sched.add(a)
    tables = []
    for _ in range(8):
        step(sched)
        tables.append(len(a.block_table))
    # positions 0..2 prefilled (1 block), then decode rows at positions 3, 4, ... 9: a new block at 4 and at 8
    assert tables == [1, 1, 2, 2, 2, 2, 3, 3]


def test_a_preempted_sequence_prefills_its_prompt_and_tokens_again_and_goes_on():
    sched = scheduler(max_num_seqs=2, max_num_batched_tokens=64, num_blocks=4, block_size=4)
    old, young = seq("old", 6, max_tokens=8), seq("young", 5, max_tokens=8)
    sched.add(old)
    sched.add(young)
    step(sched)                                             # old: 2 blocks, young: 2 blocks; pool full
    step(sched)                                             # positions 6 and 5: inside their last blocks
    plan = step(sched)                                      # old decodes position 7, young position 6: still fit
    assert sched.stats.preemptions == 0
    plan = step(sched)                                      # old needs a block for position 8: young goes back
    assert sched.stats.preemptions == 1 and young.num_preemptions == 1
    assert young.status is SequenceStatus.WAITING and young.num_computed == 0 and len(young.new) == 3
    assert [(c.seq.request_id, c.start) for c in plan.chunks] == [("old", 8)]
    while not old.finished:                                 # old's 13 positions take the whole pool
        step(sched)
        assert young.status is SequenceStatus.WAITING
    while not young.finished:
        plan = step(sched)
    assert len(young.new) == 8 and young.num_computed == young.length - 1
    assert sched.blocks.num_free == 4 and sched._free == [0, 1]


def test_the_oldest_preempts_itself_rather_than_an_older_one_and_no_block_leaks():
    sched = scheduler(max_num_seqs=2, max_num_batched_tokens=64, num_blocks=3, block_size=2)
    a, b = seq("a", 2, max_tokens=4), seq("b", 2, max_tokens=4)
    sched.add(a)
    sched.add(b)
    step(sched)                                             # a: block 0, b: block 1
    plan = sched.schedule()                                 # a takes block 2 for position 2; b must too: it yields
    assert [c.seq.request_id for c in plan.chunks] == ["a"] and b.status is SequenceStatus.WAITING
    assert sched.blocks.num_free == 1


@seed_ranges(300, 3000, copy_seeds=20, test_file=__file__)
def test_random_workloads_on_tiny_pools_finish_every_request_with_all_its_tokens(seeds):
    preemptions = for_each_seed(seeds, random_workload)
    # not vacuous: the smaller pools preempt, in a good share of the seeds
    assert sum(n > 0 for n in preemptions) > len(seeds) / 5


def random_workload(seed) -> int:
    """Invariants on every step of a random workload, on a block pool from barely one request's worth up to ample:
    the budgets hold, no seq_slot or block is held twice, every planned row has its block, first admissions are
    first come first served; at the end every request finished exactly once, within a bounded number of steps,
    with exactly the tokens it was given (preempted or not), and every seq_slot and block is free."""
    rng = np.random.default_rng(seed)
    max_seqs, budget = int(rng.integers(1, 9)), int(rng.integers(8, 65))
    budget = max(budget, max_seqs)
    bs = int(rng.choice([1, 2, 4, 16]))
    n_requests = int(rng.integers(1, 30))
    reqs = [seq(i, int(rng.integers(1, 100)), int(rng.integers(1, 12)), stop=[STOP]) for i in range(n_requests)]
    need = max(blocks_for(len(s.prompt) + s.params.max_tokens - 1, bs) for s in reqs)   # the largest alone
    num_blocks = int(need * rng.choice([1, 1.2, 2, 5, 50]))
    sched = scheduler(max_seqs, budget, num_blocks, bs)
    pool = sched.blocks
    arrive = sorted(int(x) for x in rng.integers(0, 40, n_requests))
    stop_p, abort_p = rng.uniform(0, 0.2), rng.uniform(0, 0.05)
    finished_order, first_admissions, admitted = [], [], set()

    def token(s):                                   # what the model "samples": a function of the request and index,
        return STOP if rng.random() < stop_p else 1000 * s.request_id + len(s.new)   # or now and then its stop id

    t, pending = 0, list(zip(arrive, reqs))
    while pending or sched.has_unfinished():
        assert t < 20_000, "a request waits forever"
        while pending and pending[0][0] <= t:
            sched.add(pending.pop(0)[1])
        if sched.running and rng.random() < abort_p:
            victim = sched.running[int(rng.integers(len(sched.running)))]
            sched.abort(victim.request_id)
            finished_order.append(victim.request_id)
        plan = sched.schedule()
        for s in sched.running:
            if s.request_id not in admitted:
                admitted.add(s.request_id)
                first_admissions.append(s.request_id)
        assert plan.num_rows <= budget and len(sched.running) <= max_seqs
        slots = [s.seq_slot for s in sched.running]
        assert len(set(slots)) == len(slots) and all(0 <= x < max_seqs for x in slots)
        held = [b for s in sched.running for b in s.block_table]
        assert len(set(held)) == len(held) == num_blocks - pool.num_free                # no double use, no leak
        assert all(not s.block_table for s in sched.waiting)
        assert all(c.n >= 1 and c.start == c.seq.num_computed and c.start + c.n <= len(c.seq.block_table) * bs
                   for c in plan.chunks)
        assert len({id(c.seq) for c in plan.chunks}) == len(plan.chunks)        # one chunk per sequence
        if sched.running:
            assert plan.chunks, "a step with running sequences planned nothing"
        for s in sched.update(plan, [token(c.seq) for c in plan.sampling]):
            if s.finished:
                finished_order.append(s.request_id)
        t += 1
    assert first_admissions == sorted(first_admissions)                         # FCFS
    assert sorted(finished_order) == list(range(n_requests))                   # each exactly once
    assert sorted(sched._free) == list(range(max_seqs)) and pool.num_free == num_blocks
    for s in reqs:
        assert s.finished and s.seq_slot is None and s.block_table == []
        made = s.new[:-1] if s.finish_reason == "stop" else s.new              # a stop ends on its stop id
        assert made == [1000 * s.request_id + i for i in range(len(made))]      # none lost, none repeated
        if s.finish_reason == "length":
            assert len(s.new) == s.params.max_tokens
        if s.finish_reason != "abort":
            assert s.num_computed == s.length - 1      # the last token is returned, never run
    return sched.stats.preemptions


def test_tiny_pools_do_preempt():
    """On pools of one or two requests' worth, preemption happens, and every request still gets all its tokens."""
    def preemptions(seed):
        rng = np.random.default_rng(seed)
        sched = scheduler(4, 32, num_blocks=12, block_size=4)
        reqs = [seq(i, int(rng.integers(1, 20)), 20) for i in range(8)]
        for s in reqs:
            sched.add(s)
        while sched.has_unfinished():
            plan = sched.schedule()
            sched.update(plan, [1] * len(plan.sampling))
        assert all(len(s.new) == 20 for s in reqs) and sched.blocks.num_free == 12
        return sched.stats.preemptions

    assert sum(for_each_seed(range(200), preemptions)) > 200


def test_time_shares_split_the_loop_between_prompt_steps_decode_steps_and_the_host():
    from ..scheduler import SchedulerStats

    s = SchedulerStats(forward_prefill_rows=[5, 0, 3, 0], forward_s=[0.4, 0.1, 0.2, 0.1], host_s=[0.05] * 4)
    assert s.prefill_time_share == pytest.approx(0.6 / 1.0)     # forwards 0.8 s + host 0.2 s
    assert s.host_time_share == pytest.approx(0.2 / 1.0)
    assert SchedulerStats().prefill_time_share == SchedulerStats().host_time_share == 0.0
