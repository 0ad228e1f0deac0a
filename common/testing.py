"""What the GPU tests of several stages compare with: error per row, and the rule for greedy tokens at near ties.

bf16 activations move each logit by ~1% of the logits' std. Where the top two logits are closer than NEAR_TIE
std, both tokens are right answers to bf16 precision, and two correct engines (or one engine at two batch
shapes, whose GEMMs round differently) may pick either. So two greedy runs must agree token for token up to
their first divergence, and that divergence must sit at such a near tie of the run they are compared with.
"""
from __future__ import annotations

import numpy as np

NEAR_TIE = 0.05   # logit std; a numpy simulation of our bf16 rounding flipped greedy only below 0.031


def rel_l2_rows(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """‖got_t − want_t‖ / ‖want_t‖ for every row t (NaN never passes)."""
    assert not np.isnan(got).any(), "NaN in the logits"
    return np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)


def top1_margin(logits: np.ndarray) -> np.ndarray:
    """(top-1 − top-2) / std of each row: how clearly the greedy choice is decided."""
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return (top2[..., 1] - top2[..., 0]) / logits.std(axis=-1)


def greedy_divergence(got: list[int], want: list[int], want_logits: np.ndarray) -> int | None:
    """The first step where greedy `got` leaves `want`, or None if they are equal. want_logits (len(want), V)
    are the logits that chose each token of `want`; an AssertionError if the divergence is at a decided step
    (or the lengths differ without a divergence)."""
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if step is None:
        assert len(got) == len(want), f"{len(got)} tokens against {len(want)}"
        return None
    margin = top1_margin(want_logits[step])
    assert margin < NEAR_TIE, f"greedy tokens differ at step {step}, a decided step (margin {margin:.3f} std)"
    return step
