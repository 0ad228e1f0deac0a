"""CPU: the persistent batch (input_batch.py) against the from-scratch pack (packing.pack) of the same plan, after
every step of random workloads with arrivals, aborts, preemptions, stops by stop id and by length, synchronous and
asynchronous (placeholders in flight); and its arrays against the Sequence objects they mirror."""
import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams
from common.testing import for_each_seed, seed_ranges

from ..block_manager import BlockManager, blocks_for
from ..packing import pack
from ..scheduler import Scheduler
from ..sequence import Sequence

STOP = 999_999
FIELDS = ("tokens", "positions", "slot_mapping", "seq_slots", "logit_rows", "logit_seq_slots", "counters", "spans",
          "table_updates", "prev_rows")


def assert_same_step(got, want, where: str) -> None:
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if a is None or b is None:
            assert a is None and b is None, f"{where}: {name} is {a} from the batch and {b} from pack()"
            continue
        assert a.dtype == np.int32, f"{where}: {name} is {a.dtype}"
        assert np.array_equal(a, b), f"{where}: {name}\n batch  {a.tolist()}\n pack() {b.tolist()}"


def assert_mirrors(sched: Scheduler, where: str) -> None:
    """Every running sequence's row of the batch holds what its Sequence says."""
    b = sched.batch
    assert sorted(np.flatnonzero(b.running).tolist()) == sorted(s.seq_slot for s in sched.running), where
    assert b.running_slots().tolist() == [s.seq_slot for s in sched.running], f"{where}: admission order"
    for s in sched.running:
        i = s.seq_slot
        row = (b.num_computed[i], b.length[i], b.num_new[i], b.num_blocks[i])
        assert row == (s.num_computed, s.length, len(s.new), len(s.block_table)), f"{where}: {s.request_id}"
        assert b.block_table[i, :b.num_blocks[i]].tolist() == s.block_table, f"{where}: {s.request_id}'s table"


def random_loop(seed) -> int:
    """A random workload driven as LLMEngine.step() drives it; returns the steps whose batch changed."""
    rng = np.random.default_rng(seed)
    asynchronous = bool(rng.integers(2))
    max_seqs, bs, L = int(rng.integers(1, 9)), int(rng.choice([1, 2, 4, 16])), int(rng.integers(24, 120))
    budget = max(int(rng.integers(4, 65)), max_seqs)
    n = int(rng.integers(1, 25))
    reqs = []
    for i in range(n):
        prompt = rng.integers(0, 1000, int(rng.integers(1, L - 1))).tolist()
        params = SamplingParams(max_tokens=int(rng.integers(1, 40)), temperature=0.0)
        reqs.append(Sequence(i, prompt, params, frozenset([STOP] if rng.random() < 0.7 else []), 0,
                             Timing(len(prompt))))
    need = max(blocks_for(min(len(s.prompt) + s.params.max_tokens - 1, L - 1), bs) for s in reqs)
    sched = Scheduler(max_seqs, budget, BlockManager(int(need * rng.choice([1, 1.5, 3, 20])), bs), L)
    stop_p, abort_p = rng.uniform(0, 0.15), rng.uniform(0, 0.05)
    arrive = sorted(int(x) for x in rng.integers(0, 30, n))
    pending, in_flight, t, changed = list(zip(arrive, reqs)), None, 0, 0
    while pending or sched.has_unfinished() or in_flight:
        assert t < 20_000, "a request waits forever"
        while pending and pending[0][0] <= t:
            sched.add(pending.pop(0)[1])
        if sched.running and rng.random() < abort_p:
            sched.abort(sched.running[int(rng.integers(len(sched.running)))].request_id)
        if in_flight:
            sched.advance(in_flight[0])
        assert_mirrors(sched, f"step {t}, before schedule()")
        plan = sched.schedule()
        launched = None
        if plan:
            where = f"step {t} ({'async' if asynchronous else 'sync'})"
            assert_same_step(sched.batch.prepare(plan), pack(plan, L, bs), where)
            changed += bool(plan.prefill) or len(plan.decode) != len(sched.running)
            ids = [STOP if rng.random() < stop_p else int(rng.integers(0, 1000)) for _ in plan.sampling_seqs]
            launched = (plan, ids)
        if launched and not asynchronous:
            sched.advance(plan)                  # synchronous: advanced at once, recorded in the same call
        done, in_flight = (in_flight, launched) if asynchronous else (launched, None)
        if done:
            sched.record(*done)
        t += 1
    for s in reqs:
        assert s.finished and (s.finish_reason != "stop" or s.new[-1] == STOP), s
        if s.finish_reason == "length":
            assert len(s.new) == s.params.max_tokens or s.length == L
    assert sched.blocks.num_free == sched.blocks.num_blocks and not sched.batch.running.any()
    return changed


