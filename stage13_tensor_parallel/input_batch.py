"""The persistent batch (vLLM's InputBatch): the running sequences' per-step numbers in arrays by seq_slot that live
from step to step, so a step reads and writes arrays instead of walking 256 Python objects.

    token        (B,)   the sequence's newest token, when the host has it
    in_flight    (B,)   i: its newest token is the i-th sampled id of the step in flight, still on the GPU; -1: none
    num_computed (B,)   tokens whose K/V are cached: the position of its next row
    length       (B,)   prompt + generated tokens, the one in flight included
    num_new      (B,)   generated tokens, the one in flight included (the sampler's counter)
    stop_length  (B,)   the length at which it stops by length: min(prompt + max_tokens, max_model_len)
    stop_ids     (B, K) its stop ids, padded with -1 (K grows to the longest set seen)
    block_table  (B, .) its blocks, the first num_blocks of them, of which the GPU's tables hold the first synced
                        (the array widens as tables grow; the GPU's tables are blocks_for(max_model_len) wide)
    order        (B,)   when it was admitted: decode rows go in admission order

A row is written whole when its sequence is admitted (admit), and after that only where a step changes it: a decode
step advances num_computed, length and num_new of the rows it ran by one each (advance), and record() writes the
sampled ids into token. A new block is one entry (grew). So a decode step whose batch did not change touches no
Python object to pack its inputs: prepare() gathers them from the arrays by slicing, and the stop checks are
compared over the batch at once (finished). What stays per sequence is what the caller is given: its token
appended to its list of tokens, and its output.

The arrays mirror the scheduler's Sequence objects (sequence.py), which remain the record of each request;
tests/test_input_batch_cpu.py checks after every step of random workloads that prepare() equals packing.pack(),
the from-scratch pack of the same plan.
"""
from __future__ import annotations

import numpy as np

from .block_manager import blocks_for
from .packing import StepInputs, with_prev_rows
from .sequence import Sequence

I32 = np.int32


class InputBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, block_size: int):
        B = max_num_seqs
        self.max_model_len, self.block_size = max_model_len, block_size
        self.table_width = blocks_for(max_model_len, block_size)    # entries per seq_slot on the GPU
        self.seqs: list[Sequence | None] = [None] * B        # the sequence holding each seq_slot
        self.running = np.zeros(B, bool)
        self.order = np.zeros(B, np.int64)
        self._admissions = 0
        self.token, self.in_flight = np.zeros(B, I32), np.full(B, -1, I32)
        self.num_computed, self.length, self.num_new = np.zeros(B, I32), np.zeros(B, I32), np.zeros(B, I32)
        self.stop_length = np.zeros(B, I32)
        self.stop_ids = np.full((B, 1), -1, I32)
        self.block_table = np.zeros((B, 16), I32)
        self.num_blocks, self.synced = np.zeros(B, I32), np.zeros(B, I32)

    # ------------------------------------------------------------------ what changes a row
    def admit(self, s: Sequence) -> None:
        """Write the row of a sequence just given a seq_slot (a first admission or a readmission after a
        preemption): every field, from the Sequence."""
        i = s.seq_slot
        self.seqs[i], self.running[i] = s, True
        self.order[i], self._admissions = self._admissions, self._admissions + 1
        self.token[i] = s.new[-1] if s.new else s.prompt[-1]
        self.in_flight[i] = -1
        self.num_computed[i], self.length[i], self.num_new[i] = s.num_computed, s.length, len(s.new)
        self.stop_length[i] = min(len(s.prompt) + s.params.max_tokens, self.max_model_len)
        if len(s.stop) > self.stop_ids.shape[1]:           # a longer stop set than any before: widen
            wider = np.full((len(self.seqs), len(s.stop)), -1, I32)
            wider[:, :self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        self.stop_ids[i] = -1
        self.stop_ids[i, :len(s.stop)] = sorted(s.stop)
        self.num_blocks[i] = self.synced[i] = 0
        self.grew(s)

    def grew(self, s: Sequence) -> None:
        """s got blocks (block_manager.grow): the new entries of its table."""
        i, n = s.seq_slot, len(s.block_table)
        if n > self.block_table.shape[1]:
            wider = np.zeros((len(self.seqs), 2 * n), I32)
            wider[:, :self.block_table.shape[1]] = self.block_table
            self.block_table = wider
        self.block_table[i, self.num_blocks[i]:n] = s.block_table[self.num_blocks[i]:]
        self.num_blocks[i] = n

    def leave(self, s: Sequence) -> None:
        """s gave its seq_slot back (finished or preempted): its row is free until the next admit()."""
        self.running[s.seq_slot], self.seqs[s.seq_slot] = False, None

    def running_slots(self) -> np.ndarray:
        """The running sequences' seq_slots in admission order."""
        slots = np.flatnonzero(self.running)
        return slots[np.argsort(self.order[slots], kind="stable")]

    def advance(self, decode: np.ndarray, sampling: np.ndarray) -> None:
        """A step was launched: its decode rows (seq_slots) have one more position cached, and each sequence it
        samples for (seq_slots, in the order of its sampled ids) one more token, in flight."""
        self.num_computed[decode] += 1
        self.length[sampling] += 1
        self.num_new[sampling] += 1
        self.in_flight[sampling] = np.arange(len(sampling), dtype=I32)

    def record(self, slots: np.ndarray, ids: np.ndarray) -> None:
        """The in-flight tokens of these seq_slots are the host's now."""
        self.token[slots], self.in_flight[slots] = ids, -1

    def finished(self, slots: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """(n,) bool: which of these sequences stop with their newest token, ids: a stop id, max_tokens or
        max_model_len (the rule of common/prompts.finish_reason, over the batch at once)."""
        return (self.stop_ids[slots] == ids[:, None]).any(1) | (self.length[slots] >= self.stop_length[slots])

    # ------------------------------------------------------------------ a step's inputs
    def prepare(self, plan) -> StepInputs:
        """The plan's rows as packing.pack() packs them, decode rows gathered from the arrays (called before
        advance(): num_computed is each decode row's position)."""
        d, bs = plan.decode_slots, self.block_size
        pos = self.num_computed[d]
        flying = self.in_flight[d]
        rows = np.arange(len(d), dtype=I32)
        parts = [(np.where(flying >= 0, -1 - flying, self.token[d]), pos, self.block_table[d, pos // bs] * bs + pos % bs,
                  d, rows, d, self.num_new[d], np.stack([rows, np.ones_like(rows), d, pos], 1))]
        row = len(d)
        for c in plan.prefill:                 # prompt chunks: a few a step, each its own arrays
            s, i, p = c.seq, c.seq.seq_slot, np.arange(c.start, c.start + c.n, dtype=I32)
            if c.start + c.n > min(s.length, self.max_model_len, self.num_blocks[i] * bs):
                raise IndexError(f"request {s.request_id!r}: rows {c.start}..{c.start + c.n - 1} past its "
                                 f"{s.length} tokens, max_model_len={self.max_model_len} or its "
                                 f"{self.num_blocks[i]} blocks")
            one = np.array([i], I32)
            last = (np.array([row + c.n - 1], I32), one, np.array([len(s.new)], I32)) if c.samples else (rows[:0],) * 3
            parts.append((s.tokens(c.start, c.n), p, self.block_table[i, p // bs] * bs + p % bs, np.full(c.n, i, I32),
                          *last, np.array([[row, c.n, i, c.start]], I32)))
            row += c.n
        fields = [np.concatenate(f).astype(I32) if len(parts) > 1 else f[0].astype(I32) for f in zip(*parts)]
        return with_prev_rows(StepInputs(*fields, self.table_updates(plan.slots)))

    def table_updates(self, slots: np.ndarray) -> np.ndarray:
        """(u, 2) the entries of these seq_slots' block tables the GPU lacks, (seq_slot * W + i, block): those of
        a sequence that crossed into a new block, or all of one (re)admitted. From now on the GPU has them."""
        stale = slots[self.synced[slots] < self.num_blocks[slots]]
        counts = self.num_blocks[stale] - self.synced[stale]
        rows = np.repeat(stale, counts)
        first = np.repeat(np.cumsum(counts) - counts - self.synced[stale], counts)   # entry k of row: k - first
        k = np.arange(len(rows)) - first
        self.synced[stale] = self.num_blocks[stale]
        return np.stack([rows * self.table_width + k, self.block_table[rows, k]], 1).astype(I32)   # int64 to here
