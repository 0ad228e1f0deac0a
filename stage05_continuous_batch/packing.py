"""One step's plan (scheduler.SchedulerOutput) as the arrays a forward reads: packed rows, no padding.

Each chunk of the plan becomes n consecutive rows, one per token, positions start .. start + n - 1. A row
carries everything the kernels need to treat it alone, because neighbouring rows may belong to any sequence:

    tokens        (R,) its input token
    positions     (R,) its position: RoPE's angle, and the last key it attends to (keys 0..position)
    slot_mapping  (R,) the cache slot its K/V go to: seq_slot * max_model_len + position
    seq_slots     (R,) whose cache region it attends over (static batches could derive it from the row index;
                       packed rows cannot, so attention reads it per row)
    logit_rows    (n,) the rows whose logits choose a token: the last row of every chunk that ends at its
                       sequence's newest token (a decode row, or a prompt's last chunk)
    logit_seq_slots (n,) their seq_slots: the sampler reads that sequence's parameters there
    counters      (n,) tokens generated so far by each of those sequences (the sampler's draw index)

Plain numpy: tested on the CPU (tests/test_packing_cpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .scheduler import SchedulerOutput


@dataclass
class StepInputs:
    tokens: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    seq_slots: np.ndarray
    logit_rows: np.ndarray
    logit_seq_slots: np.ndarray
    counters: np.ndarray

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    @property
    def max_keys(self) -> int:
        """Keys the furthest row attends to: the width of an attention score row."""
        return int(self.positions.max()) + 1


def pack(plan: SchedulerOutput, max_model_len: int) -> StepInputs:
    tokens, positions, seq_slots, logit_rows, logit_seq_slots, counters = [], [], [], [], [], []
    for c in plan.chunks:
        s, start, n = c.seq, c.start, c.n
        length = s.length
        if start + n > min(length, max_model_len):
            raise IndexError(f"request {s.request_id!r}: rows {start}..{start + n - 1} past its "
                             f"{length} tokens or max_model_len={max_model_len}")
        if n == 1:                      # a decode row, most rows of most steps: no per-row lists built
            tokens.append(s.new[-1] if start == length - 1 and s.new else s.tokens(start, 1)[0])
            positions.append(start)
            seq_slots.append(s.seq_slot)
        else:
            tokens += s.tokens(start, n)
            positions += range(start, start + n)
            seq_slots += [s.seq_slot] * n
        if start + n == length:         # c.samples, without a second look at the sequence
            logit_rows.append(len(tokens) - 1)
            logit_seq_slots.append(s.seq_slot)
            counters.append(len(s.new))
    positions_a, seq_slots_a = np.array(positions, np.int32), np.array(seq_slots, np.int32)
    return StepInputs(np.array(tokens, np.int32), positions_a, seq_slots_a * max_model_len + positions_a,
                      seq_slots_a, np.array(logit_rows, np.int32), np.array(logit_seq_slots, np.int32),
                      np.array(counters, np.int32))
