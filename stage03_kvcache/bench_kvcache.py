"""Decode with a KV cache (pytest-benchmark). Against stage02 in the same run: the harness,
`python -m common.bench --stages 02,03 --workload latency|growth` (a stage never imports another).

    pytest <this stage>/bench_kvcache.py --benchmark-only -m gpu

  latency   ms per decode step and time to first token, 128 prompt + 256 new tokens (1B preset, greedy)
  growth    decode tok/s over the first 64, 256 and 1024 new tokens after a 512-token prompt
  split     one decode step at cache lengths 128 and 1024: GPU time alone, host time to queue it, wall time
"""
import statistics

import numpy as np
import pytest

from common.bench.measure import gpu_and_host_ms, growth_rates
from common.bench.workloads import make_requests

ONE_B = "llama-3.2-1b"
MAX_LEN = 2048

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def engine():
    from . import Engine

    return Engine(ONE_B, max_model_len=MAX_LEN)


def record(benchmark, **info):
    for k, v in info.items():
        benchmark.extra_info[k] = round(v, 4) if isinstance(v, float) else v


@pytest.mark.parametrize("workload", ["latency", "growth"])
def test_decode(benchmark, engine, workload):
    prompts, params = zip(*make_requests(workload))
    steps = []

    def run():
        engine.generate(list(prompts), list(params))
        steps.append(engine.timings[0])

    benchmark.pedantic(run, rounds=3, warmup_rounds=1)
    steps = steps[-3:]                           # the timed rounds: pytest-benchmark runs the warm-up round first
    step_s = [t.step_s for t in steps]
    record(benchmark, ms_per_decode_step=1e3 * statistics.median(s for run in step_s for s in run),
           ttft_ms=1e3 * statistics.median(t.ttft_s for t in steps), prompt_tokens=len(prompts[0]),
           new_tokens=params[0].max_tokens)
    if workload == "growth":
        record(benchmark, **growth_rates(steps))


@pytest.mark.parametrize("length", [128, 1024])
def test_decode_step_split(benchmark, engine, length):
    """One decode step over a cache of `length` positions: GPU work alone (the spin-kernel method of
    common.bench), the host's time to queue its ~170 launches, and the wall time of a real step."""
    engine._write_ids(np.random.default_rng(length).integers(0, 128000, length + 1).tolist())
    engine.model.forward(0, length)                                   # the cache holds `length` positions
    vocab = engine.config.vocab_size
    next_id = engine.model.ids.view(4 * (length + 1), (1,))

    def enqueue():
        engine.model.cache.length = length                            # the same step again, not an append
        logits = engine.model.forward(length, 1)
        engine.kernels.sample(logits.view(0, (vocab,)), next_id, 0.0, 0, 1.0, 0, 0)

    def step():
        enqueue()
        engine.gpu.to_host(next_id)

    benchmark.pedantic(step, rounds=20, warmup_rounds=3)
    split = gpu_and_host_ms(engine.gpu, enqueue)
    wall = 1e3 * benchmark.stats.stats.median
    floor = engine.checkpoint.total_bytes / (engine.gpu.copy_bandwidth_gbps() * 1e9) * 1e3
    record(benchmark, cache_length=length, wall_ms=wall, gpu_ms=split["gpu_ms"],
           host_queue_ms=split["host_queue_ms"], gpu_idle_share=1 - split["gpu_ms"] / wall,
           bandwidth_floor_ms=floor)
