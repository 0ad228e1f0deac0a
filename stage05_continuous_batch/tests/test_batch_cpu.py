"""CPU: batch grouping, the rows a forward computes (padding, positions, slot_mapping), slot-step accounting and
the waste counter, all without a GPU: batch.py is plain numpy."""
import numpy as np
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams
from ..batch import BatchStats, Sequence, StaticBatch, plan_batches

L = 64   # max_model_len of these batches


def seq(rid, prompt_len, max_tokens=8, stop=()):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Sequence(rid, list(range(100 + rid, 100 + rid + prompt_len)), params, frozenset(stop), 0,
                    Timing(prompt_len))


def finish(s):
    if s.new[-1] in s.stop:
        return "stop"
    return "length" if len(s.new) >= s.params.max_tokens or s.length >= L else None


def batch(*seqs, stats=None, pad=0):
    return StaticBatch(list(seqs), L, stats or BatchStats(), finish, pad)


def test_requests_run_in_arrival_order_max_batch_size_at_a_time():
    assert plan_batches(10, 4) == [range(0, 4), range(4, 8), range(8, 10)]
    assert plan_batches(3, 64) == [range(0, 3)]
    assert plan_batches(0, 8) == []
    with pytest.raises(ValueError, match="max_batch_size=0"):
        plan_batches(5, 0)


def test_prefill_pads_on_the_right_and_padding_writes_nothing():
    b = batch(seq(0, 3), seq(1, 5), pad=7)
    (step,) = b.prefill_groups(max_rows=100, score_capacity=100)
    assert step.rows_per_seq == 5 and step.first_seq == 0 and step.num_rows == 10
    assert step.tokens.tolist() == [100, 101, 102, 7, 7, 101, 102, 103, 104, 105]
    assert step.positions.tolist() == [0, 1, 2, 2, 2, 0, 1, 2, 3, 4]          # padding at the last real position
    assert step.slot_mapping.tolist() == [0, 1, 2, -1, -1, L, L + 1, L + 2, L + 3, L + 4]
    assert step.logit_rows.tolist() == [2, 9]                                 # each sequence's last real row
    assert step.counters.tolist() == [0, 0] and step.max_keys == 5
    assert b.stats.prompt_tokens == 8 and b.stats.prefill_rows == 10 and b.stats.padding_share == pytest.approx(0.2)


def test_prefill_splits_into_groups_that_fit_rows_and_scores():
    seqs = [seq(i, n) for i, n in enumerate([4, 2, 3, 4, 1])]
    steps = batch(*seqs).prefill_groups(max_rows=8, score_capacity=100)     # 8 rows: 2 sequences of <= 4
    assert [(s.first_seq, s.rows_per_seq, s.num_rows) for s in steps] == [(0, 4, 8), (2, 4, 8), (4, 1, 1)]
    assert steps[1].slot_mapping.tolist()[:3] == [2 * L, 2 * L + 1, 2 * L + 2]   # seq_slot 2's region
    assert steps[1].seq_slots.tolist() == [2] * 4 + [3] * 4                  # what attention reads per row
    steps = batch(*seqs).prefill_groups(max_rows=100, score_capacity=40)    # 40 scores: 2 x 4 x 4
    assert [s.first_seq for s in steps] == [0, 2, 4]
    with pytest.raises(ValueError, match="a 4-token prompt"):
        batch(*seqs).prefill_groups(max_rows=3, score_capacity=100)


def test_decode_rows_advance_and_finished_rows_idle():
    a, b_ = seq(0, 3, max_tokens=1), seq(1, 5, max_tokens=3)
    b = batch(a, b_)
    b.prefill_groups(100, 100)
    b.record([11, 21])                                    # prefill's tokens: a is done (max_tokens=1)
    assert a.finish_reason == "length" and b_.running and not b.done
    step = b.decode_inputs()
    assert step.tokens.tolist() == [11, 21]
    assert step.positions.tolist() == [2, 5]              # a idles at its last cached position, b_ advances
    assert step.slot_mapping.tolist() == [-1, L + 5]             # the idle row writes nothing
    assert step.counters.tolist() == [1, 1] and step.rows_per_seq == 1
    b.record([99, 22])                                    # row a's token is thrown away
    b.record([98, 23])
    assert a.new == [11] and b_.new == [21, 22, 23] and b.done
    s = b.stats
    assert (s.steps, s.slot_steps_held, s.slot_steps_used) == (3, 6, 4)
    assert s.slot_waste == pytest.approx(2 / 6)


def test_a_stop_id_finishes_one_sequence_and_the_batch_waits_for_the_other():
    a, b_ = seq(0, 2, max_tokens=10, stop=[5]), seq(1, 2, max_tokens=4)
    b = batch(a, b_)
    for toks in ([1, 1], [5, 2], [6, 3], [7, 4]):
        b.record(toks)
    assert a.new == [1, 5] and a.finish_reason == "stop"
    assert b_.new == [1, 2, 3, 4] and b_.finish_reason == "length" and b.done
    assert b.stats.slot_steps_used == 6 and b.stats.slot_steps_held == 8


def test_the_last_position_is_never_passed():
    s = seq(0, L - 2, max_tokens=100)
    b = batch(s)
    b.record([1])                                         # length L - 1: one more step fits
    assert b.decode_inputs().positions.tolist() == [L - 2]
    b.record([2])
    assert s.finish_reason == "length" and s.length == L  # the token that fills the last slot is never run


def test_many_batches_share_one_stats_and_keep_request_order():
    """A request set larger than max_batch_size: each batch runs to its end before the next starts; outputs
    stay in request order, and the waste adds up over the batches."""
    max_tokens = [3, 1, 2, 2, 5]
    seqs = [seq(i, 2 + i, max_tokens=m) for i, m in enumerate(max_tokens)]
    stats, order = BatchStats(), []
    for group in plan_batches(len(seqs), 2):
        b = batch(*[seqs[i] for i in group], stats=stats)
        b.prefill_groups(100, 100)
        step = 0
        while not b.done:
            order.append([s.request_id for s in b.seqs if s.running])
            b.record([10 * step + s.request_id for s in b.seqs])
            step += 1
    assert [len(s.new) for s in seqs] == max_tokens
    assert seqs[4].new == [4, 14, 24, 34, 44]
    assert order == [[0, 1], [0], [0], [2, 3], [2, 3], [4], [4], [4], [4], [4]]
    assert stats.batches == 3 and stats.steps == 3 + 2 + 5
    assert stats.slot_steps_held == 2 * 3 + 2 * 2 + 1 * 5 and stats.slot_steps_used == sum(max_tokens)
    assert stats.slot_waste == pytest.approx(1 - 13 / 15)


def test_an_empty_batch_is_refused():
    with pytest.raises(ValueError, match="at least one sequence"):
        StaticBatch([], L, BatchStats(), finish)
