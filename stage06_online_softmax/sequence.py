"""One request while the engine holds it: its tokens, its parameters, where it is in its life, and its seq_slot.

    WAITING --admitted (a seq_slot is free, the step has budget)--> RUNNING --stop / length / abort--> FINISHED
    WAITING --abort--> FINISHED

A RUNNING sequence owns one seq_slot: its index in the engine's per-sequence arrays (sampling parameters, the
sampler's counter) and its region of the KV cache. `num_computed` counts the tokens whose K/V are in that region:
while it is below the prompt's length the sequence is still being prefilled (chunk by chunk when the prompt is
longer than a step's token budget); after that, each step computes the one newest token.
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
        """Some of the prompt's K/V are not in the cache yet."""
        return self.num_computed < len(self.prompt)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
