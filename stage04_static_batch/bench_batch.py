"""Static batches (pytest-benchmark). Against stage03 in the same run: the harness,
`python -m common.bench --stages 03,04 --workload batch` (a stage never imports another).

    pytest <this stage>/bench_batch.py --benchmark-only -m gpu

  batch    output tok/s at B = 1, 8, 32, 64 (128 prompt + 128 new tokens each, 1B preset, greedy)
  ragged   256 requests, prompts and outputs of 100..1024 tokens: output tok/s, slot waste and padding
  step     one decode step of a batch of B at cache length 256: GPU time alone, host time to queue it, wall
"""
import numpy as np
import pytest

from common.bench.measure import gpu_and_host_ms
from common.bench.workloads import make_requests

ONE_B = "llama-3.2-1b"

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine():
    from . import Engine

    return Engine(ONE_B, max_model_len=2048, max_batch_size=64)


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
    record(benchmark, output_tok_per_s=generated_per_s(benchmark, outs[-1]), batches=s.batches,
           slot_steps_held=s.slot_steps_held, slot_steps_used=s.slot_steps_used, slot_waste=s.slot_waste,
           padding_share=s.padding_share)


@pytest.mark.parametrize("B", [1, 32, 64])
def test_decode_step_split(benchmark, engine, B):
    """One decode step of B sequences each holding 256 cached positions: the GPU work alone (the spin-kernel
    method of common.bench), the host's time to queue it, and the wall time of a real step."""
    prompts = [np.random.default_rng(b).integers(0, 128000, 256).tolist() for b in range(B)]
    seqs = [engine._sequence(b, p, make_requests("batch")[0][1]) for b, p in enumerate(prompts)]
    batch = engine._batch(seqs)
    engine.model.set_sampling(seqs)
    for step in batch.prefill_groups(engine.model.max_rows, engine.model.score_capacity):
        engine.model.forward(step)
    batch.record(engine.model.sample(B))
    step = batch.decode_inputs()                                   # the same step again and again: no append
    inputs = engine.model.upload_step(step)

    def enqueue():                                                 # queues only: the split needs no waiting
        engine.model.run_uploaded(step, inputs)
        engine.model.queue_sample(B)

    benchmark.pedantic(lambda: (enqueue(), engine.gpu.sync()), rounds=20, warmup_rounds=3)
    split = gpu_and_host_ms(engine.gpu, enqueue)
    wall = 1e3 * benchmark.stats.stats.median
    floor = engine.checkpoint.total_bytes / (engine.gpu.copy_bandwidth_gbps() * 1e9) * 1e3
    record(benchmark, batch_size=B, cache_length=256, wall_ms=wall, gpu_ms=split["gpu_ms"],
           host_queue_ms=split["host_queue_ms"], tok_per_s=B / wall * 1e3, bandwidth_floor_ms=floor)
