"""What generate() returns for each prompt, the same in every stage (vLLM's RequestOutput, flattened)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]          # generated tokens only (a stop token that ended the request is included)
    text: str                     # the generated tokens detokenised, special tokens skipped
    finish_reason: str | None     # "stop" (a stop id), "length" (max_tokens or max_model_len) or None (running)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
