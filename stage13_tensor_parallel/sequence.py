"""One request while the engine holds it: its tokens, its parameters, where it is in its life, its seq_slot and its
block table.

    WAITING --admitted (a seq_slot and its first chunk's blocks are free)--> RUNNING --stop / length / abort--> FINISHED
    RUNNING --preempted (a running sequence needs a block, none is free)--> WAITING (at the front of the queue)
    WAITING --abort--> FINISHED

A RUNNING sequence owns one seq_slot, its index in the engine's per-sequence arrays (sampling parameters, the
sampler's counter, its row of the device's block tables), and the blocks of its block table: the KV cache
positions 0..num_computed-1 live in them (block_manager.py). `num_computed` counts the tokens whose K/V are
cached; the rows num_computed..length-1 are still to run. One row left is a decode step; more is a prefill,
chunk by chunk when they pass a step's token budget: a prompt, or, after a preemption freed the sequence's
blocks, its prompt and every token it had generated (recompute: the K/V are computed again, the tokens kept).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from common.outputs import Timing
from common.sampling import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)        # identity, not value: two requests with equal prompts are two sequences
class Sequence:
    request_id: int | str
    prompt: list[int]
    params: SamplingParams
    stop: frozenset[int]                   # stop ids (the model's unless ignore_eos, plus the request's)
    seed: int                              # the sampler's seed: params.seed, or a random one
    timing: Timing
    new: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    seq_slot: int | None = None            # held while RUNNING
    num_computed: int = 0                  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)   # the blocks holding them, in position order
    blocks_synced: int = 0                 # of which the GPU's block tables hold the first this many
    block_hashes: list[bytes] = field(default_factory=list)   # its full blocks' hashes, as they fill
    blocks_offered: int = 0                # of its table's blocks, the first this many were offered to the cache
    num_cached_tokens: int = 0             # prompt tokens found in the prefix cache at its first admission
    num_preemptions: int = 0
    finish_reason: str | None = None       # "stop", "length" or "abort"

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.new)

    def tokens(self, start: int, n: int) -> list[int]:
        """(prompt + new)[start:start + n] without building prompt + new: a decode row every step must not copy
        the whole sequence (that copy, per running sequence per step, grew with the outputs)."""
        p = len(self.prompt)
        if start >= p:
            return self.new[start - p:start - p + n]
        return self.prompt[start:start + n] if start + n <= p else self.prompt[start:] + self.new[:start + n - p]

    @property
    def prefilling(self) -> bool:
        """More than the newest token's K/V are not in the cache yet (a prompt, or all of a preempted sequence)."""
        return len(self.prompt) + len(self.new) - self.num_computed > 1     # (self.length, inlined: hot)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
