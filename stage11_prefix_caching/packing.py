"""One step's plan (scheduler.SchedulerOutput) as the arrays a forward reads: packed rows, no padding.

Each chunk of the plan becomes n consecutive rows, one per token, positions start .. start + n - 1. A row
carries everything the kernels need to treat it alone, because neighbouring rows may belong to any sequence:

    tokens        (R,) its input token
    positions     (R,) its position: RoPE's angle, and the last key it attends to (keys 0..position)
    slot_mapping  (R,) the cache slot its K/V go to: block_table[position // BS] * BS + position % BS, through
                       its sequence's block table (BS = block_size)
    seq_slots     (R,) whose block table it attends through (static batches could derive it from the row
                       index; packed rows cannot)
    logit_rows    (n,) the rows whose logits choose a token: the last row of every chunk that ends at its
                       sequence's newest token (a decode row, or a prompt's last chunk)
    logit_seq_slots (n,) their seq_slots: the sampler reads that sequence's parameters there
    counters      (n,) tokens generated so far by each of those sequences (the sampler's draw index)
    spans         (c, 4) each chunk's first row, rows, seq_slot and first position: attention's plan
                       (plan_attention) takes prompt chunks a tile of rows at a time, and the rest row by row
    table_updates (u, 2) the block-table entries the GPU lacks: (seq_slot * table_width + i, block) for every
                       block a sequence of the step got since its entries were last sent (seq.blocks_synced),
                       written by block_table.cu before the first layer
    prev_rows     (R,) or None: for a row whose token the step before is still sampling (asynchronous
                       scheduling: the placeholder -1 - i in the sequence), i, the index of that id among the
                       step before's sampled ids, which stay on the GPU; -1 for a row whose token is in tokens
                       (0 where it is not). None: every token is in tokens

pack() builds them from scratch, a Python loop over the plan's chunks; the engine gathers the same arrays from the
persistent batch (input_batch.py). Plain numpy: tested on the CPU (tests/test_packing_cpu.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .block_manager import blocks_for


@dataclass
class StepInputs:
    tokens: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    seq_slots: np.ndarray
    logit_rows: np.ndarray
    logit_seq_slots: np.ndarray
    counters: np.ndarray
    spans: np.ndarray
    table_updates: np.ndarray
    prev_rows: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return len(self.tokens)


def pack(plan, max_model_len: int, block_size: int) -> StepInputs:
    """The plan's rows packed from scratch, chunk by chunk from the Sequence objects: the definition, which tests
    hold equal to the persistent batch's (input_batch.InputBatch.prepare) and build hand-made steps with."""
    table_width = blocks_for(max_model_len, block_size)     # the GPU's block tables: entries per seq_slot
    tokens, positions, seq_slots, slots, logit_rows, logit_seq_slots, counters, spans = [], [], [], [], [], [], [], []
    updates = []
    for c in plan.chunks:
        s, start, n = c.seq, c.start, c.n
        length, table = s.length, s.block_table
        if start + n > min(length, max_model_len, len(table) * block_size):
            raise IndexError(f"request {s.request_id!r}: rows {start}..{start + n - 1} past its "
                             f"{length} tokens, max_model_len={max_model_len} or its {len(table)} blocks")
        if s.blocks_synced < len(table):    # blocks the GPU's copy of its table lacks: new ones, or all after
            base = s.seq_slot * table_width  # a (re)admission to this seq_slot
            updates += [x for i in range(s.blocks_synced, len(table)) for x in (base + i, table[i])]
            s.blocks_synced = len(table)
        spans += (len(tokens), n, s.seq_slot, start)
        if n == 1:                      # a decode row, most rows of most steps: no per-row lists built
            tokens.append(s.new[-1] if start == length - 1 and s.new else s.tokens(start, 1)[0])
            positions.append(start)
            seq_slots.append(s.seq_slot)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            pos = np.arange(start, start + n)
            tokens += s.tokens(start, n)
            positions += range(start, start + n)
            seq_slots += [s.seq_slot] * n
            slots += (np.asarray(table)[pos // block_size] * block_size + pos % block_size).tolist()
        if start + n == length:         # c.samples, without a second look at the sequence
            logit_rows.append(len(tokens) - 1)
            logit_seq_slots.append(s.seq_slot)
            counters.append(len(s.new))
    return with_prev_rows(StepInputs(
        np.array(tokens, np.int32), np.array(positions, np.int32), np.array(slots, np.int32),
        np.array(seq_slots, np.int32), np.array(logit_rows, np.int32), np.array(logit_seq_slots, np.int32),
        np.array(counters, np.int32), np.array(spans, np.int32).reshape(-1, 4),
        np.array(updates, np.int32).reshape(-1, 2)))


def with_prev_rows(step: StepInputs) -> StepInputs:
    """The step with its placeholders (-1 - i: the step before's i-th sampled id) moved to prev_rows, 0 in tokens."""
    pending = step.tokens < 0
    if pending.any():
        step.prev_rows = np.where(pending, -1 - step.tokens, -1).astype(np.int32)
        step.tokens[pending] = 0
    return step


def plan_attention(spans: np.ndarray, tile_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Attention's work as tiles (first row, rows, seq_slot, first position) i32: (prompt tiles (n, 4), decode
    tiles (m, 4)). A chunk of several rows (a prompt, or a chunk of one) is cut into tiles of at most tile_rows
    consecutive rows; a chunk of one row (a decode row) is a tile of its own, listed apart because its keys are
    split over blocks (flash-decoding) where a prompt tile's are not. tile_rows = 0 (no tensor-core kernel for the
    model's head_dim): every row is a one-row decode tile."""
    if tile_rows == 0:
        rows = np.arange(spans[:, 1].sum())
        which = np.repeat(np.arange(len(spans)), spans[:, 1])
        k = rows - spans[which, 0]
        single = np.stack([rows, np.ones_like(rows), spans[which, 2], spans[which, 3] + k], 1)
        return np.zeros((0, 4), np.int32), single.astype(np.int32).reshape(-1, 4)
    several = spans[spans[:, 1] > 1]
    counts = -(-several[:, 1] // tile_rows)                         # tiles per chunk
    which = np.repeat(np.arange(len(several)), counts)              # each tile's chunk
    k = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)   # its index within the chunk
    c, offset = several[which], k * tile_rows
    tiles = np.stack([c[:, 0] + offset, np.minimum(tile_rows, c[:, 1] - offset), c[:, 2], c[:, 3] + offset], 1)
    return tiles.astype(np.int32).reshape(-1, 4), spans[spans[:, 1] == 1].astype(np.int32).reshape(-1, 4)
