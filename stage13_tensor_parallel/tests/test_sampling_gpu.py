"""GPU tier: the sampling kernel. Greedy is the first argmax; a seed fixes the tokens; top-k / top-p never leave
their allowed set; temperature sampling draws from softmax(logits / T) (a chi-square test, fixed seed)."""
import numpy as np
import pytest

from common.device import get_gpu
from common.reference import softmax

pytestmark = pytest.mark.gpu


def launch(kernels, logits, temperature, top_k, top_p, seed, counter, logit_seq_slots=None, greedy_ids=None):
    """One launch over the rows of logits (n, V). The parameter sequences are per seq_slot; row r uses seq_slot
    logit_seq_slots[r] (default: row r's own, r); greedy_ids, where given, the LM head's argmax of each row."""
    gpu = kernels.gpu
    n = len(logits)
    out = gpu.empty((n,), "i32")
    gpu.fill_bytes(out, 0xFF)
    slots = np.arange(n) if logit_seq_slots is None else logit_seq_slots
    kernels.sample(gpu.to_device(np.asarray(logits, np.float32)),
                   *(gpu.to_device(np.asarray(a, t)) for a, t in ((temperature, np.float32), (top_k, np.int32),
                                                                  (top_p, np.float32), (seed, np.uint64),
                                                                  (slots, np.int32), (counter, np.int32))), out,
                   None if greedy_ids is None else gpu.to_device(np.asarray(greedy_ids, np.int32)))
    return gpu.to_host(out)


@pytest.fixture(scope="module")
def kernels():
    from ..kernels import Kernels

    return Kernels(get_gpu())


@pytest.fixture(scope="module")
def sampler(kernels):
    def draw(logits, temperature=1.0, top_k=0, top_p=1.0, seed=0, counters=range(1)):
        """The draws for each counter: the same row repeated in batches of up to 1024 rows."""
        counters, picks = list(counters), []
        for i in range(0, len(counters), 1024):
            c = counters[i:i + 1024]
            picks.append(launch(kernels, np.tile(np.asarray(logits, np.float32), (len(c), 1)), [temperature] * len(c),
                                [top_k] * len(c), [top_p] * len(c), [seed] * len(c), c))
        return np.concatenate(picks)

    return draw


def test_each_row_of_a_batch_uses_its_own_parameters(kernels):
    """Eight rows with different logits, temperatures, top-k, top-p, seeds and counters in one launch give
    exactly what each row gives alone."""
    rng = np.random.default_rng()
    B, V = 8, 128256
    logits = rng.normal(0, 2, (B, V))
    params = ([0.0, 1.0, 0.7, 2.0, 0.0, 1.3, 1.0, 0.5], [0, 5, 0, 50, 3, 0, 1, 40], [1.0, 1.0, 0.9, 0.5, 1.0, 0.95,
              1.0, 0.8], rng.integers(0, 2**63, B).tolist(), [0, 3, 17, 4, 9, 100, 2, 5])
    together = launch(kernels, logits, *params)
    alone = [launch(kernels, logits[b:b + 1], *([p[b]] for p in params))[0] for b in range(B)]
    assert together.tolist() == alone
    assert together[0] == logits[0].argmax() and together[4] == logits[4].argmax()     # the greedy rows


def test_greedy_rows_take_the_lm_head_s_ids_where_given_and_sampled_rows_ignore_them(kernels):
    """With greedy_ids (gemv_norm_head found the argmax), a greedy row's token is its id, not looked for again in
    the logits (ids planted unlike the argmax show it), and a sampling row draws as it does without them."""
    rng = np.random.default_rng()
    B, V = 6, 128256
    logits = rng.normal(0, 2, (B, V))
    params = ([0.0, 1.0, 0.0, 0.7, 0.0, 1.3], [0, 5, 0, 0, 3, 40], [1.0, 1.0, 1.0, 0.9, 1.0, 0.8],
              rng.integers(0, 2**63, B).tolist(), [0, 3, 17, 4, 9, 100])
    planted = [7, 8, 9, 10, 11, 12]
    with_ids = launch(kernels, logits, *params, greedy_ids=planted)
    without = launch(kernels, logits, *params)
    greedy = [0, 2, 4]
    assert with_ids[greedy].tolist() == [planted[b] for b in greedy]
    assert without[greedy].tolist() == logits[greedy].argmax(1).tolist()
    assert with_ids[[1, 3, 5]].tolist() == without[[1, 3, 5]].tolist()


