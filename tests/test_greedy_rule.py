"""common/testing.py's greedy rule, on made-up logits: it passes equal runs and explained near-tie divergences,
and fails a divergence at a decided step or one the engine's own logits do not explain."""
import numpy as np
import pytest

from common.testing import check_greedy, decided_steps, flip_bound


def logits_with_margins(margins, V=20, seed=0):
    """(steps, V) logits whose top-1 (token 0) leads token 1 by the given margins."""
    x = np.random.default_rng(seed).normal(0, 1, (len(margins), V)) - 10
    x[:, 0], x[:, 1] = 5.0, 5.0 - np.asarray(margins)
    return x


def test_equal_runs_pass():
    want = logits_with_margins([2.0, 2.0, 2.0])
    assert check_greedy([0, 0, 0], [0, 0, 0], want + 1e-3, want) is None


def test_a_divergence_at_a_near_tie_the_error_can_flip_passes():
    want = logits_with_margins([2.0, 0.01, 2.0])
    got = want.copy()
    got[1, 1] += 0.02                                   # the engines differ by 0.02: the 0.01 margin flips
    assert flip_bound(got, want) == pytest.approx(0.04)
    assert decided_steps(got, want).tolist() == [True, False, True]
    assert check_greedy([0, 1, 0], [0, 0, 0], got, want) == 1


def test_a_divergence_at_a_decided_step_fails():
    want = logits_with_margins([2.0, 1.0, 2.0])
    got = want + 1e-3
    with pytest.raises(AssertionError, match="step 1"):
        check_greedy([0, 1, 0], [0, 0, 0], got, want)


def test_a_divergence_its_own_logits_do_not_explain_fails():
    """The engines differ by at most 0.05 (at token 5): bound 0.1, so the 0.09 margin is undecided. But got's
    own logits put token 0 0.13 above the token 1 it chose: more than the bound allows."""
    want = logits_with_margins([2.0, 0.09, 2.0])
    got = want.copy()
    got[1, 5] += 0.05
    got[1, 0] += 0.02
    got[1, 1] -= 0.02
    assert flip_bound(got, want) == pytest.approx(0.1) and not decided_steps(got, want)[1]
    with pytest.raises(AssertionError, match="not explained"):
        check_greedy([0, 1, 0], [0, 0, 0], got, want)


def test_the_earlier_run_must_have_chosen_its_own_top1_where_decided():
    """want's tokens came from its generating path, want_logits from its teacher-forced one: where the choice
    is decided, the two must agree (a decode-path bug shows up here even when both runs are equal)."""
    want = logits_with_margins([2.0, 2.0])
    with pytest.raises(AssertionError, match="differs from the earlier run's token"):
        check_greedy([0, 3], [0, 3], want + 1e-3, want)
