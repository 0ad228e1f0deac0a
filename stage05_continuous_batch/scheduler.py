"""Iteration-level scheduling (Orca's idea, vLLM's Scheduler): every step plans one forward anew.

    schedule():  1. one decode row for every running sequence that has finished its prompt
                 2. the next chunk of every running sequence still being prefilled, while budget is left
                 3. admit waiting requests, first come first served, while a seq_slot is free and budget is left;
                    each brings (a chunk of) its prompt
    update():    the forward's sampled tokens go to the sequences whose chunk ended at their newest token; a
                 sequence that stops frees its seq_slot at once, for the next schedule() to give away

The token budget, `max_num_batched_tokens`, bounds the rows of one forward; `max_num_seqs` bounds the sequences
holding a seq_slot. Decode rows are planned first, so a long prompt never starves them: it is prefilled in chunks
of what budget the step has left (chunked prefill, vLLM's default). Rows are packed with no padding.

Pure Python: tested on the CPU (tests/test_scheduler_cpu.py), including a randomised property test.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

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
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int):
        for name, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SchedulerError(f"{name}={v!r} must be an integer >= 1")
        if max_num_batched_tokens < max_num_seqs:   # every running sequence needs its decode row in each step
            raise SchedulerError(f"max_num_batched_tokens={max_num_batched_tokens} must be >= max_num_seqs="
                                 f"{max_num_seqs}: each running sequence decodes one row per step")
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
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
        """Finish the request as "abort" and free its seq_slot now; None for an unknown or finished request."""
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
        budget = self.max_num_batched_tokens
        decoding = [s for s in self.running if not s.prefilling]
        chunks = [ScheduledChunk(s, s.num_computed, 1) for s in decoding]
        budget -= len(chunks)
        for s in self.running:
            if budget and s.prefilling:
                n = min(len(s.prompt) - s.num_computed, budget)
                chunks.append(ScheduledChunk(s, s.num_computed, n))
                budget -= n
        while self.waiting and self._free and budget:
            s = self.waiting.popleft()
            s.status, s.seq_slot = SequenceStatus.RUNNING, heapq.heappop(self._free)
            s.timing.admit()
            self.running.append(s)
            n = min(len(s.prompt), budget)
            chunks.append(ScheduledChunk(s, 0, n))
            budget -= n
        st, rows = self.stats, self.max_num_batched_tokens - budget
        st.steps += 1
        st.slot_steps_held += len(self.running)
        st.rows.append(rows)
        st.decode_rows.append(len(decoding))
        st.prefill_rows.append(rows - len(decoding))
        return SchedulerOutput(chunks)

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
        seq.status, seq.finish_reason, seq.seq_slot = SequenceStatus.FINISHED, reason, None