@pytest.mark.parametrize("V", [1, 5, 1000, 128256])
def test_greedy_is_the_first_argmax(sampler, V):
    rng = np.random.default_rng()
    logits = rng.normal(0, 1, V).astype(np.float32)
    assert sampler(logits, temperature=0.0)[0] == np.argmax(logits)
    logits[V // 3] = logits[V - 1] = logits.max() + 1                       # a tie: the lower index wins
    assert sampler(logits, temperature=0.0)[0] == V // 3


def test_same_seed_same_tokens_other_seed_other_tokens(sampler):
    logits = np.random.default_rng(3).normal(0, 1, 128256)
    a = sampler(logits, 1.0, seed=1234, counters=range(64))
    assert np.array_equal(a, sampler(logits, 1.0, seed=1234, counters=range(64)))
    assert not np.array_equal(a, sampler(logits, 1.0, seed=1235, counters=range(64)))
    assert len(set(a.tolist())) > 32                                          # the counter advances the draw


def allowed_set(logits, temperature, top_k, top_p):
    """The reference rule (common.reference.sample_reference): the top_k most likely, cut to the smallest
    prefix holding top_p of their probability."""
    probs = softmax(np.asarray(logits, np.float64) / temperature)
    order = np.argsort(-probs, kind="stable")
    keep = len(order) if top_k <= 0 else min(top_k, len(order))
    cum = np.cumsum(probs[order[:keep]])
    keep = min(keep, int(np.searchsorted(cum, top_p * cum[-1])) + 1)
    return set(order[:keep].tolist())


@pytest.mark.parametrize("V, temperature, top_k, top_p", [(128256, 1.0, 5, 1.0), (128256, 0.7, 0, 0.9),
                                                          (1000, 2.0, 50, 0.5), (300, 1.0, 1, 1.0),
                                                          (128256, 1.5, 40, 0.95)])
def test_top_k_top_p_never_leave_the_allowed_set(sampler, V, temperature, top_k, top_p):
    rng = np.random.default_rng()
    logits = rng.normal(0, 3, V).astype(np.float32)
    allowed = allowed_set(logits, temperature, top_k, top_p)
    picks = sampler(logits, temperature, top_k, top_p, seed=int(rng.integers(2**63)), counters=range(400))
    assert set(picks.tolist()) <= allowed
    if len(allowed) > 1:
        assert len(set(picks.tolist())) > 1                                   # and it does sample, not argmax


def test_top_p_is_taken_of_what_top_k_kept(sampler):
    """vLLM's order: top-k, then top-p of the kept tokens' own mass. Probabilities 0.4, 0.3, 0.2, 0.1 with
    top_k = 2, top_p = 0.5: the first token holds 57% of what top-k kept, so it alone may be drawn (over the whole
    vocabulary 0.4 < 0.5, and the second would be drawn too); at top_p = 0.6 both."""
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    assert set(sampler(logits, 1.0, 2, 0.5, seed=5, counters=range(400)).tolist()) == {0}
    assert set(sampler(logits, 1.0, 2, 0.6, seed=5, counters=range(400)).tolist()) == {0, 1}


def test_temperature_sampling_matches_softmax(sampler):
    """8 tokens, T = 0.8, 20000 draws with seed 7: Pearson's chi-square against softmax(l / T) with 7 degrees
    of freedom. A correct sampler exceeds 24.32 with probability 0.001 (and the seed is fixed, so the test is
    deterministic); a sampler that ignored T, or drew from the wrong distribution, lands in the hundreds."""
    logits = np.array([1.0, 0.5, -0.3, 2.0, 0.0, -1.0, 1.5, 0.2], np.float32)
    n = 20000
    picks = sampler(logits, 0.8, seed=7, counters=range(n))
    observed = np.bincount(picks, minlength=8)
    expected = n * softmax(logits.astype(np.float64) / 0.8)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 24.32, (chi2, observed, expected.round())
    wrong = n * softmax(logits.astype(np.float64))                            # T ignored: clearly rejected
    assert float(((observed - wrong) ** 2 / wrong).sum()) > 100


def test_each_row_samples_with_its_seq_slots_parameters(kernels):
    """Parameters live per seq_slot; rows name theirs in any order (packed rows of a continuous batch): the
    draws equal those of rows that carry the same parameters directly."""
    rng = np.random.default_rng(11)
    n, S, V = 6, 9, 5000
    logits = rng.normal(0, 3, (n, V))
    temperature = rng.choice([0.0, 0.7, 1.5], S)
    top_k, top_p = rng.integers(0, 50, S), rng.uniform(0.5, 1.0, S)
    seed = rng.integers(0, 2**63, S, dtype=np.uint64)
    slots = rng.permutation(S)[:n]
    counters = rng.integers(0, 100, n)
    by_slot = launch(kernels, logits, temperature, top_k, top_p, seed, counters, logit_seq_slots=slots)
    direct = launch(kernels, logits, temperature[slots], top_k[slots], top_p[slots], seed[slots], counters)
    assert np.array_equal(by_slot, direct)
    greedy = temperature[slots] == 0.0
    assert np.array_equal(by_slot[greedy], logits[greedy].argmax(-1))
