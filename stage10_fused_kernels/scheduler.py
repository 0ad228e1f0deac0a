"""Iteration-level scheduling (Orca's idea, vLLM's Scheduler) over a paged KV cache: every step plans one forward
anew, and memory is counted in blocks (block_manager.py), not in whole max_model_len regions.

    schedule():  1. one decode row for every running sequence that has one row left, in admission order; a row
                    whose position needs a new block when none is free preempts the most recently admitted
                    running sequence (possibly itself), until the block is free
                 2. the next chunk of every running sequence still being prefilled, while budget is left and
                    blocks are free (a chunk shrinks to the blocks there are); where nothing at all could be
                    planned, the newest running sequence is preempted so that the oldest can go on
                 3. admit waiting requests, first come first served, while a seq_slot is free, budget is left
                    and the blocks of the request's first chunk are free
    advance():   the step is launched: its chunks' K/V count as cached, and every sequence it samples for gets
                 a placeholder for its token, -1 - i for the step's i-th sampled id (still on the GPU)
    record():    the step's sampled ids replace the placeholders, for the sequences whose chunk ended at their
                 newest token; a sequence that stops frees its seq_slot and its blocks at once, for the next
                 schedule(). update() is the two at once

Preemption is by recompute (vLLM's default): the victim's blocks and seq_slot are freed, its tokens kept, and it
goes back to the front of the waiting queue; when readmitted it prefills its prompt and the tokens it had
generated, then samples its next token as if it had never stopped (its sampler counter is its count of tokens).
The oldest running sequence is never preempted by a younger one, and a request that fits the pool alone is
accepted (the engine refuses larger ones at add_request), so the oldest always advances: every request finishes.

Asynchronous scheduling (llm_engine.py) calls schedule() for step t+1 between advance() and record() of
step t: a decode row's token may be step t's placeholder (pack() sends the GPU where to find it), and a
sequence that will have stopped by length is not given a row. One that stops on a stop token is only known to
have stopped at record(t): its row in step t+1 was computed for nothing and is dropped.

The token budget, `max_num_batched_tokens`, bounds the rows of one forward; `max_num_seqs` bounds the sequences
holding a seq_slot (their number is no longer tied to max_model_len: blocks bound the memory). Decode rows are
planned first, so a long prompt never starves them. Rows are packed with no padding.

Pure Python: tested on the CPU (tests/test_scheduler_cpu.py), including randomised property tests with
preemption on a tiny pool.
"""
from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .block_manager import BlockManager
from .input_batch import InputBatch
from .sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledChunk:
    """Rows [start, start + n) of one sequence in this step's forward (positions start .. start + n - 1)."""

    seq: Sequence
    start: int
    n: int

    @property
    def samples(self) -> bool:
        """The chunk ends at the sequence's newest token, so that row's logits choose its next token."""
        return self.start + self.n == self.seq.length


