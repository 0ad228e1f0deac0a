"""CPU tier: the load generator of common.bench_serving against a loopback server over the numpy engine: every
streamed request gets all its tokens and the same text as the engine alone, a fault run's disconnected clients
are aborted and its malformed requests refused, and /metrics reads idle after each run."""
import asyncio
import json

import numpy as np
import pytest

pytest.importorskip("uvicorn", reason="the server needs fastapi and uvicorn (the serve extra)")
pytest.importorskip("openai", reason="the server tests use the openai client (the dev extra)")

from common.bench.serving import (check, figures, idle_metrics, plan, send_all, send_conversations,
                                  serve_runs)
from common.reference import ReferenceEngine
from common.sampling import SamplingParams
from common.serve.engines import build_engine

from .test_serve_cpu import MODEL, Recording, Running


def requests(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 120, int(rng.integers(2, 20))).tolist(),
             SamplingParams(max_tokens=int(rng.integers(2, 12)), temperature=0.0, ignore_eos=True))
            for _ in range(n)]


@pytest.fixture(scope="module")
def running(tiny_dir):
    r = Running(Recording(str(tiny_dir), max_model_len=96, max_num_seqs=4))
    yield r
    r.close()


def port(running):
    return int(running.url.rsplit(":", 1)[1])


def test_a_load_run_streams_every_token_and_the_engines_text(running, tiny_dir):
    reqs = requests()
    planned = plan(reqs, MODEL, fault=False)
    results, wall = asyncio.run(send_all("127.0.0.1", port(running), planned, concurrency=5, rate=float("inf")))
    assert check(planned, results) == []
    want = ReferenceEngine(str(tiny_dir), max_model_len=96).generate([p for p, _ in reqs], [s for _, s in reqs])
    assert [r.text for r in results] == [w.text for w in want]
    f = figures(planned, results, wall)
    assert f["completed"] == len(reqs) and f["output_tok_per_s"] > 0 and f["ttft_p50_ms"] <= f["ttft_p99_ms"]
    assert not any(idle_metrics(running.url).values())


def test_a_fault_run_aborts_the_clients_that_leave_and_refuses_the_malformed(running):
    reqs = requests(n=40, seed=1)
    planned = plan(reqs, MODEL, fault=True, seed=3)
    gone, bad = sum(p.disconnect_after is not None for p in planned), sum(p.malformed for p in planned)
    assert gone and bad                                     # the seed draws both kinds
    before = len(running.loop.engine.aborted)
    results, _ = asyncio.run(send_all("127.0.0.1", port(running), planned, concurrency=8, rate=200.0))
    assert check(planned, results) == []                    # every other request complete, every bad one a 400
    assert not any(idle_metrics(running.url).values())
    # a client that left before its last token was aborted (one that left as its last token came may finish)
    assert 0 < len(running.loop.engine.aborted) - before <= gone


def test_every_run_starts_with_an_empty_prefix_cache_and_counts_its_own_hits(tiny_dir):
    """Over stage11's engine: a prompt, another, and the first again, one at a time. Each run (the fault run too)
    starts cold, as the engine alone's runs do, so only the repeat finds its two full blocks: 32 of 120 prompt
    tokens in every run (without the reset, after the warm-up's same requests, all 96 of the full blocks')."""
    a, b = list(range(1000, 1040)), list(range(2000, 2040))
    reqs = [(p, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)) for p in (a, b, a)]
    r = Running(build_engine("11", str(tiny_dir), 96))
    try:
        out = serve_runs(r.url, reqs, MODEL, concurrency=1, rate=float("inf"), repeats=2, fault=True)
    finally:
        r.close()
    assert out["problems"] == [] == out["fault"]["problems"]
    assert [(run["prefix_cache_queries"], run["prefix_cache_hits"]) for run in out["runs"] + [out["fault"]]] == [
        (120, 32)] * 3


def test_runs_over_an_engine_without_a_prefix_cache_count_none(running):
    out = serve_runs(running.url, requests(n=4), MODEL, concurrency=2, rate=float("inf"), repeats=1, fault=False)
    assert out["problems"] == [] and out["runs"][0]["completed"] == 4
    assert not {"prefix_cache_queries", "prefix_cache_hits"} & set(out["runs"][0])


def test_chat_turns_carry_every_earlier_message_and_answer_as_the_engine_alone_sees_them(tiny_dir):
    """Conversations through stage11's server, each turn sent when the answer before it finished: every turn
    complete, and each turn's prompt (the conversation so far, the answers' ids from return_token_ids) finds the
    turns before it cached; the same conversations through the engine alone give the same answers."""
    rng = np.random.default_rng(5)
    convs = [[(rng.integers(0, 120, 20).tolist(), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
              for _ in range(3)] for _ in range(4)]
    r = Running(build_engine("11", str(tiny_dir), 96))
    try:
        out = serve_runs(r.url, [c[0] for c in convs], MODEL, concurrency=2, rate=float("inf"), repeats=1,
                         fault=False, conversations=convs)
        planned, results, _, turns = asyncio.run(send_conversations("127.0.0.1", port(r), convs, MODEL, 2))
    finally:
        r.close()
    assert out["problems"] == [] and out["runs"][0]["completed"] == 12
    assert set(turns) == {"ttft_ms_turn1", "ttft_ms_turn2", "ttft_ms_turn3"}
    assert out["runs"][0]["prefix_cache_hits"] > 0                  # later turns find the conversation so far
    engine = ReferenceEngine(str(tiny_dir), max_model_len=96)
    for conv in convs:                                              # one conversation's turns, in order
        history = []
        for message, params in conv:
            history = history + message
            answer = engine.generate([history], params)[0].token_ids
            got = [r for p, r in zip(planned, results) if json.loads(p.body)["prompt"] == history]
            assert got and got[0].token_ids == list(answer), history
            history = history + list(answer)


def test_check_names_a_request_short_of_its_tokens():
    planned = plan(requests(n=2), MODEL, fault=False)
    from common.bench.client import StreamResult

    short = [StreamResult(200, completion_tokens=p.max_tokens - 1, finish_reason="length") for p in planned]
    assert [w.split(":")[0] for w in check(planned, short)] == ["request 0", "request 1"]


def test_without_a_gpu_a_run_of_the_1b_is_refused_in_one_line(capsys):
    """It wrote the 1B's 2.47 GB of synthetic weights and then failed with a traceback: now it says at once what
    runs on a CPU. A stage that does not exist is one line too."""
    from common.bench.serving import main
    from common.device import has_gpu

    if has_gpu()[0]:
        pytest.skip("a GPU serves the 1B")
    for argv, says in ((["--stage", "05", "--fault"], "use --model tiny --workload cpu"),
                       (["--stage", "99", "--model", "tiny", "--workload", "cpu"], "--stage: no stage or baseline")):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2 and says in capsys.readouterr().err
