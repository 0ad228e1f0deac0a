"""The OpenAI request bodies the server accepts, their mapping onto SamplingParams, and errors in OpenAI's shape.

    POST /v1/completions        {"model", "prompt": str | [int], "max_tokens", "temperature", "stream", ...}
    POST /v1/chat/completions   {"model", "messages": [{"role", "content"}], "max_completion_tokens", ...}

Every field a request may carry is in one of four tables, and any other field is a 400 naming it (as OpenAI's own
API answers "Unrecognized request argument"): a misspelt `temprature` must not run silently at temperature 1.
  * honoured: the fields declared on the models below (OpenAI's, with vLLM's top_k, stop_token_ids, ignore_eos,
    return_token_ids);
  * NEUTRAL_ONLY: fields this engine cannot honour (penalties, logit_bias, logprobs, tools, n > 1, ...): their
    neutral value, the one OpenAI's clients send when the user set nothing, is accepted; any other is a 400;
  * METADATA: fields that change nothing in the answer (user, metadata, store, ...): accepted and ignored.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from common.sampling import SamplingParams, SamplingParamsError

DEFAULT_MAX_TOKENS = 16          # OpenAI's and vLLM's default for /v1/completions (chat has none)

# field -> (the values that change nothing, why another is refused)
NEUTRAL_ONLY: dict[str, tuple[tuple, str]] = {
    "n": ((None, 1), "only n=1 (one choice per request)"),
    "best_of": ((None, 1), "one candidate per request"),
    "logprobs": ((None, False, 0), "this engine returns no log probabilities"),
    "top_logprobs": ((None, 0), "this engine returns no log probabilities"),
    "prompt_logprobs": ((None, 0), "this engine returns no log probabilities"),
    "echo": ((None, False), "the prompt is not echoed"),
    "suffix": ((None, ""), "no insertion (suffix) mode"),
    "presence_penalty": ((None, 0), "this engine applies no penalties"),
    "frequency_penalty": ((None, 0), "this engine applies no penalties"),
    "repetition_penalty": ((None, 1), "this engine applies no penalties"),
    "length_penalty": ((None, 1), "no beam search"),
    "use_beam_search": ((None, False), "no beam search"),
    "min_p": ((None, 0), "no min_p sampling (top_k and top_p are supported)"),
    "min_tokens": ((None, 0), "no minimum length"),
    "logit_bias": ((None, {}), "no bias of the logits"),
    "allowed_token_ids": ((None,), "no restriction of the vocabulary"),
    "response_format": ((None, {"type": "text"}), "only plain text output (no JSON mode or schema)"),
    "tools": ((None, []), "tools are not supported"),
    "tool_choice": ((None, "none", "auto"), "tools are not supported"),
    "functions": ((None, []), "functions are not supported"),
    "function_call": ((None, "none", "auto"), "functions are not supported"),
    "parallel_tool_calls": ((None, True, False), "tools are not supported"),
    "modalities": ((None, ["text"]), "text output only"),
    "audio": ((None,), "text output only"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "not a reasoning model"),
    "web_search_options": ((None,), "no web search"),
    "include_stop_str_in_output": ((None, False), "the stop string is never sent"),
    "skip_special_tokens": ((None, True), "special tokens are always skipped in the text"),
    "spaces_between_special_tokens": ((None, True), "special tokens are always skipped in the text"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated (a long one is refused)"),
    "add_generation_prompt": ((None, True), "the chat template always ends with the assistant header"),
    "continue_final_message": ((None, False), "the chat template always ends with the assistant header"),
    "chat_template": ((None,), "the Llama 3.2 template is built in"),
    "chat_template_kwargs": ((None, {}), "the Llama 3.2 template is built in"),
    "priority": ((None, 0), "requests are served first come, first served"),
}
METADATA = ("user", "metadata", "store", "service_tier", "request_id", "prompt_cache_key", "safety_identifier")

_Tolerated = create_model("_Tolerated", __config__=ConfigDict(extra="forbid"),
                          **{name: (Any, None) for name in (*NEUTRAL_ONLY, *METADATA)})


class OpenAIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {404: "not_found_error", 503: "service_unavailable"}.get(
            status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False      # vLLM's: accepted, usage comes in the last chunk only


class _Common(_Tolerated):
    model: str | None = None         # absent: the served model (as vLLM)
    max_tokens: int | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(default_factory=list)
    ignore_eos: bool = False
    return_token_ids: bool | None = False   # vLLM's: the prompt's and the generated token ids beside the text
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    def refuse_unsupported(self) -> None:
        """A field of NEUTRAL_ONLY the client set to anything but its neutral value is a 400 naming it."""
        for name in sorted(self.model_fields_set & NEUTRAL_ONLY.keys()):
            value = getattr(self, name)
            allowed, why = NEUTRAL_ONLY[name]
            if not any(value == a and type(value) is not bool or value is a for a in allowed):
                raise OpenAIError(400, f"{name}={value!r} is not supported: {why}", name)

    def stop_strings(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise OpenAIError(400, "stop strings must not be empty", "stop")
        return stop

    def limit(self) -> tuple[int | None, str]:
        """The max_tokens the client asked for (None: up to max_model_len) and the field that said so."""
        raise NotImplementedError

    def params(self, prompt_len: int, max_model_len: int, prompt_word: str) -> SamplingParams:
        """The engine's parameters for a prompt of prompt_len tokens. A max_tokens that does not fit beside the
        prompt in max_model_len is a 400 naming both numbers, as vLLM's; a value out of range is a 400 naming
        the field as the client sent it."""
        self.refuse_unsupported()
        limit, field = self.limit()
        if limit is not None and limit >= 1 and prompt_len + limit > max_model_len:
            raise OpenAIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you "
                              f"requested {prompt_len + limit} tokens ({prompt_len} in the {prompt_word}, {limit} "
                              f"in the completion). Please reduce the length of the {prompt_word} or completion.",
                              field)
        try:
            return SamplingParams(
                max_tokens=limit if limit is not None else max_model_len - prompt_len,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_k=self.top_k or 0, top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed,
                stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos)
        except SamplingParamsError as e:
            name = field if e.name == "max_tokens" else e.name
            raise OpenAIError(400, f"{name}={e.value!r}: {e.why}", name) from None


class CompletionRequest(_Common):
    prompt: str | list[int]

    def limit(self) -> tuple[int | None, str]:
        # absent: 16, as OpenAI and vLLM; an explicit null: up to max_model_len, as vLLM
        return (self.max_tokens if "max_tokens" in self.model_fields_set else DEFAULT_MAX_TOKENS), "max_tokens"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list | None = None               # a list of parts, each checked in template_message
    name: str | None = None                          # metadata: the template has no place for it
    tool_calls: list | None = None                   # only empty: tools are not supported

    def template_message(self, at: int) -> dict:
        """{"role", "content"} for the chat template: "developer" (OpenAI's newer name) is "system"; a list of
        parts is their texts joined with "\\n" (as vLLM joins them); null content only for an assistant."""
        where = f"messages.{at}"
        if self.tool_calls:
            raise OpenAIError(400, f"{where}.tool_calls: tools are not supported", f"{where}.tool_calls")
        role = "system" if self.role == "developer" else self.role
        if self.content is None:
            if self.role != "assistant":
                raise OpenAIError(400, f"{where}.content: only an assistant message may have null content",
                                  f"{where}.content")
            return {"role": role, "content": ""}
        if isinstance(self.content, str):
            return {"role": role, "content": self.content}
        texts = []
        for j, part in enumerate(self.content):
            if not isinstance(part, dict):
                raise OpenAIError(400, f"{where}.content.{j}: a content part is {{\"type\": \"text\", \"text\": "
                                  f"string}}, not {part!r}", f"{where}.content.{j}")
            kind = part.get("type")
            if kind != "text":
                raise OpenAIError(400, f"{where}.content.{j}: a content part of type {kind!r} is not supported "
                                  "(text only)", f"{where}.content.{j}.type")
            if not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                raise OpenAIError(400, f"{where}.content.{j}: a text part is {{\"type\": \"text\", \"text\": "
                                  "string}", f"{where}.content.{j}")
            texts.append(part["text"])
        return {"role": role, "content": "\n".join(texts)}


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def limit(self) -> tuple[int | None, str]:
        # no default cap for chat (OpenAI's, vLLM's): up to what max_model_len leaves
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def template_messages(self) -> list[dict]:
        return [m.template_message(i) for i, m in enumerate(self.messages)]
