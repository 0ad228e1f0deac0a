"""GPU tier for common/: memory round trips, events, and the cuBLAS linear against numpy."""
import numpy as np
import pytest

from common.bf16 import bf16_to_f32, f32_to_bf16
from common.device import get_gpu

pytestmark = pytest.mark.gpu


def test_round_trip_and_poison():
    gpu = get_gpu()
    x = np.random.default_rng().standard_normal((123, 7)).astype(np.float32)
    d = gpu.to_device(x)
    assert np.array_equal(gpu.to_host(d), x)
    gpu.fill_bytes(d, 0xFF)
    assert np.isnan(gpu.to_host(d)).all()


def peak_gbps(gpu) -> float:
    """The memory's peak from the device's own figures: two transfers a memory clock (DDR) over the whole bus
    (H100 SXM: 2 x 2619 MHz x 5120 bits = 3.35 TB/s, its data sheet's figure)."""
    props = gpu.device.properties
    return 2 * props.memory_clock_rate * 1e3 * props.global_memory_bus_width / 8 / 1e9


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_copy_columns_writes_a_block_of_columns_and_nothing_else(dtype):
    """dst[:, c:c + w] = src for a (n, w) src, the rest of dst untouched (poisoned), at widths and offsets that are
    not multiples of anything; and a src that does not fit is refused."""
    gpu, rng = get_gpu(), np.random.default_rng()
    n, C = 7, 1001
    for first, w in ((0, 501), (501, 500), (3, 17)):
        host = rng.standard_normal((n, w)).astype(np.float32)
        src = gpu.to_device(host) if dtype == "f32" else gpu.to_device(f32_to_bf16(host), "bf16")
        dst = gpu.empty((n, C), dtype)
        gpu.fill_bytes(dst, 0xFF)
        gpu.copy_columns(dst, first, src)
        got = gpu.to_host(dst)
        got = got if dtype == "f32" else bf16_to_f32(got)
        assert np.array_equal(got[:, first:first + w], host if dtype == "f32" else bf16_to_f32(f32_to_bf16(host)))
        assert np.isnan(np.delete(got, np.s_[first:first + w], axis=1)).all()
    with pytest.raises(ValueError, match="does not fit"):
        gpu.copy_columns(gpu.empty((n, 10), "f32"), 5, gpu.empty((n, 6), "f32"))


def test_events_time_gpu_work():
    """Two events around a 256 MiB fill measure the fill: no less than the memory's peak allows."""
    gpu = get_gpu()
    big = gpu.empty((1 << 28,), "u8")
    start = gpu.record()
    gpu.fill_bytes(big, 1)
    end = gpu.record()
    end.sync()
    floor_ms = big.nbytes / (peak_gbps(gpu) * 1e9) * 1e3
    assert end - start >= floor_ms, f"{end - start:.4f} ms for what takes at least {floor_ms:.4f} ms"


def test_copy_bandwidth_is_measured():
    """The copy rate (bytes read plus written, over 256 MiB: well past L2) is a real share of the memory's peak:
    above half of it (a rate counting the bytes once would not be) and not above it (a rate off by a unit, a
    copy not waited for, or one served from L2 would be)."""
    gpu = get_gpu()
    gbps, peak = gpu.copy_bandwidth_gbps(nbytes=1 << 28, repeats=3), peak_gbps(gpu)
    assert 0.5 * peak < gbps <= 1.02 * peak, f"copy {gbps:.0f} GB/s against a peak of {peak:.0f} GB/s"


@pytest.mark.parametrize("M, N, K, out", [(1, 2048, 2048, "bf16"), (37, 1000, 72, "bf16"), (129, 300, 520, "f32"),
                                          (5, 128256, 64, "f32")])
def test_linear_matches_numpy(M, N, K, out):
    from common.cublas import Cublas

    gpu = get_gpu()
    rng = np.random.default_rng()
    x = f32_to_bf16(rng.standard_normal((M, K)).astype(np.float32))
    w = f32_to_bf16(rng.standard_normal((N, K)).astype(np.float32) / np.sqrt(K))
    y = gpu.empty((M, N), out)
    gpu.fill_bytes(y, 0xFF)
    blas = Cublas(gpu)
    blas.linear(gpu.to_device(x, "bf16"), gpu.to_device(w, "bf16"), y)
    got = gpu.to_host(y)
    got = bf16_to_f32(got) if out == "bf16" else got
    ref = bf16_to_f32(x) @ bf16_to_f32(w).T
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert np.isfinite(got).all() and err < (1e-2 if out == "bf16" else 1e-4), err
    blas.close()


