"""GPU tier: cuBLASLt's ranked algorithms (cublaslt.py) each compute y = x @ W^T: every candidate the heuristic
offers, against numpy, on fresh random inputs, poisoned outputs and shapes that are not multiples of a tile (rows
16-byte aligned, as cuBLASLt asks); and each gives the same bits every time it runs (a graph replays it)."""
import numpy as np
import pytest

from common.bf16 import bf16_to_f32, f32_to_bf16
from common.cublas import Cublas
from common.device import get_gpu

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def lt():
    from ..cublaslt import CublasLt

    return CublasLt(Cublas(get_gpu()))


def upload(gpu, a):
    bits = f32_to_bf16(np.asarray(a, np.float32))
    return gpu.to_device(bits, "bf16"), bf16_to_f32(bits)


@pytest.mark.parametrize("M, N, K, out", [(1, 3072, 2048, "bf16"), (3, 1000, 520, "bf16"), (64, 2048, 8192, "bf16"),
                                          (200, 296, 2056, "bf16"), (5, 776, 64, "f32")])
def test_every_candidate_matches_numpy(lt, M, N, K, out):
    gpu, rng = lt.gpu, np.random.default_rng()
    x, xf = upload(gpu, rng.normal(0, 1, (M, K)))
    w, wf = upload(gpu, rng.normal(0, 0.05, (N, K)))
    want = xf.astype(np.float64) @ wf.T.astype(np.float64)
    algos = lt.candidates(M, N, K, out)
    assert algos, "the heuristic offered no algorithm"
    assert [a.rank for a in algos] == sorted(a.rank for a in algos)
    for a in algos:
        y = gpu.empty((M, N), out)
        gpu.fill_bytes(y, 0xFF)                                   # NaN wherever the GEMM does not write
        lt.linear(x, w, y, a)
        got = gpu.to_host(y)
        got = bf16_to_f32(got) if out == "bf16" else got
        assert not np.isnan(got).any(), f"{a}: an element was never written"
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2, str(a)
        again = gpu.empty((M, N), out)
        lt.linear(x, w, again, a)
        assert np.array_equal(gpu.to_host(again), gpu.to_host(y)), f"{a}: not the same bits twice"


def test_a_wrong_shape_is_refused(lt):
    gpu = lt.gpu
    algo = lt.candidates(1, 8, 16)[0]
    with pytest.raises(ValueError, match="cublaslt linear"):
        lt.linear(gpu.empty((1, 16), "bf16"), gpu.empty((8, 24), "bf16"), gpu.empty((1, 8), "bf16"), algo)
