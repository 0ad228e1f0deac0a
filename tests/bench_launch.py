"""What one kernel launch still costs inside a graph (pytest-benchmark): common/kernels/chain.cu, a kernel that does
nothing but wait for the one before it and add 1 to its elements, launched LAUNCHES times in a row, captured in a
graph and replayed as a decode step is, with programmatic dependent launch (kernels/pdl.cuh, stage10 on) and without,
at one block, one block an SM and four an SM; and whether a kernel launched early finds room on its SM beside the
kernel before it, at a given shared memory a block (test_next_kernel_beside_the_one_before).

    pytest tests/bench_launch.py --benchmark-only -m gpu

A figure is one replay's GPU time (two events around it) over LAUNCHES, the median of REPLAYS: what a kernel
boundary costs whatever the kernel does. Fusing kernels removes boundaries; a persistent kernel removes all of them
(stage10's chapter, section 5) but meets its blocks at a barrier of the whole grid between dependent steps:
test_grid_barrier times one (common/kernels/grid_barrier.cu). Every replay is checked: each element gained LAUNCHES,
so no launch ran early.
"""
from pathlib import Path

import numpy as np
import pytest

from common.compile import KernelModule
from common.device import get_gpu

pytestmark = pytest.mark.gpu
CHAIN = Path(__file__).resolve().parents[1] / "common" / "kernels" / "chain.cu"
LAUNCHES, THREADS, REPLAYS = 64, 128, 20


@pytest.fixture(scope="module")
def gpu():
    return get_gpu()


@pytest.mark.parametrize("blocks_per_sm", [0, 1, 4], ids=["one-block", "a-block-an-sm", "four-an-sm"])
@pytest.mark.parametrize("pdl", [False, True], ids=["serial", "pdl"])
def test_launch(benchmark, gpu, pdl, blocks_per_sm):
    from cuda.core import LaunchConfig

    blocks = max(1, blocks_per_sm * gpu.device.properties.multiprocessor_count)
    kernel = KernelModule(CHAIN, gpu.arch).kernel("chain")
    config = LaunchConfig(grid=blocks, block=THREADS, programmatic_stream_serialization=pdl)
    x = gpu.to_device(np.zeros(blocks * THREADS, np.int32))
    graph = gpu.capture(lambda: [gpu.launch(kernel, config, x.arg) for _ in range(LAUNCHES)])
    graph.launch()                                                     # its first replay, untimed
    ms = []

    def replay():
        start = gpu.record()
        graph.launch()
        end = gpu.record()
        end.sync()
        ms.append(end - start)

    benchmark.pedantic(replay, rounds=REPLAYS)
    got = gpu.to_host(x)
    assert (got == LAUNCHES * (REPLAYS + 1)).all(), f"elements at {sorted(set(got.tolist()))[:5]}, not all " \
                                                    f"{LAUNCHES * (REPLAYS + 1)}: a launch ran before the one ahead"
    us = [1e3 * m / LAUNCHES for m in ms]
    benchmark.extra_info.update(pdl=pdl, blocks=blocks, threads=THREADS, launches=LAUNCHES,
                                us_per_launch=round(float(np.median(us)), 3), us_min=round(min(us), 3),
                                us_max=round(max(us), 3))


BARRIER = Path(__file__).resolve().parents[1] / "common" / "kernels" / "grid_barrier.cu"
ROUNDS = 256


