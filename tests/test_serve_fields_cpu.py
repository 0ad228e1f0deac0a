"""CPU tier: what the server does with each field of a request body, and that every error keeps OpenAI's shape:
max_tokens against max_model_len, chat content as a list of parts and the developer role, fields this engine
cannot honour (accepted at their neutral value only), metadata (accepted), unknown fields (refused), and the
framework's own errors (a body that is not UTF-8, an unknown route, a wrong method)."""
import json

import pytest

pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")
pytest.importorskip("openai", reason="the server tests use the openai client (the dev extra)")

from common.sampling import SamplingParams
from common.serve.protocol import METADATA, NEUTRAL_ONLY

from .test_serve_cpu import MODEL, client, post, reference, server  # noqa: F401  (fixtures)


def completion(server, **fields):
    return post(server[0] + "/v1/completions", json.dumps({"model": MODEL, "prompt": "x"} | fields).encode())


def chat(server, messages, **fields):
    return post(server[0] + "/v1/chat/completions",
                json.dumps({"model": MODEL, "messages": messages, "max_tokens": 3} | fields).encode())


def is_openai_error(answer) -> bool:
    return set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}


# ---------------------------------------------------------------- max_tokens and max_model_len (96 here)
def test_max_tokens_beyond_max_model_len_is_refused_naming_both_numbers(server):
    ids = list(range(1000, 1010))                                     # 10 prompt tokens
    code, answer = completion(server, prompt=ids, max_tokens=87)
    assert code == 400 and answer["error"]["param"] == "max_tokens"
    assert answer["error"]["message"].startswith("This model's maximum context length is 96 tokens. However, you "
                                                 "requested 97 tokens (10 in the prompt, 87 in the completion).")
    assert completion(server, prompt=ids, max_tokens=86, temperature=0)[0] == 200          # exactly fits
    code, answer = chat(server, [{"role": "user", "content": "hi"}], max_tokens=None, max_completion_tokens=95)
    assert code == 400 and answer["error"]["param"] == "max_completion_tokens"
    assert "in the messages, 95 in the completion" in answer["error"]["message"]


