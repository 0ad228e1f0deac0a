"""What rank 0 pays to send a step to another rank (pytest-benchmark; no GPU): a decode step's inputs
(packing.StepInputs of B rows) pickled into the rank's pipe, on this machine's CPU, against a rank that reads and
drops them.

    pytest <this stage>/bench_ranks.py --benchmark-only
"""
import numpy as np
import pytest

from .packing import StepInputs
from .ranks import Ranks
from .tests.test_ranks_cpu import Part


def decode_step(R: int) -> StepInputs:
    r = np.arange(R, dtype=np.int32)
    at = r + 200
    return StepInputs(r, at, 16 * r, r, r, r, np.zeros(R, np.int32), np.stack([r, np.ones(R, np.int32), r, at], 1),
                      np.zeros((0, 2), np.int32), None)


@pytest.fixture(scope="module")
def ranks():
    r = Ranks(2, Part)
    r.ready()
    yield r
    r.close()


@pytest.mark.parametrize("B", [1, 64, 256])
def test_send_a_decode_step(benchmark, ranks, B):
    x = decode_step(B)
    benchmark.pedantic(ranks.send, args=("fail_on", x), rounds=2000, warmup_rounds=100)  # a no-op there
    ranks.call("total")                                    # every message read: none is still queued
    benchmark.extra_info.update(batch_size=B, us_median=round(benchmark.stats.stats.median * 1e6, 1))
