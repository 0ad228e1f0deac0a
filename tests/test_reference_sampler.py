"""CPU: the numpy reference sampler (common/reference.py sample_reference) draws tokens in proportion to
softmax(logits / T), whether it keeps every token at once (no top-k, top-p 1: no sort of the vocabulary) or
through its sorted top-k / top-p path with nothing cut; greedy is the first argmax."""
import numpy as np

from common.reference import sample_reference, softmax
from common.sampling import SamplingParams


def frequencies(params, logits, n=20000, seed=3):
    rng = np.random.default_rng(seed)
    return np.bincount([sample_reference(logits, params, rng) for _ in range(n)], minlength=len(logits)) / n


def test_both_paths_draw_in_proportion_to_the_probabilities():
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0, 1.5], np.float32)
    want = softmax(logits.astype(np.float64) / 0.8)
    sigma = np.sqrt(want * (1 - want) / 20000)
    for params in (SamplingParams(temperature=0.8),                          # every token kept: no sort
                   SamplingParams(temperature=0.8, top_k=len(logits)),        # the sorted path, nothing cut
                   SamplingParams(temperature=0.8, top_p=0.999999)):
        got = frequencies(params, logits)
        assert np.all(np.abs(got - want) < 5 * sigma), (params, got, want)


def test_top_k_cuts_and_greedy_takes_the_first_maximum():
    logits = np.array([2.0, 1.0, 2.0, -1.0], np.float32)
    assert set(np.flatnonzero(frequencies(SamplingParams(temperature=1.0, top_k=2), logits, n=2000))) == {0, 2}
    assert sample_reference(logits, SamplingParams(temperature=0.0), np.random.default_rng(0)) == 0


def test_top_p_is_taken_of_what_top_k_kept():
    """vLLM's order: top-k, then top-p of the kept tokens' own mass. Probabilities 0.4, 0.3, 0.2, 0.1 with
    top_k = 2 and top_p = 0.5: the first token holds 0.4 / 0.7 = 57% of what top-k kept, so it alone is kept
    (taken over the whole vocabulary, 0.4 < 0.5 would have kept both)."""
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    got = frequencies(SamplingParams(temperature=1.0, top_k=2, top_p=0.5), logits, n=2000)
    assert set(np.flatnonzero(got)) == {0}
    got = frequencies(SamplingParams(temperature=1.0, top_k=2, top_p=0.6), logits, n=2000)
    assert set(np.flatnonzero(got)) == {0, 1}                   # 0.57 < 0.6: both
