"""The forward pass against its baselines, in one run (pytest-benchmark):

    pytest <this stage>/bench_forward.py --benchmark-only -m gpu

  prefill   tokens/s of one forward over T = 128, 512, 2048 prompt tokens:
            stage02 and the numpy reference on the `small` preset; stage02 and HF transformers (eager) on 1B
  decode    ms per decode step of the `latency` workload (128 prompt + 256 new tokens, greedy): stage02 and
            the numpy reference on small, stage02 and HF transformers on 1B (HF decodes with its KV cache)
  split     one stage02 decode step on 1B: GPU time alone, the host's time to queue it, and the wall time
Every figure is a median after a warm-up call (kernel compilation and first touches excluded).
"""
import statistics

import numpy as np
import pytest

from common.bench.measure import gpu_and_host_ms
from common.bench.workloads import make_requests

PREFILL = [128, 512, 2048]
MAX_LEN = 2304                      # room for the longest prefill and for latency's 128 + 256
ONE_B = "llama-3.2-1b"


def prompt(n: int) -> list[int]:
    return np.random.default_rng(n).integers(0, 128000, n).tolist()


@pytest.fixture(scope="module")
def stage02():
    from . import Engine

    cache = {}

    def get(model):
        if model not in cache:
            cache[model] = Engine(model, max_model_len=MAX_LEN)
        return cache[model]

    return get


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from common.bench.hf_engine import Engine

    return Engine(ONE_B, max_model_len=MAX_LEN)


def prefill_stage02(engine, n):
    engine._write_ids(prompt(n))
    engine.model.forward(n)
    engine.gpu.sync()


def record(benchmark, **info):
    for k, v in info.items():
        benchmark.extra_info[k] = round(v, 4) if isinstance(v, float) else v


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["small", ONE_B])
@pytest.mark.parametrize("n", PREFILL)
def test_prefill_stage02(benchmark, stage02, model, n):
    engine = stage02(model)
    benchmark.pedantic(prefill_stage02, args=(engine, n), rounds=5, warmup_rounds=1)
    record(benchmark, tokens=n, tok_per_s=n / benchmark.stats.stats.median)


@pytest.mark.parametrize("n", PREFILL)
def test_prefill_numpy_reference(benchmark, n):
    from common.reference import ReferenceEngine

    model = ReferenceEngine("small", max_model_len=MAX_LEN).model
    benchmark.pedantic(model.last_logits, args=(prompt(n),), rounds=3, warmup_rounds=1)
    record(benchmark, tokens=n, tok_per_s=n / benchmark.stats.stats.median)


@pytest.mark.gpu
@pytest.mark.parametrize("n", PREFILL)
def test_prefill_hf_eager(benchmark, hf, n):
    torch = hf.torch
    ids = torch.tensor([prompt(n)], device="cuda")

    def run():
        with torch.no_grad():
            hf.model(ids, logits_to_keep=1)
        torch.cuda.synchronize()

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    record(benchmark, tokens=n, tok_per_s=n / benchmark.stats.stats.median)


def decode(benchmark, engine, rounds):
    """The latency workload through engine.generate; the figure is the median decode step over all rounds."""
    prompts, params = zip(*make_requests("latency"))
    runs = []

    def run():
        engine.generate(list(prompts), list(params))
        runs.append(engine.timings[0])

    benchmark.pedantic(run, rounds=rounds, warmup_rounds=1)
    runs = runs[-rounds:]                        # the timed rounds: pytest-benchmark runs the warm-up round first
    record(benchmark, ms_per_decode_step=1e3 * statistics.median(s for t in runs for s in t.step_s),
           ttft_ms=1e3 * statistics.median(t.ttft_s for t in runs), prompt_tokens=len(prompts[0]),
           new_tokens=params[0].max_tokens)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["small", ONE_B])
def test_decode_stage02(benchmark, stage02, model):
    decode(benchmark, stage02(model), rounds=3)


def test_decode_numpy_reference(benchmark):
    from common.reference import ReferenceEngine

    decode(benchmark, ReferenceEngine("small", max_model_len=MAX_LEN), rounds=1)


@pytest.mark.gpu
def test_decode_hf_eager(benchmark, hf):
    decode(benchmark, hf, rounds=3)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [128, 384])   # the first and the last decode step of `latency`
def test_decode_step_split(benchmark, stage02, n):
    """Where one decode step's time goes: GPU work alone (the spin-kernel method of common.bench), the host's
    time to queue its ~150 launches, and the wall time of a real step (queue, run, read back the token)."""
    engine = stage02(ONE_B)
    engine._write_ids(prompt(n))
    vocab = engine.config.vocab_size
    next_id = engine.model.ids.view(4 * n, (1,))

    def enqueue():
        logits = engine.model.forward(n)
        engine.kernels.sample(logits.view(0, (vocab,)), next_id, 0.0, 0, 1.0, 0, 0)

    def step():
        enqueue()
        engine.gpu.to_host(next_id)

    benchmark.pedantic(step, rounds=10, warmup_rounds=2)
    split = gpu_and_host_ms(engine.gpu, enqueue)
    wall = 1e3 * benchmark.stats.stats.median
    record(benchmark, tokens=n, wall_ms=wall, gpu_ms=split["gpu_ms"], host_queue_ms=split["host_queue_ms"],
           gpu_idle_share=1 - split["gpu_ms"] / wall)