class SchedulerOutput:
    """One step's plan, in the order its rows are packed: a decode row for each sequence of `decode` (their
    seq_slots decode_slots, their positions decode_positions), then the prompt chunks of `prefill`. The sequences
    it samples for: every decoding one, then each prompt chunk that ends at its sequence's newest token."""

    def __init__(self, decode: list[Sequence], decode_slots: np.ndarray, decode_positions: np.ndarray,
                 prefill: list[ScheduledChunk]):
        self.decode, self.decode_slots, self.decode_positions, self.prefill = decode, decode_slots, decode_positions, prefill
        self._last_chunks = last = [c for c in prefill if c.samples]
        self.sampling_seqs = decode + [c.seq for c in last]
        chunk_slots = np.array([c.seq.seq_slot for c in prefill], np.int64)
        self.sampling_slots = np.concatenate([decode_slots, chunk_slots[[c.samples for c in prefill]]
                                              if prefill else chunk_slots])
        self.slots = np.concatenate([decode_slots, chunk_slots])      # every row's seq_slot, a chunk once
        self.num_rows = len(decode) + sum(c.n for c in prefill)
        self.live: np.ndarray | None = None    # advance(): which sampled sequences were still running then

    @classmethod
    def from_chunks(cls, chunks: list[ScheduledChunk]) -> SchedulerOutput:
        """A plan written by hand (tests, the chapter's examples): its leading one-row chunks at their sequences'
        newest token are the decode rows."""
        k = 0
        while k < len(chunks) and chunks[k].n == 1 and 0 < chunks[k].start == chunks[k].seq.length - 1:
            k += 1
        decode = [c.seq for c in chunks[:k]]
        return cls(decode, np.array([s.seq_slot for s in decode], np.int64),
                   np.array([c.start for c in chunks[:k]], np.int32), list(chunks[k:]))

    def __bool__(self) -> bool:
        return self.num_rows > 0

    @property
    def admitted(self) -> list[Sequence]:
        """Sequences (re)admitted by this schedule(): their first chunk starts at position 0."""
        return [c.seq for c in self.prefill if c.start == 0]

    @cached_property
    def chunks(self) -> list[ScheduledChunk]:
        """Every row as chunks, decode rows first (what packing.pack() reads)."""
        return [ScheduledChunk(s, p, 1) for s, p in zip(self.decode, self.decode_positions.tolist())] + self.prefill

    @cached_property
    def sampling(self) -> list[ScheduledChunk]:
        return self.chunks[:len(self.decode)] + self._last_chunks


@dataclass
class SchedulerStats:
    """Counts over the steps. A slot-step is one seq_slot held for one step; it is used when that step gives its
    sequence a token (a sequence between two chunks of its prompt holds its seq_slot without one)."""

    steps: int = 0
    slot_steps_held: int = 0
    slot_steps_used: int = 0
    rows: list[int] = field(default_factory=list)            # per step: rows of the forward
    decode_rows: list[int] = field(default_factory=list)     # per step: rows that decode one token
    prefill_rows: list[int] = field(default_factory=list)    # per step: prompt rows (whole prompts and chunks)
    preemptions: int = 0                                     # running sequences sent back to the queue
    max_running: int = 0                                     # the most sequences running in one step
    host_s: list[float] = field(default_factory=list)        # per step: the loop's time outside the forward
    forward_s: list[float] = field(default_factory=list)     # per step: the forward, until the GPU is done
    forward_prefill_rows: list[int] = field(default_factory=list)   # per forward_s: prompt rows of the step waited on

    @property
    def slot_waste(self) -> float:
        return 1 - self.slot_steps_used / self.slot_steps_held if self.slot_steps_held else 0.0

    @property
    def prefill_time_share(self) -> float:
        """The share of the loop's time spent in forwards that carry prompt rows (whole prompts or chunks)."""
        total = sum(self.forward_s) + sum(self.host_s)
        return sum(f for f, p in zip(self.forward_s, self.forward_prefill_rows) if p) / total if total else 0.0

    @property
    def host_time_share(self) -> float:
        """The share of the loop's time outside the waits for the GPU (plan, pack, launch, record, detokenise):
        without asynchronous scheduling the GPU waits through it; with it, most of it runs while the GPU works."""
        total = sum(self.forward_s) + sum(self.host_s)
        return sum(self.host_s) / total if total else 0.0

    @property
    def padding_share(self) -> float:
        """Rows are packed: none is padding (stage04 reports the share it padded)."""
        return 0.0


