import pytest

from common.sampling import SamplingParams, SamplingParamsError


def test_defaults_follow_vllm():
    p = SamplingParams()
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed, p.ignore_eos) == (16, 1.0, 0, 1.0, None, False)
    assert SamplingParams(temperature=0).greedy


@pytest.mark.parametrize("kw", [
    {"max_tokens": 0}, {"max_tokens": 1.5}, {"temperature": -0.1}, {"temperature": float("inf")},
    {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.01}, {"seed": -1}, {"seed": 2**64}, {"stop_token_ids": 5},
    {"stop_token_ids": [1, -3]},
])
def test_invalid_values_raise_naming_the_parameter(kw):
    name = next(iter(kw))
    with pytest.raises(SamplingParamsError, match=f"SamplingParams.{name}="):
        SamplingParams(**kw)


def test_stop_ids_become_a_tuple():
    assert SamplingParams(stop_token_ids=[1, 2]).stop_token_ids == (1, 2)
