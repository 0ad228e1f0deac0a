"""The transformers baselines of the harness (common/bench/hf_engine.py), on the CPU: batched with left padding, through
the StaticCache path of hf-compile, and through transformers' continuous batching (hf-cb), they give the same
greedy tokens as one request at a time."""
import numpy as np
import pytest

from common.sampling import SamplingParams

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def requests():
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 128000, n).tolist() for n in (5, 12, 9)]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (4, 7, 3)]
    return prompts, params


def _tokens(outs):
    return [o.token_ids for o in outs]


def test_batched_left_padding_equals_one_at_a_time(tiny_dir, requests):
    from common.bench.hf_engine import Engine

    one = Engine(str(tiny_dir), attn_implementation="sdpa", device="cpu", dtype="float32")
    batched = Engine(str(tiny_dir), attn_implementation="sdpa", batch_size=3, device="cpu", dtype="float32")
    want, got = _tokens(one.generate(*requests)), _tokens(batched.generate(*requests))
    assert [len(t) for t in got] == [4, 7, 3]            # each row keeps its own max_tokens, no more
    assert got == want
    assert [len(t.step_s) for t in batched.timings] == [3, 6, 2]   # ticks only within a row's own budget


def test_static_cache_path_equals_eager(tiny_dir, requests):
    from common.bench.hf_engine import Engine

    eager = Engine(str(tiny_dir), device="cpu", dtype="float32")
    static = Engine(str(tiny_dir), attn_implementation="sdpa", compile=True, device="cpu", dtype="float32")
    assert _tokens(static.generate(*requests)) == _tokens(eager.generate(*requests))


def test_continuous_batching_equals_one_at_a_time_each_request_with_its_own_max_tokens(tiny_dir, requests):
    """hf-cb: the three requests in transformers' manager at once, each stopping at its own max_tokens; a second
    generate() reuses the manager (made once) and gives the same tokens; each token of a request is timed."""
    from common.bench.hf_engine import Engine

    one = Engine(str(tiny_dir), attn_implementation="sdpa", device="cpu", dtype="float32")
    cb = Engine(str(tiny_dir), attn_implementation="sdpa", continuous_batching=True, max_num_seqs=4, device="cpu",
                dtype="float32")
    want = _tokens(one.generate(*requests))
    got = _tokens(cb.generate(*requests))
    assert [len(t) for t in got] == [4, 7, 3] and got == want
    assert [len(t.step_s) for t in cb.timings] == [3, 6, 2] and all(t.ttft_s > 0 for t in cb.timings)
    assert _tokens(cb.generate(*requests)) == want


def test_mixed_sampling_parameters_are_not_batched(tiny_dir, requests):
    from common.bench.hf_engine import Engine

    prompts, params = requests
    batched = Engine(str(tiny_dir), attn_implementation="sdpa", batch_size=3, device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="differ in max_tokens alone"):
        batched.generate(prompts, [params[0], SamplingParams(max_tokens=2, temperature=0.5), params[2]])