@seed_ranges(300, 3000, copy_seeds=20, test_file=__file__)
def test_the_persistent_batch_packs_what_pack_packs_from_scratch(seeds):
    changed = for_each_seed(seeds, random_loop)
    assert sum(changed) > len(seeds)            # not vacuous: batches that change, not only steady decode


def test_a_steady_decode_step_reads_the_step_befores_ids_in_order():
    """Asynchronous scheduling, nothing joins or leaves: every row's token is the step before's id of the same
    index (prev_rows 0..B-1), and the positions advance by one."""
    sched = Scheduler(4, 64, BlockManager(100, 4), 64)
    for i in range(4):
        sched.add(Sequence(i, [1, 2, 3], SamplingParams(max_tokens=20), frozenset(), 0, Timing(3)))
    plan = sched.schedule()
    sched.advance(plan)                          # the prompts' step, in flight
    nxt = sched.schedule()
    x = sched.batch.prepare(nxt)
    assert x.prev_rows.tolist() == [0, 1, 2, 3] and x.tokens.tolist() == [0] * 4 and x.positions.tolist() == [3] * 4
    sched.record(plan, np.array([5, 6, 7, 8]))
    sched.advance(nxt)
    x = sched.batch.prepare(sched.schedule())
    assert x.prev_rows.tolist() == [0, 1, 2, 3] and x.positions.tolist() == [4] * 4


def test_a_wider_stop_set_and_a_longer_table_widen_the_arrays():
    sched = Scheduler(2, 64, BlockManager(100, 2), 64)
    a = Sequence("a", [1] * 30, SamplingParams(max_tokens=5), frozenset([7, 8, 9]), 0, Timing(30))
    sched.add(a)
    plan = sched.schedule()                      # 15 blocks of 2
    assert sched.batch.stop_ids.shape[1] == 3 and sched.batch.num_blocks[a.seq_slot] == 15
    sched.update(plan, np.array([8]))            # a stop id
    assert a.finish_reason == "stop" and not sched.batch.running.any()
    b = Sequence("b", [1] * 40, SamplingParams(max_tokens=5), frozenset(), 0, Timing(40))
    sched.add(b)
    x = sched.batch.prepare(sched.schedule())
    assert sched.batch.block_table.shape[1] >= 20 and len(x.table_updates) == 20


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_the_stop_checks_over_the_batch_follow_the_engines_rule(reason):
    """InputBatch.finished against common/prompts.finish_reason's rule: a stop id, max_tokens, max_model_len."""
    sched = Scheduler(3, 64, BlockManager(100, 4), 12)
    seqs = [Sequence(0, [1, 2], SamplingParams(max_tokens=9), frozenset([5]), 0, Timing(2)),
            Sequence(1, [1, 2], SamplingParams(max_tokens=1), frozenset(), 0, Timing(2)),
            Sequence(2, [1] * 11, SamplingParams(max_tokens=9), frozenset(), 0, Timing(11))]
    for s in seqs:
        sched.add(s)
    plan = sched.schedule()
    sched.update(plan, np.array([5 if reason == "stop" else 4, 4, 4]))
    assert [s.finish_reason for s in seqs] == [("stop" if reason == "stop" else None), "length", "length"]
