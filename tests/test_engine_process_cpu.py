"""CPU tier: the engine in its own process (common/serve/engine_process.py) behind the step API gives what the
engine gives in this one: the same tokens, the engine's own validation errors, aborts; and the server runs over
it with the openai client; the engine steps on its own, and the server takes its steps when it can."""
import time
import urllib.request

import pytest

from common.reference import ReferenceEngine
from common.sampling import SamplingParams
from common.serve.engine_process import EngineProcess
from common.serve.engines import EngineOptionError, build_engine

uvicorn = pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")


@pytest.fixture(scope="module")
def remote(tiny_dir):
    # stage05's engine (on a CPU its loop over the numpy forward): synchronous, so an abort leaves no step in flight
    ep = EngineProcess(build_engine, "05", str(tiny_dir), 96)
    yield ep
    ep.close()


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_the_remote_engine_gives_the_engines_tokens(remote, tiny_dir):
    prompts = ["one", "two three", "four five six"]
    want = ReferenceEngine(str(tiny_dir), max_model_len=96).generate(prompts, [greedy(5), greedy(7), greedy(3)])
    ids = remote.add_requests([(remote.prompts.encode(p), greedy(n), None, False) for p, n in zip(prompts, (5, 7, 3))])
    assert remote.has_unfinished_requests() and remote.num_requests() == (0, 3)   # one message added all three
    done = {}
    while remote.has_unfinished_requests():
        for o in remote.step():
            if o.finished:
                done[o.request_id] = o
    assert [done[i].token_ids for i in ids] == [w.token_ids for w in want]
    assert remote.num_requests() == (0, 0) and remote.kv_cache_usage() == 0


def test_the_engine_runs_ahead_and_one_step_call_takes_every_step_since(remote, tiny_dir):
    """The engine process does not wait for step(): left alone, it finishes both requests, and the one step()
    after gives each request once, with all of its tokens."""
    want = ReferenceEngine(str(tiny_dir), max_model_len=96).generate(["ahead", "of you"], [greedy(6), greedy(4)])
    ids = remote.add_requests([("ahead", greedy(6), None, False), ("of you", greedy(4), None, False)])
    deadline = time.monotonic() + 60
    while remote._state[0]:           # read its messages as they come (no step() call) until it is idle
        assert time.monotonic() < deadline, "the engine did not finish two short requests in 60 s"
        if remote._conn.poll(0.05):
            remote._receive()
    assert len(remote._steps) >= 4    # it stepped at least once per token of the longer request
    outs = remote.step()
    assert sorted(o.request_id for o in outs) == sorted(ids)
    got = {o.request_id: o for o in outs}
    assert [got[i].new_token_ids for i in ids] == [w.token_ids for w in want]
    assert all(got[i].finish_reason == "length" for i in ids)
    assert not remote.has_unfinished_requests() and remote.step() == []


def test_errors_and_aborts_cross_the_pipe(remote):
    from common.prompts import PromptError

    with pytest.raises(PromptError, match="max_model_len=96"):
        remote.add_request(list(range(200)), greedy(4))
    bad, good = remote.add_requests([(list(range(200)), greedy(4), None, False), ("fine", greedy(2), None, False)])
    assert isinstance(bad, PromptError) and isinstance(good, str)   # the one refused alone; the other runs
    while remote.has_unfinished_requests():
        remote.step()
    rid = remote.add_request("abort me", greedy(50))
    remote.step()
    deadline = time.monotonic() + 60
    while not remote._steps:          # a step the engine made on its own, here before the abort
        assert time.monotonic() < deadline, "the engine made no step on its own in 60 s"
        if remote._conn.poll(0.05):
            remote._receive()
    remote.abort_request(rid)
    assert not remote.has_unfinished_requests()     # its outputs that had already arrived went with it
    assert remote.step() == []


class FailingEngine(ReferenceEngine):
    """Its third step raises, as a CUDA error would."""

    steps = 0

    def step(self):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("an illegal memory access, say")
        return super().step()


