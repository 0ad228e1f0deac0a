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
    update():    the forward's sampled tokens go to the sequences whose chunk ended at their newest token; a
                 sequence that stops frees its seq_slot and its blocks at once, for the next schedule()

Preemption is by recompute (vLLM's default): the victim's blocks and seq_slot are freed, its tokens kept, and it
goes back to the front of the waiting queue; when readmitted it prefills its prompt and the tokens it had
generated, then samples its next token as if it had never stopped (its sampler counter is its count of tokens).
The oldest running sequence is never preempted by a younger one, and a request that fits the pool alone is
accepted (the engine refuses larger ones at add_request), so the oldest always advances: every request finishes.

The token budget, `max_num_batched_tokens`, bounds the rows of one forward; `max_num_seqs` bounds the sequences
holding a seq_slot (their number is no longer tied to max_model_len: blocks bound the memory). Decode rows are
planned first, so a long prompt never starves them. Rows are packed with no padding.

Pure Python: tested on the CPU (tests/test_scheduler_cpu.py), including randomised property tests with
preemption on a tiny pool.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from .block_manager import BlockManager
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


@dataclass
class SchedulerOutput:
    """One step's plan: chunks in the order their rows are packed (decode rows first)."""

    chunks: list[ScheduledChunk]

    @property
    def num_rows(self) -> int:
        return sum(c.n for c in self.chunks)

    @cached_property          # pack() and update() both read it; the plan does not change after schedule()
    def sampling(self) -> list[ScheduledChunk]:
        return [c for c in self.chunks if c.samples]


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

    @property
    def slot_waste(self) -> float:
        return 1 - self.slot_steps_used / self.slot_steps_held if self.slot_steps_held else 0.0

    @property
    def prefill_time_share(self) -> float:
        """The share of the loop's time spent in forwards that carry prompt rows (whole prompts or chunks)."""
        total = sum(self.forward_s) + sum(self.host_s)
        return sum(f for f, p in zip(self.forward_s, self.prefill_rows) if p) / total if total else 0.0

    @property
    def host_time_share(self) -> float:
        """The share of the loop's time the GPU waits on the host (plan, pack, record, detokenise)."""
        total = sum(self.forward_s) + sum(self.host_s)
        return sum(self.host_s) / total if total else 0.0

    @property
    def padding_share(self) -> float:
        """Rows are packed: none is padding (stage04 reports the share it padded)."""
        return 0.0


class SchedulerError(ValueError):
    """A scheduler configuration that cannot work; the message names the figure."""


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, blocks: BlockManager):
        for name, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SchedulerError(f"{name}={v!r} must be an integer >= 1")
        if max_num_batched_tokens < max_num_seqs:   # every running sequence needs its decode row in each step
            raise SchedulerError(f"max_num_batched_tokens={max_num_batched_tokens} must be >= max_num_seqs="
                                 f"{max_num_seqs}: each running sequence decodes one row per step")
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []                        # in admission order
        self._free: list[int] = list(range(max_num_seqs))        # a heap: the lowest free seq_slot first
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
        budget, blocks, bs = self.max_num_batched_tokens, self.blocks, self.blocks.block_size
        chunks, preemptions_before, running = [], self.stats.preemptions, SequenceStatus.RUNNING
        for s in list(self.running):                             # 1. decode rows (the list changes as we preempt)
            if s.status is not running or s.prefilling:          # preempted by an older one, or prefilling
                continue
            p = s.num_computed                                   # the row's position
            if p >= len(s.block_table) * bs:                     # its last block is full: it needs one more
                while not blocks.can_grow(s, p + 1) and self._preempt(self.running[-1]) is not s:
                    pass
                if s.status is not running:                      # it was the newest: preempted itself
                    continue
                blocks.grow(s, p + 1)
            chunks.append(ScheduledChunk(s, p, 1))
        decoding = len(chunks)
        budget -= decoding
        for s in list(self.running):                             # 2. prompt chunks of running sequences
            if not budget or not s.prefilling or s.status is not SequenceStatus.RUNNING:
                continue
            n = self._fit(s, s.num_computed, budget)
            while n == 0 and not chunks and self._preempt(self.running[-1]) is not s:
                n = self._fit(s, s.num_computed, budget)        # nothing planned yet: make room for the oldest
            if n:
                blocks.grow(s, s.num_computed + n)
                chunks.append(ScheduledChunk(s, s.num_computed, n))
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
            chunks.append(ScheduledChunk(s, 0, n))
            budget -= n
        st, rows = self.stats, self.max_num_batched_tokens - budget
        st.steps += 1
        st.slot_steps_held += len(self.running)
        st.max_running = max(st.max_running, len(self.running))
        st.rows.append(rows)
        st.decode_rows.append(decoding)
        st.prefill_rows.append(rows - decoding)
        return SchedulerOutput(chunks)

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
        self.blocks.free(victim)
        victim.status, victim.seq_slot, victim.num_computed, victim.blocks_synced = SequenceStatus.WAITING, None, 0, 0
        victim.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    def update(self, plan: SchedulerOutput, sampled, finish_reason: Callable[[Sequence], str | None]
               ) -> list[Sequence]:
        """Record a step: every chunk's K/V are now cached; `sampled` holds one token per chunk of
        plan.sampling, in that order. Returns the sequences that got a token (finished ones included)."""
        samplers = plan.sampling
        if len(sampled) != len(samplers):
            raise ValueError(f"{len(sampled)} sampled tokens for {len(samplers)} sampling rows")
        for c in plan.chunks:
            if not c.seq.finished:             # aborted between schedule() and update(): its rows are dropped
                c.seq.num_computed += c.n
        advanced = []
        for c, token in zip(samplers, sampled.tolist() if hasattr(sampled, "tolist") else sampled):
            s = c.seq                          # plan.sampling keeps the chunks' order, so advanced does too
            if s.finished:
                continue
            s.new.append(token)
            s.timing.tick()
            advanced.append(s)
            reason = finish_reason(s)
            if reason is not None:
                self._finish(s, reason)
        self.stats.slot_steps_used += len(advanced)
        return advanced

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            heapq.heappush(self._free, seq.seq_slot)
        self.blocks.free(seq)                  # a waiting sequence holds none (a preempted one gave them back)
        seq.status, seq.finish_reason, seq.seq_slot = SequenceStatus.FINISHED, reason, None