def test_without_max_tokens_a_completion_gets_16_and_null_or_chat_runs_to_max_model_len(server):
    ids = list(range(1000, 1010))
    _, answer = completion(server, prompt=ids, temperature=0, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 16                 # OpenAI's and vLLM's default
    _, answer = completion(server, prompt=ids, max_tokens=None, temperature=0, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 96 - 10
    code, answer = chat(server, [{"role": "user", "content": "hi"}], max_tokens=None, temperature=0,
                        ignore_eos=True)
    assert code == 200 and answer["usage"]["total_tokens"] == 96


# ---------------------------------------------------------------- chat messages
def test_chat_content_as_text_parts_is_their_texts_joined_by_newlines(server, reference):
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    code, answer = chat(server, [{"role": "user", "content": parts}], temperature=0)
    assert code == 200
    ids = reference.prompts.tokenizer.encode_chat([{"role": "user", "content": "first\nsecond"}])
    assert answer["usage"]["prompt_tokens"] == len(ids)
    assert answer["choices"][0]["message"]["content"] == \
        reference.generate([ids], SamplingParams(max_tokens=3, temperature=0.0))[0].text


def test_a_non_text_part_is_refused_naming_its_type(server):
    parts = [{"type": "text", "text": "look:"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    code, answer = chat(server, [{"role": "user", "content": parts}])
    assert code == 400 and "'image_url'" in answer["error"]["message"]
    assert answer["error"]["param"] == "messages.0.content.1.type"
    code, answer = chat(server, [{"role": "user", "content": ["Hi"]}])          # a bare string is not a part
    assert code == 400 and answer["error"]["param"] == "messages.0.content.0", answer
    assert answer["error"]["message"].startswith('messages.0.content.0: a content part is {"type": "text"')


def test_developer_is_system_and_an_assistant_may_have_null_content(server, reference):
    as_developer = [{"role": "developer", "content": "Be."}, {"role": "assistant", "content": None}]
    as_system = [{"role": "system", "content": "Be."}, {"role": "assistant", "content": ""}]
    code, answer = chat(server, as_developer, temperature=0)
    want_ids = reference.prompts.tokenizer.encode_chat(as_system)
    want = reference.generate([want_ids], SamplingParams(max_tokens=3, temperature=0.0))[0].text
    assert code == 200 and answer["usage"]["prompt_tokens"] == len(want_ids)
    assert answer["choices"][0]["message"]["content"] == want
    code, answer = chat(server, [{"role": "user", "content": None}])
    assert code == 400 and answer["error"]["param"] == "messages.0.content"
    code, answer = chat(server, [{"role": "tool", "content": "42"}])
    assert code == 400 and answer["error"]["param"] == "messages.0.role"


# ---------------------------------------------------------------- fields beyond what the engine honours
NEUTRAL_AS_CLIENTS_SEND = {"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1,
                           "logit_bias": {}, "response_format": {"type": "text"}, "logprobs": False,
                           "top_logprobs": 0, "n": 1, "tools": [], "tool_choice": "none",
                           "parallel_tool_calls": True, "min_tokens": 0, "min_p": 0.0}
NOT_NEUTRAL = {"presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
               "logit_bias": {"50256": -100}, "response_format": {"type": "json_object"}, "logprobs": True,
               "top_logprobs": 3, "n": 2, "tools": [{"type": "function", "function": {"name": "f"}}],
               "min_tokens": 4, "min_p": 0.1, "echo": True, "best_of": 2, "suffix": "end", "priority": 1}


def test_neutral_values_and_metadata_are_accepted(server):
    metadata = {"user": "u-1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"}
    code, answer = chat(server, [{"role": "user", "content": "hi"}], **NEUTRAL_AS_CLIENTS_SEND, **metadata)
    assert code == 200, answer
    assert completion(server, logprobs=None, echo=False, best_of=1, suffix=None, user="u-1")[0] == 200
    assert set(NEUTRAL_AS_CLIENTS_SEND) | set(NOT_NEUTRAL) <= set(NEUTRAL_ONLY) and set(metadata) <= set(METADATA)


@pytest.mark.parametrize("name", sorted(NOT_NEUTRAL))
def test_any_other_value_is_refused_naming_the_field(server, name):
    endpoint = completion if name in ("echo", "best_of", "suffix") else \
        lambda s, **f: chat(s, [{"role": "user", "content": "hi"}], **f)
    code, answer = endpoint(server, **{name: NOT_NEUTRAL[name]})
    assert code == 400 and answer["error"]["param"] == name
    assert answer["error"]["message"].startswith(f"{name}={NOT_NEUTRAL[name]!r} is not supported")


def test_an_unknown_field_is_refused_naming_it(server):
    code, answer = completion(server, temprature=0)
    assert code == 400 and answer["error"]["param"] == "temprature"
    assert answer["error"]["message"] == "Unrecognized request argument supplied: temprature"
    code, answer = chat(server, [{"role": "user", "content": "hi", "mood": "calm"}])
    assert code == 400 and answer["error"]["param"] == "messages.0.mood"


def test_model_may_be_left_out(server):
    code, answer = post(server[0] + "/v1/completions", b'{"prompt": "x", "max_tokens": 2}')
    assert code == 200 and answer["model"] == MODEL


# ---------------------------------------------------------------- every error in OpenAI's shape
@pytest.mark.parametrize("path, method, body, status, words", [
    ("/v1/completions", "POST", b'{"model": "tiny", "prompt": "\xff\xfe"}', 400, "not valid JSON text"),
    ("/v1/completions", "POST", b'[1, 2]', 400, "must be a JSON object"),
    ("/v1/completions", "POST", b'"text"', 400, "must be a JSON object"),
    ("/v1/completions", "POST", b'', 400, "must be a JSON object"),
    ("/v1/completions", "GET", None, 405, "GET is not allowed on /v1/completions"),
    ("/v1/nothing", "POST", b'{}', 404, "POST /v1/nothing: no such route"),
    ("/health", "POST", b'{}', 405, "POST is not allowed on /health"),
])
def test_framework_errors_keep_the_openai_shape(server, path, method, body, status, words):
    code, answer = post(server[0] + path, body, method)
    assert code == status and is_openai_error(answer) and words in answer["error"]["message"], answer
    assert answer["error"]["code"] == status


def test_malformed_bodies_of_both_endpoints_keep_the_openai_shape(server):
    for path in ("/v1/completions", "/v1/chat/completions"):
        for body in (b'{"model": "tiny", "prompt": 3, "messages": 3}', b'{bad', b'null'):
            code, answer = post(server[0] + path, body)
            assert code == 400 and is_openai_error(answer), (path, body, answer)

