"""The OpenAI request bodies the server accepts, their mapping onto SamplingParams, and errors in OpenAI's shape.

    POST /v1/completions        {"model", "prompt": str | [int], "max_tokens", "temperature", "stream", ...}
    POST /v1/chat/completions   {"model", "messages": [{"role", "content"}], "max_completion_tokens", ...}

Fields follow OpenAI, with vLLM's extensions (top_k, stop_token_ids, ignore_eos, return_token_ids). A field the engine cannot honour
(n > 1, logprobs, tools) is refused with a 400 naming it, never silently ignored.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from common.sampling import SamplingParams, SamplingParamsError

DEFAULT_MAX_TOKENS = 16          # OpenAI's default for /v1/completions


class OpenAIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable"
                             }.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    # unknown fields are accepted and ignored, as OpenAI's API does (clients send e.g. "user")
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    return_token_ids: bool = False   # vLLM's: the prompt's and the generated token ids beside the text
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logprobs: bool | int | None = None

    def refuse_unsupported(self) -> None:
        if self.n != 1:
            raise OpenAIError(400, f"n={self.n}: only n=1 is supported (one choice per request)", "n")
        if self.logprobs not in (None, False, 0):
            raise OpenAIError(400, "logprobs are not supported", "logprobs")
        extra = self.model_extra or {}
        for name, harmless in (("tools", (None, [])), ("tool_choice", (None, "none")), ("functions", (None, [])),
                               ("best_of", (None, 1)), ("echo", (None, False)), ("suffix", (None, ""))):
            if extra.get(name) not in harmless:
                raise OpenAIError(400, f"{name}={extra[name]!r} is not supported", name)

    def stop_strings(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise OpenAIError(400, "stop strings must not be empty", "stop")
        return stop

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        """The engine's parameters; a value out of range is a 400 naming the field as the client sent it."""
        try:
            return SamplingParams(max_tokens=max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS,
                                  temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
                                  stop_token_ids=tuple(self.stop_token_ids), ignore_eos=self.ignore_eos)
        except SamplingParamsError as e:
            raise OpenAIError(400, f"{e.name}={e.value!r}: {e.why}", e.name) from None


class CompletionRequest(_Common):
    prompt: str | list[int]

    def params(self) -> SamplingParams:
        self.refuse_unsupported()
        return self.sampling_params(self.max_tokens)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def params(self) -> SamplingParams:
        self.refuse_unsupported()
        # no default cap for chat (OpenAI's): up to what max_model_len leaves; the engine stops it there
        limit = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self.sampling_params(limit if limit is not None else 2**31 - 1)
