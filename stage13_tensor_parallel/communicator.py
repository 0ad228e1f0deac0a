"""NCCL between the ranks, through nccl4py's bindings (NVIDIA's own; raw device pointers, as cuBLAS takes them).

    uid = unique_id()                        rank 0 makes it (NCCL's bootstrap address), and sends its bytes on
    comm = Communicator(rank, size, uid, gpu)    every rank, each in its own process: returns when all have joined
    comm.all_reduce(buf)                     buf = the elementwise sum of every rank's buf, in place
    comm.all_gather(src, dst)                dst (size, *src.shape) = every rank's src, in rank order
    comm.abort()                             stop whatever collective is waiting for a rank that will not come

Both collectives go on the rank's one stream, after the kernels before them and before those after: a CUDA graph
captures them like kernels, and every rank must launch the same collectives in the same order, with the same
sizes (they pair up by order alone).
"""
from __future__ import annotations

import os
import threading

from common.device import DeviceArray, Gpu

NCCL_DTYPES = {"bf16": 9, "f32": 7, "i32": 2}      # ncclBfloat16, ncclFloat32, ncclInt32
NCCL_SUM = 0
# the all-reduces of a decode step are too small to gain from NVLink multicast (NVLS): off, in this process and
# the ranks it starts, unless the environment says otherwise
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def _nccl():
    from nccl.bindings import nccl

    return nccl


def unique_id() -> bytes:
    """A new communicator's id (rank 0's bootstrap address), as bytes to send to the other ranks."""
    return bytes(_nccl().get_unique_id())


class Communicator:
    def __init__(self, rank: int, size: int, uid: bytes, gpu: Gpu):
        nccl = _nccl()
        self.rank, self.size, self.gpu = rank, size, gpu
        gpu.device.set_current()                # (this thread's device: rank 0 may join from a helper thread)
        self.comm = nccl.comm_init_rank(size, nccl.UniqueId.from_buffer(uid), rank)
        self._ending = threading.Lock()         # abort() may come from the ranks' watch thread

    def all_reduce(self, buf: DeviceArray) -> None:
        _nccl().all_reduce(buf.ptr, buf.ptr, buf.size, NCCL_DTYPES[buf.dtype], NCCL_SUM, self.comm,
                           int(self.gpu.stream.handle))

    def all_gather(self, src: DeviceArray, dst: DeviceArray) -> None:
        if dst.nbytes != self.size * src.nbytes or dst.dtype != src.dtype:
            raise ValueError(f"all_gather: {dst.shape} {dst.dtype} cannot hold {self.size} x {src.shape} {src.dtype}")
        _nccl().all_gather(src.ptr, dst.ptr, src.size, NCCL_DTYPES[src.dtype], self.comm, int(self.gpu.stream.handle))

    def abort(self) -> None:
        """Drop the communicator at once, waking a collective that waits on a rank that is gone."""
        with self._ending:
            if self.comm is not None:
                _nccl().comm_abort(self.comm)
                self.comm = None

    def close(self) -> None:
        """Free it once its work is done (every rank alive: this rank's queued collectives complete first)."""
        with self._ending:
            if self.comm is not None:
                self.gpu.sync()
                _nccl().comm_destroy(self.comm)
                self.comm = None
