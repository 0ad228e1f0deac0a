"""online_softmax.cuh's step in numpy, tile by tile as the kernels take it, on any machine: its lazy rescale (m moved,
and l and O rescaled, only where some row of a warp's 16 gains more than 2^RESCALE_LOG2 in weight) gives softmax(S) V
as computed at once, while no P it feeds to P V exceeds 2^RESCALE_LOG2. The GPU tests check the kernels; this checks
the rule they share, over scores built to rise across the keys by small steps and by large ones."""
import re
from pathlib import Path

import numpy as np

from common.testing import for_each_seed

HEADER = Path(__file__).resolve().parents[1] / "kernels" / "online_softmax.cuh"
RESCALE_LOG2 = float(re.search(r"#define RESCALE_LOG2 ([0-9.]+)f", HEADER.read_text()).group(1))
WARP_ROWS = 16        # M-rows a warp holds (two a lane, eight quads): they move m together (the vote)


def online(s: np.ndarray, v: np.ndarray, scale: float, tile: int) -> tuple[np.ndarray, float, int]:
    """O / l by online_softmax_step's rule, each tile's keys at once; s (R, N) unscaled scores, -inf where masked,
    R a multiple of WARP_ROWS; v (N, D). Returns the output, the largest P, and the tiles a warp moved m on."""
    rows, n = s.shape
    m, l, o = np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, v.shape[1]))
    p_max, moves = 0.0, 0
    for k0 in range(0, n, tile):
        tile_s = s[:, k0:k0 + tile]
        tile_max = tile_s.max(axis=1)
        with np.errstate(invalid="ignore"):                          # -inf - -inf: a row with no key yet
            rises = ~((tile_max - m) * scale <= RESCALE_LOG2)         # "not at most", as the kernel tests it
        move = rises.reshape(-1, WARP_ROWS).any(axis=1)
        moves += int(move.sum())
        move = move.repeat(WARP_ROWS)
        m_new = np.where(move, np.maximum(m, tile_max), m)
        p = np.exp2((tile_s - m_new[:, None]) * scale)
        a = np.where(move, np.exp2((m - m_new) * scale), 1.0)       # exp2(-inf) = 0 on the first tile
        l, o, m = a * l + p.sum(axis=1), a[:, None] * o + p @ v[k0:k0 + tile], m_new
        p_max = max(p_max, float(p.max()))
    return o / l[:, None], p_max, moves


def test_the_lazy_rescale_gives_softmax_and_keeps_p_bounded():
    def check(seed):
        rng = np.random.default_rng(seed)
        rows, tile, hd = WARP_ROWS * int(rng.integers(1, 5)), 64, int(rng.choice([64, 128]))
        n = int(rng.integers(1, 9)) * tile + int(rng.integers(0, tile))
        scale = np.log2(np.e) / np.sqrt(hd)
        # scores that climb across the keys: by steps too small to move m (most seeds) and too large not to
        climb = rng.choice([0.0, 0.02, 0.2, 2.0]) * np.arange(n)
        s = climb + rng.normal(0.0, rng.choice([1.0, 8.0, 40.0]), (rows, n))
        pos = np.sort(rng.integers(0, n, rows))                      # causal: row r sees keys 0 .. pos[r]
        s[np.arange(n)[None, :] > pos[:, None]] = -np.inf
        v = rng.normal(0.0, 1.0, (n, hd))
        out, p_max, moves = online(s, v, scale, tile)
        weights = np.exp((s - s.max(axis=1, keepdims=True)) * scale / np.log2(np.e))
        exact = (weights / weights.sum(axis=1, keepdims=True)) @ v
        np.testing.assert_allclose(out, exact, rtol=1e-9, atol=1e-9)
        assert p_max <= 2.0 ** RESCALE_LOG2 * (1 + 1e-12), p_max
        warps = rows // WARP_ROWS
        return moves, warps, -(-n // tile) * warps                   # moves; warps; (warp, tile) pairs

    runs = for_each_seed(range(200), check)
    # not vacuous: some warp skipped the rescale on a tile, and some moved m after its first tile
    assert any(moves < pairs for moves, _, pairs in runs)
    assert any(moves > warps for moves, warps, _ in runs)