def test_linear_rejects_mismatched_shapes():
    from common.cublas import Cublas

    gpu = get_gpu()
    blas = Cublas(gpu)
    with pytest.raises(ValueError, match="linear"):
        blas.linear(gpu.empty((2, 8), "bf16"), gpu.empty((4, 16), "bf16"), gpu.empty((2, 4), "bf16"))


@pytest.mark.parametrize("pdl", [False, True], ids=["serial", "pdl"])
def test_a_chain_of_launches_keeps_its_order(pdl):
    """common/kernels/chain.cu (tests/bench_launch.py's kernel) 50 times over four blocks an SM: every element gains
    exactly 50, launched early with programmatic dependent launch too, as each launch waits for the one before."""
    from pathlib import Path

    from cuda.core import LaunchConfig

    from common.compile import KernelModule

    gpu = get_gpu()
    kernel = KernelModule(Path(__file__).resolve().parents[1] / "common" / "kernels" / "chain.cu",
                          gpu.arch).kernel("chain")
    blocks = 4 * gpu.device.properties.multiprocessor_count
    x = gpu.to_device(np.zeros(blocks * 128, np.int32))
    config = LaunchConfig(grid=blocks, block=128, programmatic_stream_serialization=pdl)
    for _ in range(50):
        gpu.launch(kernel, config, x.arg)
    assert (gpu.to_host(x) == 50).all()


def test_blocks_meeting_at_a_grid_barrier_see_each_other_s_last_round():
    """common/kernels/grid_barrier.cu (tests/bench_launch.py's persistent kernels), both barriers, one and four blocks
    an SM, 0, 1, 2 and 97 rounds (the generation's launched again over the counters it left): every block's value
    equals the rounds, which a block that passed a barrier early would leave short; the counts as each says."""
    from pathlib import Path

    from cuda.core import LaunchConfig

    from common.compile import KernelModule

    gpu = get_gpu()
    module = KernelModule(Path(__file__).resolve().parents[1] / "common" / "kernels" / "grid_barrier.cu", gpu.arch)
    for barrier in ("generation", "count"):
        kernel = module.kernel(f"grid_barrier_{barrier}")
        counters = gpu.to_device(np.zeros(2, np.uint32))
        for per_sm in (1, 4):
            blocks = per_sm * gpu.device.properties.multiprocessor_count
            for rounds in (0, 1, 2, 97):
                buf = gpu.to_device(np.zeros(2 * blocks, np.int32))
                if barrier == "count":
                    gpu.fill_bytes(counters, 0)          # its count only grows
                gpu.launch(kernel, LaunchConfig(grid=blocks, block=128, is_cooperative=True), buf.arg, counters.arg,
                           np.int32(rounds))
                got = gpu.to_host(buf).reshape(2, blocks)[rounds % 2]
                assert (got == rounds).all(), (barrier, per_sm, rounds, sorted(set(got.tolist()))[:5])
                left = gpu.to_host(counters)[0]
                assert left == (0 if barrier == "generation" else rounds * blocks), (barrier, per_sm, rounds, left)


def test_a_kernel_launched_early_ends_after_the_one_before():
    """common/kernels/overlap.cu (tests/bench_launch.py's probe) twice with programmatic dependent launch, a block an
    SM: every block stamps a start, an end not before it, and its SM; every end of the second comes after every end of
    the first (griddepcontrol.wait), whether or not its start did."""
    from pathlib import Path

    from cuda.core import LaunchConfig

    from common.compile import KernelModule

    gpu = get_gpu()
    kernel = KernelModule(Path(__file__).resolve().parents[1] / "common" / "kernels" / "overlap.cu",
                          gpu.arch).kernel("overlap")
    sms = gpu.device.properties.multiprocessor_count
    config = LaunchConfig(grid=sms, block=256, programmatic_stream_serialization=True)
    first, second = gpu.to_device(np.zeros((sms, 3), np.uint64)), gpu.to_device(np.zeros((sms, 3), np.uint64))
    gpu.launch(kernel, config, first.arg, np.uint64(20_000))
    gpu.launch(kernel, config, second.arg, np.uint64(0))
    a, b = gpu.to_host(first), gpu.to_host(second)
    assert (a[:, 0] > 0).all() and (b[:, 0] > 0).all() and (a[:, 1] - a[:, 0] >= 20_000).all()
    assert (b[:, 1] >= b[:, 0]).all() and b[:, 1].min() >= a[:, 1].max()
    assert (a[:, 2] < sms).all() and (b[:, 2] < sms).all()
