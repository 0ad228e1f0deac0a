"""What generate() returns for each prompt, and step() for each request that advanced, the same in every stage
(vLLM's RequestOutput, flattened: cumulative tokens and text, plus the step's delta)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    request_id: int | str
    prompt_token_ids: list[int]
    token_ids: list[int]          # generated tokens only (a stop token that ended the request is included)
    text: str                     # the generated tokens detokenised, special tokens skipped
    finish_reason: str | None     # "stop" (a stop id), "length" (max_tokens or max_model_len), "abort", or None
    #                               while running
    new_token_ids: list[int] = field(default_factory=list)   # step(): the tokens this step added
    text_delta: str = ""          # step(): the text they completed (a partial UTF-8 character waits for the next)
    num_cached_tokens: int = 0    # prompt tokens found in a prefix cache at its first admission (vLLM's name)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def drain(request_id: int, prompt_ids: list[int], stream, tokenizer) -> RequestOutput:
    """Run an engine's stream of (token id, finish reason) to its end and package the result."""
    new, reason = [], None
    for tok, reason in stream:
        new.append(tok)
    return RequestOutput(request_id, prompt_ids, new, tokenizer.decode(new), reason)


@dataclass
class Timing:
    """Wall-clock times of one request as its user sees them (engines keep one per request in `timings`).
    Create it when the request starts; call tick() as each new token reaches the host."""

    prompt_tokens: int
    ttft_s: float | None = None                                # request start -> first new token
    step_s: list[float] = field(default_factory=list)          # each later token: time since the one before
    queue_s: float | None = None                               # request start -> its first forward (where kept)
    start: float = field(default_factory=time.perf_counter, repr=False)
    last: float = field(default=0.0, repr=False)

    def admit(self) -> None:
        """The request leaves the waiting queue: its first rows go into a forward."""
        self.queue_s = time.perf_counter() - self.start

    def tick(self, now: float | None = None) -> None:
        """A new token reached the host, now (perf_counter; a loop that records many at once reads the clock
        once)."""
        now = time.perf_counter() if now is None else now
        if self.ttft_s is None:
            self.ttft_s = now - self.start
        else:
            self.step_s.append(now - self.last)
        self.last = now
