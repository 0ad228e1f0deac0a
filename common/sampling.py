"""SamplingParams: how one request picks its tokens and when it stops (the names and defaults are vLLM's)."""
from __future__ import annotations

from dataclasses import dataclass, field


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range; the message names it and its value (also kept as name, value,
    why, so that a CLI can name its own flag instead)."""

    def __init__(self, message: str, name: str = "", value=None, why: str = ""):
        super().__init__(message)
        self.name, self.value, self.why = name, value, why


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16               # new tokens at most (finish_reason "length" when reached)
    temperature: float = 1.0           # 0 = greedy (argmax, first index on ties)
    top_k: int = 0                     # keep the k most likely tokens; 0 or -1 = all
    top_p: float = 1.0                 # keep the smallest set whose probability reaches top_p
    seed: int | None = None            # per-request generator seed: same seed, same tokens
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # stop on these besides the model's eos
    ignore_eos: bool = False           # keep generating past eos (benchmarks), still stop on stop_token_ids

    def __post_init__(self):
        def bad(name, why):
            value = getattr(self, name)
            raise SamplingParamsError(f"SamplingParams.{name}={value!r}: {why}", name, value, why)

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature < float("inf"):
            bad("temperature", "must be a finite number >= 0 (0 means greedy)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            bad("top_k", "must be an integer >= 1, or 0 / -1 to disable")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**64):
            bad("seed", "must be None or an integer in [0, 2**64)")
        ids = self.stop_token_ids
        if isinstance(ids, int) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            bad("stop_token_ids", "must be a sequence of non-negative integers")
        object.__setattr__(self, "stop_token_ids", tuple(ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
