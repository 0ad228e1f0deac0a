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


def test_events_time_gpu_work():
    gpu = get_gpu()
    big = gpu.empty((1 << 28,), "u8")
    start = gpu.record()
    gpu.fill_bytes(big, 1)
    end = gpu.record()
    end.sync()
    assert end - start > 0


def test_copy_bandwidth_is_measured():
    gbps = get_gpu().copy_bandwidth_gbps(nbytes=1 << 26, repeats=3)
    assert np.isfinite(gbps) and gbps > 0


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