def failing_engine(folder):
    return FailingEngine(folder, max_model_len=96)


def test_a_step_that_raises_comes_after_the_steps_before_it_and_the_engine_goes_on(tiny_dir):
    ep = EngineProcess(failing_engine, str(tiny_dir))
    try:
        (rid,) = ep.add_requests([("x y", greedy(10), None, False)])
        got = []
        with pytest.raises(RuntimeError, match="illegal memory access"):
            while True:
                got += [t for o in ep.step() for t in o.new_token_ids]
        assert len(got) == 2                          # the two good steps' tokens came first
        assert not ep.has_unfinished_requests()       # it waits for the server to answer, not stepping again
        ep.abort_request(rid)                         # what the engine loop does for that step's requests
        (rid,) = ep.add_requests([("again", greedy(3), None, False)])
        outs = []
        while ep.has_unfinished_requests():
            outs += ep.step()
        assert outs[-1].request_id == rid and outs[-1].finish_reason == "length"
    finally:
        ep.close()


def test_the_server_over_the_remote_engine(remote, tiny_dir):
    from .test_serve_cpu import MODEL, Running

    running = Running(remote)
    try:
        got = running.client().completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0,
                                                  extra_body={"ignore_eos": True})
        want = ReferenceEngine(str(tiny_dir), max_model_len=96).generate(["Hello"], greedy(6))[0]
        assert got.choices[0].text == want.text and got.usage.completion_tokens == 6
    finally:
        running.close()


@pytest.mark.parametrize("own_process", [True, False])
def test_a_prefix_cache_s_hits_reach_usage_and_metrics(tiny_dir, own_process):
    """stage11's engine (its prefix cache) behind the server, in its own process and in this one: a request
    whose prompt repeats an earlier one's finds its blocks, and says so in usage (OpenAI's
    prompt_tokens_details.cached_tokens) and in /metrics (vLLM's prefix cache queries and hits, in tokens)."""
    from .test_serve_cpu import MODEL, Running, metric

    args = ("11", str(tiny_dir), 96)
    engine = EngineProcess(build_engine, *args) if own_process else build_engine(*args)
    running = Running(engine)
    try:
        prompt = list(range(1000, 1040))                   # 40 tokens: 2 full blocks of 16 before its last
        kw = {"model": MODEL, "max_tokens": 3, "temperature": 0, "extra_body": {"ignore_eos": True}}
        first = running.client().completions.create(prompt=prompt, **kw)
        again = running.client().completions.create(prompt=prompt, stream=True,
                                                    stream_options={"include_usage": True}, **kw)
        usage = [c.usage for c in again if c.usage][-1]
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        assert usage.prompt_tokens_details.cached_tokens == 32
        assert metric(running.url, "tiny_vllm:prefix_cache_queries_total") == 80
        assert metric(running.url, "tiny_vllm:prefix_cache_hits_total") == 32
    finally:
        running.close()
        if own_process:
            engine.close()


def slow_prefix_engine(folder):
    """stage11's CPU engine (a prefix cache), each step 20 ms longer: a request of 60 tokens runs over a second."""
    from stage11_prefix_caching.cpu_engine import CpuEngine

    class Slow(CpuEngine):
        def step(self):
            time.sleep(0.02)
            return super().step()

    return Slow(folder, max_model_len=96)


