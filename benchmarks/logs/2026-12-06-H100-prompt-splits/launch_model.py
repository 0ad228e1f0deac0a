"""How full a 32,768-token prompt's attention launches keep the SMs, in a list-scheduling model: 132 SMs, one block
an SM, blocks started in launch order as SMs free up (a tile's K/V heads consecutive), a block's time its key tiles
plus OVERHEAD. For each chunk of 2,048 rows the launch's tiles whole (plan_attention) and with the last wave split
(split_tail); the SMs' useful share is the whole tiles' time (a split tile's extra overheads are waste) over SMs x
the launch's span.

    PYTHONPATH=$PWD python benchmarks/logs/2026-12-06-H100-prompt-splits/launch_model.py [OVERHEAD]
"""
import heapq
import sys

import numpy as np

from stage12_hopper_attention.packing import plan_attention, split_tail, whole_pieces

SMS, NKV, TILE_N, ROWS, CHUNK, PROMPT = 132, 8, 128, 48, 2048, 32768    # the 1B on an H100, head_dim 64


def span(pieces: np.ndarray, overhead: float) -> tuple[float, float]:
    """(the launch's span, the blocks' time over the SMs) in key tiles."""
    times = [float(p[5] - p[4]) + overhead for p in pieces for _ in range(NKV)]
    free = [0.0] * SMS
    end = 0.0
    for t in times:
        start = heapq.heappop(free)
        heapq.heappush(free, start + t)
        end = max(end, start + t)
    return end, sum(times) / SMS


def main(overhead: float) -> None:
    useful, whole_span, split_span = 0.0, 0.0, 0.0
    for first in range(0, PROMPT, CHUNK):
        tiles, _ = plan_attention(np.array([[0, CHUNK, 0, first]], np.int32), ROWS)
        end, busy = span(whole_pieces(tiles, TILE_N), overhead)
        useful, whole_span = useful + busy, whole_span + end
        split_span += span(split_tail(tiles, TILE_N, NKV, SMS)[0], overhead)[0]
    tiles, _ = plan_attention(np.array([[0, PROMPT, 0, 0]], np.int32), ROWS)
    end, busy = span(whole_pieces(tiles, TILE_N), overhead)
    print(f"a block's time: key tiles + {overhead:g}; the SMs' useful share: chunks whole {useful / whole_span:.3f}, "
          f"split {useful / split_span:.3f}; one launch over the prompt {busy / end:.3f}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
