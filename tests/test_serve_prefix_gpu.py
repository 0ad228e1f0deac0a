"""GPU tier: POST /reset_prefix_cache (vLLM's route) over stage11's engine on the 1B preset, in a process of its own
(the command line's default): a prompt sent again finds its full blocks cached, a reset empties the cache (the same
prompt then finds nothing), and a reset while a request streams is a 409 that leaves the cache as it was; once the
stream is dropped nothing runs and nothing waits."""
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (the dev extra)")
pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")

from common.serve.engine_process import EngineProcess
from common.serve.engines import build_engine

from .test_serve_cpu import MODEL, Running, metric, post

pytestmark = pytest.mark.gpu
ONE_B, LEN = "llama-3.2-1b", 4096


@pytest.fixture(scope="module")
def served():
    engine = EngineProcess(build_engine, "11", ONE_B, LEN, {"kv_cache_memory_bytes": 2**30})
    running = Running(engine)
    yield running, running.client()
    running.close()
    engine.close()


def test_reset_prefix_cache_empties_the_cache_and_is_refused_while_a_request_runs(served):
    running, client = served
    url = running.url
    kw = {"model": MODEL, "max_tokens": 3, "temperature": 0, "extra_body": {"ignore_eos": True}}

    def cached() -> int:
        got = client.completions.create(prompt=list(range(1000, 1100)), **kw)
        return got.usage.prompt_tokens_details.cached_tokens

    first, again = cached(), cached()
    assert first == 0 and again > 0, (first, again)          # the second finds the first's full blocks
    request = urllib.request.Request(url + "/reset_prefix_cache", b"", method="POST")
    with urllib.request.urlopen(request, timeout=30) as r:
        assert (r.status, r.read()) == (200, b"")
    assert cached() == 0
    # 3,000 tokens at about a millisecond a step: the stream runs for seconds, the reset comes within milliseconds
    stream = client.completions.create(**(kw | {"max_tokens": 3000}), prompt="a long one", stream=True)
    next(iter(stream))
    code, answer = post(url + "/reset_prefix_cache", None)
    want = "reset_prefix_cache() needs an engine with no unfinished requests"     # the engine's one line
    assert (code, answer["error"]["message"]) == (409, want), answer
    stream.close()
    assert cached() == again                                   # the refused reset left the cache alone
    for _ in range(200):                                       # bounded: 10 s for the abort to reach the engine
        if metric(url, "tiny_vllm:num_requests_running") == 0 == metric(url, "tiny_vllm:num_requests_waiting"):
            break
        time.sleep(0.05)
    assert metric(url, "tiny_vllm:num_requests_running") == 0 == metric(url, "tiny_vllm:num_requests_waiting")
