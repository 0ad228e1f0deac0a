"""What the GPU tests of several stages compare with: error per row, how clearly a greedy choice is decided, and
the rule for two greedy runs that part ways.

Two correct bf16 engines (or one engine at two batch shapes, whose GEMMs sum in another order) give logits that
differ by about the design's tolerance, so where two tokens are nearly level, each engine may rank them its own
way. How near is "nearly" depends on the model: on the 1B shape a flip at 0.10 logit std was seen between two
engines whose logits agreed to 2e-2. So the rule does not guess a threshold; it checks that each engine's own
logits explain its choice, and the caller bounds how far the two engines' logits are apart.
"""
from __future__ import annotations

import numpy as np

NEAR_TIE = 0.05   # logit std: below it, a top-1 choice is left to bf16 rounding (the top-1 agreement tests)


def rel_l2_rows(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """‖got_t − want_t‖ / ‖want_t‖ for every row t (NaN never passes)."""
    assert not np.isnan(got).any(), "NaN in the logits"
    return np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)


def top1_margin(logits: np.ndarray) -> np.ndarray:
    """(top-1 − top-2) / std of each row: how clearly the greedy choice is decided."""
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return (top2[..., 1] - top2[..., 0]) / logits.std(axis=-1)


def greedy_divergence(got: list[int], want: list[int], got_logits: np.ndarray, want_logits: np.ndarray) -> int | None:
    """The first step where greedy `got` leaves `want`, or None if they are equal token for token.

    got_logits and want_logits (len(want), V) are each engine's logits along `want`'s tokens (teacher-forced), so
    at the first divergence both see the same prefix. There, each engine must prefer its own token by its own
    logits, to within NEAR_TIE std (the teacher-forced path may round unlike the generating one): then the two
    runs part only because their logits differ, which the caller's tolerance bounds. An AssertionError otherwise,
    or if the lengths differ without a divergence."""
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if step is None:
        assert len(got) == len(want), f"{len(got)} tokens against {len(want)}"
        return None
    mine, theirs = got[step], want[step]
    for name, logits, own, other in (("got", got_logits[step], mine, theirs),
                                     ("want", want_logits[step], theirs, mine)):
        lead = (logits[own] - logits[other]) / logits.std()
        assert lead > -NEAR_TIE, (f"step {step}: {name}'s own logits put token {other} {-lead:.3f} std above the "
                                  f"token {own} it chose; the divergence is not explained by the logits")
    return step


def divergence_margin(want_logits: np.ndarray, step: int | None) -> str:
    """How decided the earlier engine thought the step where the runs parted was, for the test's printout."""
    return "" if step is None else f" (parted at step {step}, margin {top1_margin(want_logits[step]):.3f} std)"