class SchedulerError(ValueError):
    """A scheduler configuration that cannot work; the message names the figure."""


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, blocks: BlockManager, max_model_len: int):
        for name, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SchedulerError(f"{name}={v!r} must be an integer >= 1")
        if max_num_batched_tokens < max_num_seqs:   # every running sequence needs its decode row in each step
            raise SchedulerError(f"max_num_batched_tokens={max_num_batched_tokens} must be >= max_num_seqs="
                                 f"{max_num_seqs}: each running sequence decodes one row per step")
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len               # a sequence this long has stopped ("length")
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []                        # in admission order
        self._free: list[int] = list(range(max_num_seqs))        # a heap: the lowest free seq_slot first
        self.batch = InputBatch(max_num_seqs, self.max_model_len, blocks.block_size)   # the running ones' arrays
        self.stats = SchedulerStats()

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id) -> Sequence | None:
        """Finish the request as "abort" and free its seq_slot and blocks now; None for an unknown or finished
        request."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                self._finish(seq, "abort")
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self._finish(seq, "abort")
                return seq
        return None

    def schedule(self) -> SchedulerOutput:
        budget, blocks, bs, b = self.max_num_batched_tokens, self.blocks, self.blocks.block_size, self.batch
        preemptions_before, running = self.stats.preemptions, SequenceStatus.RUNNING
        run = b.running_slots()                                  # 1. decode rows, over the batch's arrays
        left = b.length[run] - b.num_computed[run]               # rows still to run: 1 is a decode row
        decode = run[(left == 1) & (b.length[run] < b.stop_length[run])]   # not one whose placeholder is its
        full = decode[b.num_computed[decode] >= b.num_blocks[decode] * bs]  # last token (asynchronous scheduling)
        for i in full.tolist():                                  # its last block is full: it needs one more
            s = b.seqs[i]
            if s is None:                                        # preempted by an older one
                continue
            p = s.num_computed                                   # the row's position
            while not blocks.can_grow(s, p + 1) and self._preempt(self.running[-1]) is not s:
                pass
            if s.status is not running:                          # it was the newest: preempted itself
                continue
            blocks.grow(s, p + 1)
            b.grew(s)
        if len(full):
            decode = decode[b.running[decode]]                   # without the preempted
        decode_seqs = [b.seqs[i] for i in decode.tolist()]
        budget -= len(decode)
        prefill = []
        for i in run[left > 1].tolist():                         # 2. prompt chunks of running sequences
            s = b.seqs[i]
            if not budget:
                break
            if s is None:                                        # preempted in 1.
                continue
            n = self._fit(s, s.num_computed, budget)
            while n == 0 and not decode_seqs and not prefill and self._preempt(self.running[-1]) is not s:
                n = self._fit(s, s.num_computed, budget)        # nothing planned yet: make room for the oldest
            if n:
                blocks.grow(s, s.num_computed + n)
                b.grew(s)
                prefill.append(ScheduledChunk(s, s.num_computed, n))
                budget -= n
        preempted = self.stats.preemptions > preemptions_before  # then no admission: the victims go first
        while self.waiting and self._free and budget and not preempted:   # 3. admissions
            s = self.waiting[0]
            n = min(s.length, budget)
            if self._fit(s, 0, budget) < n:                      # its first chunk's blocks are not all free
                break
            self.waiting.popleft()
            blocks.grow(s, n)
            s.status, s.seq_slot = SequenceStatus.RUNNING, heapq.heappop(self._free)
            if s.timing.queue_s is None:                         # its first admission, not a readmission
                s.timing.admit()
            self.running.append(s)
            b.admit(s)
            prefill.append(ScheduledChunk(s, 0, n))
            budget -= n
        st, rows = self.stats, self.max_num_batched_tokens - budget
        st.steps += 1
        st.slot_steps_held += len(self.running)
        st.max_running = max(st.max_running, len(self.running))
        st.rows.append(rows)
        st.decode_rows.append(len(decode))
        st.prefill_rows.append(rows - len(decode))
        return SchedulerOutput(decode_seqs, decode, b.num_computed[decode], prefill)

    def _fit(self, s: Sequence, start: int, budget: int) -> int:
        """Rows from `start` that s could run now: up to the budget and its last token, within the blocks it
        holds and the free ones (none are taken here)."""
        room = (len(s.block_table) + self.blocks.num_free) * self.blocks.block_size - start
        return max(0, min(s.length - start, budget, room))

    def _preempt(self, victim: Sequence) -> Sequence:
        """Free a running sequence's blocks and seq_slot; it waits at the front of the queue, tokens kept, to be
        prefilled again from position 0. Returns it."""
        self.running.remove(victim)
        heapq.heappush(self._free, victim.seq_slot)
        self.batch.leave(victim)
        self.blocks.free(victim)
        victim.status, victim.seq_slot, victim.num_computed, victim.blocks_synced = SequenceStatus.WAITING, None, 0, 0
        victim.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def update(self, plan: SchedulerOutput, sampled) -> list[Sequence]:
        """advance() and record() a step at once (the engine without asynchronous scheduling)."""
        self.advance(plan)
        return self.record(plan, sampled)

    def advance(self, plan: SchedulerOutput) -> None:
        """The step is launched: every chunk's K/V count as cached, and each sequence of plan.sampling_seqs gets
        its placeholder token, -1 - i for the i-th (the id the GPU samples for it, read back by record()). A
        sequence that finished (aborted, or stopped) since schedule() is skipped: its rows are dropped."""
        b = self.batch
        b.advance(plan.decode_slots, plan.sampling_slots)         # the arrays, over the batch at once
        plan.live = b.running[plan.sampling_slots]
        for s, alive in zip(plan.decode, b.running[plan.decode_slots].tolist()):   # the records: one add each
            if alive:
                s.num_computed += 1
        for c in plan.prefill:
            if not c.seq.finished:
                c.seq.num_computed += c.n
                b.num_computed[c.seq.seq_slot] += c.n
        seqs = plan.sampling_seqs
        for i in np.flatnonzero(plan.live).tolist():
            seqs[i].new.append(-1 - i)

    def record(self, plan: SchedulerOutput, sampled) -> list[Sequence]:
        """The advanced step's sampled ids, one per sequence of plan.sampling_seqs in that order, replace their
        placeholders (each its sequence's newest token: the next step is advanced only after this); the stop
        checks run over the batch at once (InputBatch.finished), and a sequence that stops frees its seq_slot
        and blocks. Returns the sequences that got a token (finished ones included), in plan order."""
        seqs, b = plan.sampling_seqs, self.batch
        if len(sampled) != len(seqs):
            raise ValueError(f"{len(sampled)} sampled tokens for {len(seqs)} sampling rows")
        if plan.live is None:
            raise RuntimeError("record() of a step that was not advance()d")
        ids = np.asarray(sampled, np.int32)
        got = np.flatnonzero(plan.live)           # those running at advance(): a sequence preempted since keeps
        slots = plan.sampling_slots[got]          # its row (no admission reuses a seq_slot in that schedule())
        wrong = np.flatnonzero(b.in_flight[slots] != got)
        if len(wrong):
            s = seqs[got[wrong[0]]]
            raise RuntimeError(f"request {s.request_id!r}: its newest token is not the placeholder "
                               f"{-1 - got[wrong[0]]} of the step being recorded")
        b.record(slots, ids[got])
        now, tokens, advanced = time.perf_counter(), ids.tolist(), []
        for i in got.tolist():                    # the records: each sequence's token, and when it came
            s = seqs[i]
            s.new[-1] = tokens[i]
            s.timing.tick(now)
            advanced.append(s)
        for k in np.flatnonzero(b.finished(slots, ids[got])).tolist():
            s = advanced[k]
            self._finish(s, "stop" if s.new[-1] in s.stop else "length")
        self.stats.slot_steps_used += len(advanced)
        return advanced

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            heapq.heappush(self._free, seq.seq_slot)
            self.batch.leave(seq)
        elif seq in self.waiting:              # preempted while its token was on the GPU, then stopped on it
            self.waiting.remove(seq)
        self.blocks.free(seq)                  # a waiting sequence holds none (a preempted one gave them back)
        seq.status, seq.finish_reason, seq.seq_slot = SequenceStatus.FINISHED, reason, None
