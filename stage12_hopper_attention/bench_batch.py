"""The batching loop under load (pytest-benchmark). Against the other stages and the baselines in the same run:
the harness, `python -m common.bench --ladder --workload ragged` (a stage never imports another).

    pytest <this stage>/bench_batch.py --benchmark-only -m gpu

  batch    output tok/s at B = 1, 8, 32, 64 (128 prompt + 128 new tokens each, 1B preset, greedy)
  ragged   256 requests, prompts and outputs of 100..1024 tokens: output tok/s, slot waste, rows per step
  step     one decode step of B = 1, 64, 256 running sequences at cache length 256: its wall time through
           step(), the GPU's time alone and the host's time to queue it, launched kernel by kernel and as the
           graph's replay (with its inputs' packing and copy), and the loop's own host time (schedule, pack,
           record, detokenise), which asynchronous scheduling runs under the step in flight; and the wall time
           of the same steps without it (wall_sync_ms), the host's planning then between the GPU's steps
"""
import statistics
import time

import numpy as np
import pytest

from common.bench.measure import gpu_and_host_ms
from common.sampling import SamplingParams
from common.bench.workloads import make_requests


ONE_B = "llama-3.2-1b"

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine():
    from . import Engine

    return Engine(ONE_B, max_model_len=2048, max_num_seqs=256)


def record(benchmark, **info):
    for k, v in info.items():
        benchmark.extra_info[k] = round(v, 4) if isinstance(v, float) else v


def generated_per_s(benchmark, outs_of_last_run) -> float:
    return sum(len(o.token_ids) for o in outs_of_last_run) / benchmark.stats.stats.median


def assert_each_request_got_its_tokens(outs, params):
    """What output tok/s counts: every request (greedy, ignore_eos) generated exactly its max_tokens."""
    assert len(outs) == len(params)
    for i, (o, p) in enumerate(zip(outs, params)):
        assert len(o.token_ids) == p.max_tokens and o.finish_reason == "length", \
            f"request {i}: {len(o.token_ids)} of {p.max_tokens} tokens, finish_reason {o.finish_reason!r}"


@pytest.mark.parametrize("B", [1, 8, 32, 64])
def test_batch(benchmark, engine, B):
    prompts, params = zip(*make_requests("batch")[:B])
    outs = []
    benchmark.pedantic(lambda: outs.append(engine.generate(list(prompts), list(params))), rounds=3,
                       warmup_rounds=1)
    assert outs
    for run in outs:                                               # the warm-up too: the same work each round
        assert_each_request_got_its_tokens(run, params)
    record(benchmark, batch_size=B, output_tok_per_s=generated_per_s(benchmark, outs[-1]),
           slot_waste=engine.stats.slot_waste)


def test_ragged(benchmark, engine):
    prompts, params = zip(*make_requests("ragged"))
    outs = []
    benchmark.pedantic(lambda: outs.append(engine.generate(list(prompts), list(params))), rounds=1,
                       warmup_rounds=0)
    assert_each_request_got_its_tokens(outs[-1], params)
    s = engine.stats
    record(benchmark, output_tok_per_s=generated_per_s(benchmark, outs[-1]), steps=s.steps,
           slot_steps_held=s.slot_steps_held, slot_steps_used=s.slot_steps_used, slot_waste=s.slot_waste,
           median_rows_per_step=statistics.median(s.rows), max_rows_per_step=max(s.rows))


@pytest.mark.parametrize("B", [1, 64, 256])
def test_decode_step_split(benchmark, engine, B):
    """B sequences each holding 256 cached positions, all decoding: a real step() (which appends a token each
    time), then the GPU/host split of the same packed step queued again and again."""
    rng = np.random.default_rng(B)
    greedy = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
    prompts = [rng.integers(0, 128000, 256).tolist() for _ in range(B)]

    def decoding():
        ids = [engine.add_request(p, greedy) for p in prompts]
        while any(s.prefilling for s in engine.llm.scheduler.running) or engine.llm.scheduler.waiting:
            engine.step()
        return ids

    engine.llm.async_scheduling = False              # idle between tests: no step in flight to record
    ids = decoding()
    sync_walls = []
    for _ in range(23):
        t = time.perf_counter()
        engine.step()
        sync_walls.append(time.perf_counter() - t)
    for rid in ids:
        engine.abort_request(rid)
    engine.llm.async_scheduling = True               # the engine's default
    ids = decoding()
    engine.llm.scheduler.stats.host_s.clear()
    benchmark.pedantic(engine.step, rounds=20, warmup_rounds=3)
    # the 20 timed rounds: pytest-benchmark runs the 3 warm-up rounds first, and their steps are recorded too
    host_loop_ms = 1e3 * statistics.median(engine.llm.scheduler.stats.host_s[-20:])
    x = engine.llm.scheduler.batch.prepare(engine.llm.scheduler.schedule())   # planned, not advanced
    assert len(x.logit_rows) == B == x.num_rows
    model = engine.model
    inputs = model.upload_step(x)

    def enqueue():                                                 # queues only: the split needs no waiting
        model.run_uploaded(x, inputs)
        model.queue_sample_rows(B)

    split = gpu_and_host_ms(engine.gpu, enqueue)
    replay = gpu_and_host_ms(engine.gpu, lambda: engine.graphs.launch(x))
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():          # the step in flight, recorded for nothing
        engine.step()
    wall = 1e3 * benchmark.stats.stats.median
    floor = engine.checkpoint.total_bytes / (engine.gpu.copy_bandwidth_gbps() * 1e9) * 1e3
    record(benchmark, batch_size=B, cache_length=256, wall_ms=wall, gpu_ms=split["gpu_ms"],
           host_queue_ms=split["host_queue_ms"], graph_gpu_ms=replay["gpu_ms"],
           graph_host_queue_ms=replay["host_queue_ms"], host_loop_ms=host_loop_ms, tok_per_s=B / wall * 1e3,
           wall_sync_ms=1e3 * statistics.median(sync_walls[3:]),
           bandwidth_floor_ms=floor)
