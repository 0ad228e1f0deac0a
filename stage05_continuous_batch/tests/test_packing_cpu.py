"""CPU: a step's plan becomes packed rows (no padding), each with its own position, cache slot and seq_slot, and
the rows whose logits choose a token."""
import pytest

from common.outputs import Timing
from common.sampling import SamplingParams

from ..packing import pack
from ..scheduler import Scheduler, ScheduledChunk, SchedulerOutput
from ..sequence import Sequence

L = 100   # max_model_len


def seq(rid, prompt, new=()):
    s = Sequence(rid, list(prompt), SamplingParams(max_tokens=50, temperature=0.0), frozenset(), 0, Timing(len(prompt)))
    s.new = list(new)
    return s


def test_decode_rows_and_prefill_chunks_pack_without_padding():
    decoding = seq("d", [11, 12, 13], new=[14, 15])            # 5 tokens, 4 cached: decodes token 15 at position 4
    decoding.seq_slot, decoding.num_computed = 2, 4
    long = seq("p", range(100, 110))                            # a 10-token prompt, first chunk of 6
    long.seq_slot = 0
    tail = seq("t", [7, 8, 9])                                  # a 3-token prompt, its last 2 tokens
    tail.seq_slot, tail.num_computed = 5, 1
    plan = SchedulerOutput([ScheduledChunk(decoding, 4, 1), ScheduledChunk(long, 0, 6), ScheduledChunk(tail, 1, 2)])
    x = pack(plan, L)
    assert x.tokens.tolist() == [15, 100, 101, 102, 103, 104, 105, 8, 9]
    assert x.positions.tolist() == [4, 0, 1, 2, 3, 4, 5, 1, 2]
    assert x.seq_slots.tolist() == [2, 0, 0, 0, 0, 0, 0, 5, 5]
    assert x.slot_mapping.tolist() == [2 * L + 4] + [p for p in range(6)] + [5 * L + 1, 5 * L + 2]
    assert x.logit_rows.tolist() == [0, 8]                      # the middle chunk samples nothing yet
    assert x.logit_seq_slots.tolist() == [2, 5] and x.counters.tolist() == [2, 0]
    assert x.num_rows == 9 and x.max_keys == 6


def test_rows_past_the_sequence_or_max_model_len_are_refused():
    s = seq("a", [1, 2, 3])
    s.seq_slot = 0
    with pytest.raises(IndexError, match="past its 3 tokens"):
        pack(SchedulerOutput([ScheduledChunk(s, 2, 2)]), L)
    with pytest.raises(IndexError, match="max_model_len=2"):
        pack(SchedulerOutput([ScheduledChunk(s, 0, 3)]), 2)


def test_what_the_scheduler_plans_packs_to_its_budget():
    sched = Scheduler(max_num_seqs=3, max_num_batched_tokens=16)
    for i, n in enumerate((5, 30, 2)):
        sched.add(seq(i, range(1, n + 1)))
    x = pack(sched.schedule(), L)
    assert x.num_rows == 16 and x.seq_slots.tolist() == [0] * 5 + [1] * 11
    assert x.logit_rows.tolist() == [4]                         # only the 5-token prompt completed
