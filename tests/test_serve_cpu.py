"""CPU tier: the OpenAI-compatible server on a loopback port over the numpy reference engine, driven by the real
`openai` client: completions and chat, streaming and not, seeds, stop strings, concurrent streams, a client that
goes away, and the errors a malformed request gets."""
import asyncio
import itertools
import json
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from common.reference import ReferenceEngine
from common.sampling import SamplingParams

openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (the dev extra)")
uvicorn = pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")

from common.serve.app import build_app
from common.serve.engine_loop import EngineLoop
from common.serve.metrics import read_metric
from common.serve.server import Server, loopback_socket

MODEL = "tiny"


class Recording(ReferenceEngine):
    """The reference engine, keeping the ids it was asked to abort; while `hold` is set its steps make no
    progress, so a request runs for as long as a test needs it to."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aborted: list = []
        self.hold = threading.Event()

    def abort_request(self, request_id) -> None:
        self.aborted.append(request_id)
        super().abort_request(request_id)

    def step(self):
        if self.hold.is_set():
            time.sleep(0.005)
            return []
        return super().step()


class Running:
    """A server on a free loopback port, in a thread, over its own engine loop."""

    def __init__(self, engine, **app_options):
        self.loop = EngineLoop(engine)
        self.loop.start()
        sock = loopback_socket()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = Server(build_app(self.loop, MODEL, **app_options), self.loop, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        for _ in range(200):                      # bounded: 10 s for the server to come up
            if self.server.started:
                break
            time.sleep(0.05)
        assert self.server.started, "the server did not start in 10 s"

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def close(self):
        self.server.handle_exit(signal.SIGINT, None)    # what Ctrl-C does
        self.thread.join(10)
        assert not self.thread.is_alive(), "the server did not shut down in 10 s"


@pytest.fixture(scope="module")
def server(tiny_dir):
    running = Running(Recording(str(tiny_dir), max_model_len=96, max_num_seqs=4))
    yield running.url, running.loop
    running.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return ReferenceEngine(str(tiny_dir), max_model_len=96)


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0)


def test_completion_equals_the_engine_alone(client, reference):
    got = client.completions.create(model=MODEL, prompt="Hello, world", max_tokens=8, temperature=0)
    want = reference.generate(["Hello, world"], greedy(8))[0]
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 8 and got.usage.prompt_tokens == len(want.prompt_token_ids)


def test_a_stream_says_what_the_whole_answer_says(client, monkeypatch):
    import itertools
    import types

    import common.serve.app as app

    ticks = itertools.count(1_700_000_000)          # a clock that moves a second every time it is read
    monkeypatch.setattr(app, "time", types.SimpleNamespace(time=lambda: next(ticks)))
    whole = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert len({(c.id, c.created) for c in chunks}) == 1          # one completion: one id, one time (as OpenAI)


def test_chat_uses_the_template_and_streams(client, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    got = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=6, temperature=0)
    ids = reference.prompts.tokenizer.encode_chat(messages)
    assert got.choices[0].message.content == reference.generate([ids], greedy(6))[0].text
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                            stream=True)
    parts = [c.choices[0].delta for c in stream]
    assert parts[0].role == "assistant"
    assert "".join(p.content or "" for p in parts) == got.choices[0].message.content


def test_seeds_reproduce_and_differ(client):
    def sample(seed):
        return client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=1.0,
                                         seed=seed).choices[0].text
    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1


def test_a_stop_string_ends_the_text_before_it(client):
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=16, temperature=0).choices[0].text
    cut = next(i for i in range(2, len(full) - 2) if full[i:i + 2].strip())   # a visible 2-character stop
    got = client.completions.create(model=MODEL, prompt="Hello", max_tokens=16, temperature=0,
                                    stop=[full[cut:cut + 2]])
    assert got.choices[0].text == full[:full.find(full[cut:cut + 2])]
    assert got.choices[0].finish_reason == "stop"


def test_a_stop_string_frees_the_engines_request(client, server):
    _, loop = server
    before = len(loop.engine.aborted)
    full = client.completions.create(model=MODEL, prompt="Stop me", max_tokens=60, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = next(full[i:i + 2] for i in range(2, len(full) - 2) if full[i:i + 2].strip())
    got = client.completions.create(model=MODEL, prompt="Stop me", max_tokens=60, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].finish_reason == "stop"
    for _ in range(200):                          # bounded: the abort reaches the engine within 10 s
        if len(loop.engine.aborted) > before and not loop.engine.has_unfinished_requests():
            break
        time.sleep(0.05)
    assert len(loop.engine.aborted) == before + 1 and not loop.engine.has_unfinished_requests()


def test_concurrent_streams_each_get_their_own_tokens(client, reference):
    prompts = [f"request {i}:" for i in range(32)]
    want = [o.text for o in reference.generate(prompts, greedy(6))]
    got = [None] * len(prompts)

    def one(i):
        stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=6, temperature=0, stream=True)
        got[i] = "".join(c.choices[0].text for c in stream)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == want


def test_a_client_that_goes_away_is_aborted(client, server):
    _, loop = server
    stream = client.completions.create(model=MODEL, prompt="tell me", max_tokens=80, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    before = len(loop.engine.aborted)
    next(iter(stream))
    stream.close()
    for _ in range(200):                          # bounded: 10 s for the abort to reach the engine
        if len(loop.engine.aborted) > before and not loop.engine.has_unfinished_requests():
            break
        time.sleep(0.05)
    assert len(loop.engine.aborted) == before + 1 and not loop.engine.has_unfinished_requests()


def wait_for(condition, what: str, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):          # bounded: polls, asserts nothing about how long it took
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {seconds:.0f} s")


def aborts_counted(url) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        found = re.search(r'^tiny_vllm:request_success_total{finished_reason="abort"} (\S+)$', r.read().decode(),
                          re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_client_disconnects_is_aborted_streamed_or_not(server, stream):
    """The engine makes no progress (hold), so the request would run until its client leaves: the disconnect
    alone must abort it, before any token is sent."""
    url, loop = server
    engine, before, counted = loop.engine, len(loop.engine.aborted), aborts_counted(url)
    body = json.dumps({"model": MODEL, "prompt": "hold on", "max_tokens": 80, "ignore_eos": True,
                       "stream": stream}).encode()
    engine.hold.set()
    try:
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            wait_for(engine.has_unfinished_requests, "the request reaching the engine")
        wait_for(lambda: len(engine.aborted) > before, "the abort after the client left")
    finally:
        engine.hold.clear()
    assert len(engine.aborted) == before + 1 and not engine.has_unfinished_requests()
    wait_for(lambda: aborts_counted(url) == counted + 1, "request_success_total{finished_reason=abort} + 1")


def test_a_prompt_being_encoded_does_not_stall_the_event_loop(server, monkeypatch):
    """While one request's prompt is encoded (a fake that waits for /health to have answered, at most 20 s), the
    event loop answers /health: encoding runs on the tokenizer's pool, not on the loop. Ordered by events, not
    by timing."""
    import common.serve.app as app

    url, real = server[0], app.encode_text
    encoding, health_answered, saw = threading.Event(), threading.Event(), []

    def slow_encode(tokenizer, text, add_special_tokens):
        if text == "a huge prompt, say":
            encoding.set()
            saw.append(health_answered.wait(20))  # on the event loop this would block /health until it gives up
        return real(tokenizer, text, add_special_tokens)

    monkeypatch.setattr(app, "encode_text", slow_encode)
    answer = {}
    body = json.dumps({"model": MODEL, "prompt": "a huge prompt, say", "max_tokens": 2}).encode()
    poster = threading.Thread(target=lambda: answer.update(got=post(url + "/v1/completions", body)))
    poster.start()
    assert encoding.wait(30), "the request was never encoded"
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    health_answered.set()
    poster.join(30)
    assert saw == [True], "/health answered only after the encode gave up: the encode blocked the event loop"
    assert answer["got"][0] == 200


def test_tokens_are_counted_before_they_are_sent(tiny_dir):
    """Each step's tokens are in generation_tokens_total, and a finished request is gone from the running
    count, by the time its handler can see them: a client that reads /metrics right after its answer reads
    them counted."""
    loop, seen = EngineLoop(ReferenceEngine(str(tiny_dir), max_model_len=96)), []
    send_all = loop._send_all

    def sending(sends):
        seen.append((read_metric(loop.metrics.text().decode(), "tiny_vllm:generation_tokens_total"),
                     sum(len(d.token_ids) for _, d in sends), loop.num_running))
        send_all(sends)

    loop._send_all = sending

    async def one_request():
        _, sink = await loop.add([1, 2, 3], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
        while (await sink.get()).finish_reason is None:
            pass

    loop.start()
    try:
        asyncio.run(one_request())
    finally:
        loop.stop()
    assert [counted for counted, _, _ in seen] == list(itertools.accumulate(n for _, n, _ in seen))
    assert seen[-1][0] == 5 and seen[-1][2] == 0


def post(url, body: bytes | None, method="POST", content_type="application/json"):
    """(status, the JSON answer) of a raw request, errors included."""
    req = urllib.request.Request(url, body, {"Content-Type": content_type} if content_type else {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, status, param, words", [
    (b"{bad", 400, None, "not valid JSON"),
    (b'{"model": "tiny", "prompt": "x", "n": 2}', 400, "n", "only n=1"),
    (b'{"model": "tiny", "prompt": "x", "logprobs": 2}', 400, "logprobs", "not supported"),
    (b'{"model": "tiny", "prompt": "x", "temperature": -1}', 400, "temperature", "temperature=-1"),
    (b'{"model": "tiny", "prompt": "x", "temperature": "hot"}', 400, "temperature", "valid number"),
    (b'{"model": "tiny", "prompt": "x", "max_tokens": 0}', 400, "max_tokens", "max_tokens=0"),
    (b'{"model": "other", "prompt": "x"}', 404, "model", "'other' does not exist"),
    (b'{"model": "tiny"}', 400, "prompt", "Field required"),
    (b'{"model": "tiny", "prompt": ' + json.dumps(list(range(100))).encode() + b'}', 400, "prompt",
     "100 tokens does not fit max_model_len=96"),
    (b'{"model": "tiny", "prompt": "x", "stop": [""]}', 400, "stop", "must not be empty"),
])
def test_malformed_requests_get_openai_errors(server, body, status, param, words):
    code, answer = post(server[0] + "/v1/completions", body)
    assert code == status and answer["error"]["param"] == param and words in answer["error"]["message"], answer


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    with urllib.request.urlopen(server[0] + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}


def test_a_prefix_cache_reset_over_an_engine_without_one_is_a_400(server):
    code, answer = post(server[0] + "/reset_prefix_cache", None)
    want = "the engine has no prefix cache to reset (stage11 and later have one)"
    assert (code, answer["error"]["message"]) == (400, want), answer


def metric(url, name) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return read_metric(r.read().decode(), name)


def test_metrics_count_tokens_and_return_to_idle(client, server):
    url = server[0]
    before = metric(url, "tiny_vllm:generation_tokens_total")
    client.completions.create(model=MODEL, prompt="count me", max_tokens=5, temperature=0)
    assert metric(url, "tiny_vllm:generation_tokens_total") == before + 5
    assert metric(url, "tiny_vllm:time_to_first_token_seconds_count") >= 1
    assert metric(url, "tiny_vllm:num_requests_running") == 0 == metric(url, "tiny_vllm:num_requests_waiting")
    assert metric(url, "tiny_vllm:kv_cache_usage_perc") == 0


def test_beyond_max_waiting_a_request_gets_503_with_retry_after(tiny_dir):
    running = Running(ReferenceEngine(str(tiny_dir), max_model_len=96), max_waiting=0)
    try:
        req = urllib.request.Request(running.url + "/v1/completions", b'{"model": "tiny", "prompt": "x"}',
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 503 and e.value.headers["Retry-After"] == "1"
        assert "--max-waiting 0" in json.loads(e.value.read())["error"]["message"]
    finally:
        running.close()


def test_shutdown_ends_requests_in_flight_with_an_error(tiny_dir):
    running = Running(ReferenceEngine(str(tiny_dir), max_model_len=96))
    stream = running.client().completions.create(model=MODEL, prompt="a long one", max_tokens=80,
                                                 temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)
    running.close()                               # bounded: asserts the server is down within 10 s
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in chunks:
            pass


def test_return_token_ids_gives_the_prompt_and_the_generated_ids(client, reference):
    want = reference.generate(["ids please"], greedy(7))[0]
    got = client.completions.create(model=MODEL, prompt="ids please", max_tokens=7, temperature=0,
                                    extra_body={"return_token_ids": True}).model_dump()
    assert got["prompt_token_ids"] == want.prompt_token_ids and got["choices"][0]["token_ids"] == want.token_ids
    chunks = [c.model_dump() for c in client.completions.create(
        model=MODEL, prompt="ids please", max_tokens=7, temperature=0, stream=True,
        extra_body={"return_token_ids": True})]
    assert chunks[0]["prompt_token_ids"] == want.prompt_token_ids and "prompt_token_ids" not in chunks[1]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == want.token_ids


def test_a_request_whose_processing_fails_fails_alone(client, server, monkeypatch):
    import common.serve.app as app

    class Breaks(app.StopMatcher):
        def feed(self, text):
            if self.stops == ["boom"]:
                raise RuntimeError("this request's stop matching broke")
            return super().feed(text)

    monkeypatch.setattr(app, "StopMatcher", Breaks)
    ok = [None] * 3

    def fine(i):
        ok[i] = client.completions.create(model=MODEL, prompt=f"fine {i}", max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True}).usage.completion_tokens

    threads = [threading.Thread(target=fine, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    with pytest.raises(openai.InternalServerError, match="stop matching broke"):
        client.completions.create(model=MODEL, prompt="doomed", max_tokens=8, temperature=0, stop=["boom"])
    stream = client.completions.create(model=MODEL, prompt="doomed", max_tokens=8, temperature=0, stop=["boom"],
                                       stream=True)
    with pytest.raises(openai.APIError, match="stop matching broke"):
        list(stream)
    for t in threads:
        t.join(60)
    assert ok == [8, 8, 8]
    for _ in range(200):                          # bounded: the failed requests' slots are freed
        if not server[1].engine.has_unfinished_requests():
            break
        time.sleep(0.05)
    assert not server[1].engine.has_unfinished_requests()
