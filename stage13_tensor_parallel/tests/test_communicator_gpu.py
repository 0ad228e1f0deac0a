"""GPU tier, one GPU: the NCCL calls as the ranks make them, on a communicator of one rank (a machine of one GPU
runs them too). A sum over one rank leaves the buffer as it was, a gather of one rank copies it, and both replay
from a CUDA graph as the decode step's captured collectives do."""
import numpy as np
import pytest

from common.bf16 import bf16_to_f32, f32_to_bf16
from common.device import get_gpu

pytestmark = pytest.mark.gpu


def test_one_rank_s_all_reduce_and_all_gather_run_and_replay_from_a_graph():
    pytest.importorskip("nccl.bindings.nccl", reason="nccl4py is not installed (pip install tiny-vllm[multigpu])")
    from ..communicator import Communicator, unique_id

    gpu, rng = get_gpu(), np.random.default_rng()
    comm = Communicator(0, 1, unique_id(), gpu)
    try:
        x = f32_to_bf16(rng.standard_normal(1003).astype(np.float32))
        buf = gpu.to_device(x, "bf16")
        comm.all_reduce(buf)
        assert np.array_equal(gpu.to_host(buf), x)
        src = gpu.to_device(rng.standard_normal((7, 13)).astype(np.float32))
        dst = gpu.empty((1, 7, 13), "f32")
        gpu.fill_bytes(dst, 0xFF)
        comm.all_gather(src, dst)
        assert np.array_equal(gpu.to_host(dst)[0], gpu.to_host(src))
        gpu.fill_bytes(dst, 0xFF)
        graph = gpu.capture(lambda: (comm.all_reduce(buf), comm.all_gather(src, dst)))
        graph.launch()
        gpu.sync()
        assert np.array_equal(gpu.to_host(buf), x) and np.array_equal(gpu.to_host(dst)[0], gpu.to_host(src))
        assert np.isfinite(bf16_to_f32(gpu.to_host(buf))).all()
        with pytest.raises(ValueError, match="cannot hold"):
            comm.all_gather(src, gpu.empty((2, 7, 13), "f32"))
    finally:
        comm.close()