@pytest.mark.parametrize("own_process", [True, False])
def test_reset_prefix_cache_empties_the_cache_and_is_refused_while_a_request_runs(tiny_dir, own_process):
    """POST /reset_prefix_cache (vLLM's route) over stage11's engine, in its own process and in this one: a
    prompt sent again after it finds nothing cached; while a request runs it is a 409 in the engine's one line,
    and the cache stays as it was."""
    from .test_serve_cpu import MODEL, Running, metric, post

    engine = EngineProcess(slow_prefix_engine, str(tiny_dir)) if own_process else slow_prefix_engine(str(tiny_dir))
    running = Running(engine)
    try:
        client, url = running.client(), running.url
        kw = {"model": MODEL, "max_tokens": 3, "temperature": 0, "extra_body": {"ignore_eos": True}}

        def cached() -> int:
            got = client.completions.create(prompt=list(range(1000, 1040)), **kw)
            return got.usage.prompt_tokens_details.cached_tokens

        assert cached() == 0 and cached() == 32                # the second finds the first's two full blocks
        request = urllib.request.Request(url + "/reset_prefix_cache", b"", method="POST")
        with urllib.request.urlopen(request, timeout=30) as r:
            assert (r.status, r.read()) == (200, b"")
        assert cached() == 0
        stream = client.completions.create(**(kw | {"max_tokens": 60}), prompt="a long one", stream=True)
        next(iter(stream))
        code, answer = post(url + "/reset_prefix_cache", None)
        want = "reset_prefix_cache() needs an engine with no unfinished requests"     # the engine's one line
        assert (code, answer["error"]["message"]) == (409, want), answer
        stream.close()
        assert cached() == 32                                   # the refused reset left the cache alone
        assert metric(url, "tiny_vllm:prefix_cache_hits_total") == 64
    finally:
        running.close()
        if own_process:
            engine.close()


def test_a_prefix_cache_reset_over_an_engine_without_one_is_a_400_in_its_own_process_too(remote):
    from .test_serve_cpu import Running, post

    running = Running(remote)
    try:
        code, answer = post(running.url + "/reset_prefix_cache", None)
        assert code == 400 and answer["error"]["message"].startswith("the engine has no prefix cache"), answer
    finally:
        running.close()


def test_when_the_engine_process_dies_requests_end_and_health_says_so(tiny_dir):
    import json
    import urllib.error
    import urllib.request

    import openai

    from .test_serve_cpu import MODEL, Running

    ep = EngineProcess(build_engine, None, str(tiny_dir), 96)
    running = Running(ep)
    try:
        client = running.client()
        stream = iter(client.completions.create(model=MODEL, prompt="a long one", max_tokens=80, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}))
        next(stream)
        ep._proc.kill()                                          # the engine crashes mid-stream
        with pytest.raises(openai.APIError, match="engine process exited"):
            for _ in stream:
                pass
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(running.url + "/health", timeout=10)
        assert e.value.code == 503 and json.loads(e.value.read())["status"] == "dead"
        with pytest.raises(openai.APIStatusError, match="engine is not running") as e:
            client.completions.create(model=MODEL, prompt="anyone?", max_tokens=4)
        assert e.value.status_code == 503
    finally:
        running.close()
        ep.close()


def test_engine_options_reach_the_engine_and_one_it_does_not_take_is_refused(tiny_dir):
    assert build_engine(None, str(tiny_dir), 96, {"max_num_seqs": 3, "block_size": None}).max_num_seqs == 3
    with pytest.raises(EngineOptionError, match="05_continuous_batch's CPU engine takes no --block-size, "
                                                "--gpu-memory-utilization"):
        build_engine("05", str(tiny_dir), 96, {"gpu_memory_utilization": 0.5, "block_size": 16})


def test_the_command_line_serves_with_engine_process(tiny_dir):
    """`python -m common.serve`, as a user starts it (the engine in its own process by default): the spawned child
    must find the factory by module and name (it cannot import the parent's __main__ when the parent ran with -m),
    and builds the engine with the options given (--max-num-seqs); one completion, then Ctrl-C ends both
    processes."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from common.serve.server import loopback_socket

    with loopback_socket() as sock:                   # a free port, released for the server to take
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "common.serve", "--model", str(tiny_dir), "--port", str(port),
                             "--max-model-len", "96", "--max-num-seqs", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited with {proc.returncode}:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "the server did not answer /health in 120 s"
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        body = json.dumps({"model": str(tiny_dir), "prompt": "one two", "max_tokens": 4, "temperature": 0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, proc.stdout.read()
