"""Static batching on the host: which requests run together, what every row of a forward computes, and the waste.

A static batch is fixed when it starts: its B sequences are prefilled together, then decoded together, one
token per sequence per step, until the last of them finishes. A sequence that finishes early keeps its seq_slot
(its index in the batch: its row of each decode step and its region of the cache) until then: an idle row, still
computed (the GEMMs have M = B either way), its output thrown away. `BatchStats` counts that waste; stage05
(continuous batching) gives the seq_slot to a waiting request instead.

Everything here is plain numpy and Python, so it is tested on the CPU; the engine uploads the arrays it builds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from common.outputs import Timing
from common.sampling import SamplingParams


def plan_batches(n_requests: int, max_batch_size: int) -> list[range]:
    """Requests in arrival order, max_batch_size at a time (first come, first served, as vLLM schedules)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
    return [range(i, min(i + max_batch_size, n_requests)) for i in range(0, n_requests, max_batch_size)]


@dataclass
class Sequence:
    """One request while it runs: its prompt, its own sampling parameters, and the tokens chosen so far."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    stop: frozenset[int]                   # stop ids (the model's unless ignore_eos, plus the request's)
    seed: int                              # the sampler's seed: params.seed, or a random one
    timing: Timing
    new: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.new)

    @property
    def running(self) -> bool:
        return self.finish_reason is None


@dataclass
class StepInputs:
    """What one forward computes, row by row (host arrays; the engine uploads them in one copy).

    tokens       (R,) the input token of each row
    positions    (R,) its position: RoPE's angle, and the last key it attends to (keys 0..position)
    slot_mapping (R,) the cache slot its K/V is written to, seq_slot * max_model_len + position; -1 = nothing
    logit_rows   (n,) the rows whose logits are wanted, in sequence order: logits row first_seq + i is row i's
    counters     (B,) tokens generated so far by each sequence of the batch (the sampler's draw index)
    rows_per_seq, first_seq: row r belongs to sequence first_seq + r // rows_per_seq
    """

    tokens: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    logit_rows: np.ndarray
    counters: np.ndarray
    rows_per_seq: int
    first_seq: int

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    @property
    def seq_slots(self) -> np.ndarray:
        """(R,) the seq_slot of every row, whose cache region it attends over (the kernel reads it per row)."""
        return self.first_seq + np.arange(self.num_rows, dtype=np.int32) // self.rows_per_seq

    @property
    def logit_seq_slots(self) -> np.ndarray:
        """(n,) the seq_slot of every logit row: logits row first_seq + i is sequence first_seq + i's."""
        return self.first_seq + np.arange(len(self.logit_rows), dtype=np.int32)

    @property
    def max_keys(self) -> int:
        """Keys the longest row attends to: the width of its attention score row."""
        return int(self.positions.max()) + 1


@dataclass
class BatchStats:
    """Counts over the batches of one generate(). A slot-step is one seq_slot held for one step: a row of the
    batch's forward, whether its sequence still runs or not."""

    batches: int = 0
    steps: int = 0                 # forwards that produced tokens: one per batch for prefill, then decode steps
    slot_steps_held: int = 0       # B per step of a batch of B
    slot_steps_used: int = 0       # rows whose token was kept: one per generated token
    prompt_tokens: int = 0
    prefill_rows: int = 0          # rows computed in prefill: prompt tokens plus padding

    @property
    def slot_waste(self) -> float:
        """The share of held slot-steps that computed a token nobody kept (idle rows of finished sequences)."""
        return 1 - self.slot_steps_used / self.slot_steps_held if self.slot_steps_held else 0.0

    @property
    def padding_share(self) -> float:
        """The share of prefill rows that were padding."""
        return 1 - self.prompt_tokens / self.prefill_rows if self.prefill_rows else 0.0


class StaticBatch:
    """B sequences run together from prefill to the end of the longest. Sequence i has seq_slot i: row i of
    each decode step, and cache slots i * max_model_len + position."""

    def __init__(self, seqs: list[Sequence], max_model_len: int, stats: BatchStats,
                 finish_reason: Callable[[Sequence], str | None], pad_token_id: int = 0):
        if not seqs:
            raise ValueError("a batch needs at least one sequence")
        self.seqs, self.max_model_len, self.stats = seqs, max_model_len, stats
        self.finish_reason, self.pad_token_id = finish_reason, pad_token_id
        stats.batches += 1

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def done(self) -> bool:
        return not any(s.running for s in self.seqs)

    def counters(self) -> np.ndarray:
        return np.array([len(s.new) for s in self.seqs], np.int32)

    def prefill_groups(self, max_rows: int, score_capacity: int) -> list[StepInputs]:
        """The batched prefill, as few forwards as fit: groups of consecutive sequences whose padded rows fit
        the activation buffers (max_rows) and whose attention scores fit the scratch (score_capacity per head:
        rows x keys). Each group is right-padded to its longest prompt.

        Right padding keeps a sequence's token t at row t and position t, exactly as when it runs alone, and
        leaves its last real row at a known index (len - 1), whose logits choose the first new token. A padding
        row gets the pad token at the sequence's last real position and writes no key (slot_mapping -1): it
        attends only to real keys, and no real row can read it (kernels/attention.cu)."""
        longest = max(len(s.prompt) for s in self.seqs)
        if longest > max_rows or longest * longest > score_capacity:
            raise ValueError(f"a {longest}-token prompt needs {longest} rows and {longest}^2 attention scores; "
                             f"the engine has {max_rows} rows and {score_capacity} scores per head")
        per_group = min(max_rows // longest, score_capacity // (longest * longest))
        groups = []
        for first in range(0, len(self.seqs), per_group):
            group = self.seqs[first:first + per_group]
            T = max(len(s.prompt) for s in group)
            R = len(group) * T
            tokens = np.full(R, self.pad_token_id, np.int32)
            positions, slot_mapping = np.empty(R, np.int32), np.full(R, -1, np.int32)
            logit_rows = np.empty(len(group), np.int32)
            for i, s in enumerate(group):
                n, row0, b = len(s.prompt), i * T, first + i
                tokens[row0:row0 + n] = s.prompt
                positions[row0:row0 + T] = np.minimum(np.arange(T), n - 1)
                slot_mapping[row0:row0 + n] = b * self.max_model_len + np.arange(n)
                logit_rows[i] = row0 + n - 1
            self.stats.prompt_tokens += sum(len(s.prompt) for s in group)
            self.stats.prefill_rows += R
            groups.append(StepInputs(tokens, positions, slot_mapping, logit_rows, self.counters(), T, first))
        return groups

    def decode_inputs(self) -> StepInputs:
        """One row per sequence. A running sequence feeds its newest token at position length - 1 and writes
        its K/V there. A finished one is idle: it feeds its last token at position length - 2 (the last one its
        cache holds; a sequence always has >= 2 tokens) and writes nothing, so its row stays finite and its
        output is ignored."""
        B, L = len(self.seqs), self.max_model_len
        tokens = np.array([s.new[-1] for s in self.seqs], np.int32)
        positions = np.array([s.length - (1 if s.running else 2) for s in self.seqs], np.int32)
        slot_mapping = np.array([b * L + p if s.running else -1
                                 for b, (s, p) in enumerate(zip(self.seqs, positions))], np.int32)
        if positions.max() >= L:
            raise IndexError(f"decode position {positions.max()} past max_model_len={L}")
        return StepInputs(tokens, positions, slot_mapping, np.arange(B, dtype=np.int32), self.counters(), 1, 0)

    def record(self, tokens) -> None:
        """One step's chosen token per row (B,): kept by the running sequences, which may then finish."""
        used = 0
        for s, tok in zip(self.seqs, tokens):
            if s.running:
                s.new.append(int(tok))
                s.timing.tick()
                s.finish_reason = self.finish_reason(s)
                used += 1
        self.stats.steps += 1
        self.stats.slot_steps_held += len(self.seqs)
        self.stats.slot_steps_used += used