@pytest.mark.parametrize("blocks_per_sm", [1, 4], ids=["a-block-an-sm", "four-an-sm"])
@pytest.mark.parametrize("barrier", ["generation", "count"])
def test_grid_barrier(benchmark, gpu, barrier, blocks_per_sm):
    """common/kernels/grid_barrier.cu: one launch of ROUNDS rounds, each ended by a barrier of the whole grid, less
    the same launch of no rounds, over ROUNDS: what a persistent kernel pays between two dependent steps, where the
    kernels of test_launch pay a boundary. Every launch is checked: each block read its neighbour's last round."""
    from cuda.core import LaunchConfig

    kernel = KernelModule(BARRIER, gpu.arch).kernel(f"grid_barrier_{barrier}")
    blocks = blocks_per_sm * gpu.device.properties.multiprocessor_count
    config = LaunchConfig(grid=blocks, block=THREADS, is_cooperative=True)   # every block resident at once
    buf, counters = gpu.empty((2 * blocks,), "i32"), gpu.to_device(np.zeros(2, np.uint32))

    def launch_ms(rounds: int) -> float:
        gpu.fill_bytes(buf, 0)
        gpu.fill_bytes(counters, 0)
        start = gpu.record()
        gpu.launch(kernel, config, buf.arg, counters.arg, np.int32(rounds))
        end = gpu.record()
        end.sync()
        got = gpu.to_host(buf).reshape(2, blocks)[rounds % 2]
        assert (got == rounds).all(), f"values {sorted(set(got.tolist()))[:5]} after {rounds} rounds: a block " \
                                      f"passed a barrier before every block had arrived"
        return end - start

    launch_ms(ROUNDS)                                                  # compiled and loaded outside the timing
    us = []
    benchmark.pedantic(lambda: us.append(1e3 * (launch_ms(ROUNDS) - launch_ms(0)) / ROUNDS), rounds=REPLAYS)
    benchmark.extra_info.update(barrier=barrier, blocks=blocks, threads=THREADS, rounds=ROUNDS,
                                us_per_barrier=round(float(np.median(us)), 3), us_min=round(min(us), 3),
                                us_max=round(max(us), 3))


OVERLAP = Path(__file__).resolve().parents[1] / "common" / "kernels" / "overlap.cu"
HOLD_NS, OVERLAP_THREADS = 20_000, 256


@pytest.mark.parametrize("carveout", [-1, 86, 100], ids=["carveout-driver", "carveout-86", "carveout-100"])
@pytest.mark.parametrize("shared_kib", [0, 64, 96, 112])
def test_next_kernel_beside_the_one_before(benchmark, gpu, shared_kib, carveout):
    """common/kernels/overlap.cu launched twice with programmatic dependent launch, a block an SM each, each block
    taking shared_kib of dynamic shared memory at a carveout (percent of the SM's L1 and shared memory asked to be
    shared; -1 the driver's choice): the share of the second launch's blocks that started while the first's block
    on their SM still held it (20 us), i.e. whether an early launch finds room beside the kernel before it -- what
    a GEMV that fills its shared memory before its input is ready (stage10's chapter, "What was tried") needs.
    Every end stamp of the second must come after every end stamp of the first (griddepcontrol.wait's order)."""
    from cuda.core import LaunchConfig

    kernel = KernelModule(OVERLAP, gpu.arch).kernel("overlap")
    nbytes = shared_kib * 1024
    gpu.allow_shared_memory(kernel, nbytes, carveout)
    blocks = gpu.device.properties.multiprocessor_count
    config = LaunchConfig(grid=blocks, block=OVERLAP_THREADS, shmem_size=nbytes, programmatic_stream_serialization=True)
    first, second = gpu.empty((blocks, 3), "u64"), gpu.empty((blocks, 3), "u64")
    shares = []

    def run():
        gpu.launch(kernel, config, first.arg, np.uint64(HOLD_NS))
        gpu.launch(kernel, config, second.arg, np.uint64(0))
        gpu.sync()
        a, b = gpu.to_host(first), gpu.to_host(second)
        assert (a[:, 1] >= a[:, 0]).all() and b[:, 1].min() >= a[:, 1].max(), "the second ended before the first"
        held_until = {int(sm): int(end) for _, end, sm in a}
        shares.append(float(np.mean([start < held_until.get(int(sm), 0) for start, _, sm in b])))

    run()                                                              # compiled and loaded outside the timing
    shares.clear()
    benchmark.pedantic(run, rounds=5)
    benchmark.extra_info.update(shared_kib=shared_kib, carveout=carveout, blocks=blocks, threads=OVERLAP_THREADS,
                                hold_us=HOLD_NS / 1e3, share_beside=round(float(np.median(shares)), 3),
                                share_min=round(min(shares), 3), share_max=round(max(shares), 3))
