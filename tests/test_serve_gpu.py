"""GPU tier: the server over stage05 and over the newest stage with the step API (on a thread, and in a process
of its own), on the 1B preset, driven by the openai client: a greedy request's text through the server equals the
engine's generate() alone, streams say what whole answers say, seeds reproduce, stop strings cut, 32 concurrent
streams each get their own greedy tokens (by the decided-step rule of common/testing.py: their steps are batched
with the others'), and a client that goes away leaves nothing running."""
import inspect
import threading
import time

import pytest

openai = pytest.importorskip("openai", reason="the server tests drive it with the openai client (the dev extra)")
pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")

from common.sampling import SamplingParams
from common.serve.engine_process import EngineProcess
from common.serve.engines import build_engine, engine_class
from common.testing import check_greedy

from .test_serve_cpu import MODEL, Running, metric

pytestmark = pytest.mark.gpu
ONE_B, LEN = "llama-3.2-1b", 512


@pytest.fixture(scope="module", params=["newest-own-process", "05", "newest"])
def served(request):
    """The server over stage05, over the newest stage on a thread of this process, and over the newest stage in
    a process of its own (the command line's default)."""
    stage, own_process = (None if request.param.startswith("newest") else request.param,
                          request.param.endswith("process"))
    cls, _ = engine_class(stage)
    # the process's engine gets a KV cache of a fixed size: its default pool would be sized from the memory this
    # process's engines of earlier tests have not yet given back
    engine = (EngineProcess(build_engine, stage, ONE_B, LEN, beside(cls)) if own_process
              else build_engine(stage, ONE_B, LEN))
    running = Running(engine)
    alone = cls(ONE_B, max_model_len=LEN, max_num_seqs=1, **beside(cls))   # each request alone
    yield running, running.client(), alone
    running.close()
    if own_process:
        engine.close()


def beside(engine_class) -> dict:
    """Arguments for a second engine beside the server's: a paged engine's pool takes 0.9 of the GPU by default
    (vLLM's gpu_memory_utilization), so the second gets 1 GiB of KV cache of its own."""
    return ({"kv_cache_memory_bytes": 2**30}
            if "kv_cache_memory_bytes" in inspect.signature(engine_class).parameters else {})


def greedy(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_greedy_text_through_the_server_equals_generate(served):
    _, client, alone = served
    got = client.completions.create(model=MODEL, prompt="Hello, world!", max_tokens=32, temperature=0,
                                    extra_body={"ignore_eos": True, "return_token_ids": True})
    want = alone.generate(["Hello, world!"], greedy(32))[0]
    assert got.choices[0].text == want.text and got.model_dump()["choices"][0]["token_ids"] == want.token_ids
    messages = [{"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True})
    ids = alone.prompts.tokenizer.encode_chat(messages)
    assert chat.choices[0].message.content == alone.generate([ids], greedy(16))[0].text


def test_a_stream_says_what_the_whole_answer_says(served):
    _, client, _ = served
    kw = dict(model=MODEL, prompt="Once upon", max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == 20


def test_seeds_reproduce_and_a_stop_string_cuts(served):
    _, client, _ = served

    def sample(seed):
        return client.completions.create(model=MODEL, prompt="abc", max_tokens=12, temperature=1.0,
                                         seed=seed).choices[0].text
    assert sample(7) == sample(7) and len({sample(s) for s in range(4)}) > 1
    full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    cut = next(i for i in range(2, len(full) - 2) if full[i:i + 2].strip())
    got = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=0,
                                    stop=[full[cut:cut + 2]], extra_body={"ignore_eos": True})
    assert got.choices[0].text == full[:full.find(full[cut:cut + 2])] and got.choices[0].finish_reason == "stop"


def test_concurrent_streams_each_get_their_own_tokens(served):
    _, client, alone = served
    prompts = [f"request {i}: tell me about the number {i * 7}" for i in range(32)]
    got, errors = [None] * len(prompts), {}

    def one(i):
        try:
            stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=24, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True, "return_token_ids": True})
            got[i] = [t for c in stream for t in c.model_dump()["choices"][0]["token_ids"]]
        except Exception as e:                    # a thread's error would otherwise be lost, leaving got[i] None
            errors[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    late = [i for i, t in enumerate(threads) if t.is_alive()]
    assert not late and not errors, f"streams unfinished after 120 s: {late}; streams that failed: {errors}"
    assert [len(g) for g in got] == [24] * len(prompts), [len(g) for g in got]
    want = alone.generate(prompts, greedy(24))
    seqs = [w.prompt_token_ids + w.token_ids[:-1] for w in want]
    n_prompt = [len(w.prompt_token_ids) for w in want]
    want_logits = [alone.decode_logits([s], [n])[0] for s, n in zip(seqs, n_prompt)]
    batched = type(alone)(ONE_B, max_model_len=LEN, max_num_seqs=32, **beside(type(alone)))   # a batched step
    got_logits = batched.decode_logits(seqs, n_prompt)
    del batched
    parted, broken = [], []
    for i, (g, w, gl, wl) in enumerate(zip(got, want, got_logits, want_logits)):
        try:
            parted.append(check_greedy(g, w.token_ids, gl, wl))
        except AssertionError as e:
            broken.append(f"stream {i}: {e}")
    equal = sum(p is None for p in parted)
    print(f"{equal} of {len(prompts)} streams equal the request alone token for token")
    # every stream is its own request's: equal to it alone, or parted at a step the logits' error can flip
    assert not broken, f"{len(broken)} of {len(prompts)} streams break the greedy rule:\n" + "\n".join(broken)


def test_a_client_that_goes_away_leaves_nothing_running(served):
    running, client, _ = served
    stream = client.completions.create(model=MODEL, prompt="tell me", max_tokens=400, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    for _ in range(200):                          # bounded: 10 s for the abort to reach the engine
        if metric(running.url, "tiny_vllm:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert metric(running.url, "tiny_vllm:num_requests_running") == 0
    assert metric(running.url, "tiny_vllm:kv_cache_usage_perc") == 0
    assert not running.loop.engine.has_unfinished_requests()
