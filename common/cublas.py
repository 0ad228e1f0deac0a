"""cuBLAS through nvmath.bindings.cublas: one handle on the engine's stream, and one row-major `linear`.

The column-major trick. cuBLAS is column-major; our activations x (M, K) and Hugging Face weights W (N, K)
are row-major. A row-major (R, C) matrix is, byte for byte, the column-major (C, R) matrix: its transpose.
We want y = x @ W^T, (M, N) row-major, which cuBLAS sees as the column-major (N, M) matrix y^T = W @ x^T.
In cuBLAS's terms that is C = op(A) @ op(B) with
    A = the bytes of W, seen as column-major (K, N) = W^T, so op(A) = A^T = W   (transa = T, lda = K)
    B = the bytes of x, seen as column-major (K, M) = x^T, so op(B) = B         (transb = N, ldb = K)
    C = the bytes of y, column-major (N, M) = y^T                                (ldc = N)
and m, n, k = N, M, K. No data moves; only the reading of the bytes changes.
"""
from __future__ import annotations

import numpy as np

from common.device import DeviceArray, Gpu

WORKSPACE_BYTES = 32 << 20  # what NVIDIA recommends for Hopper; owned by us so graph capture can work later


class Cublas:
    """A cuBLAS handle bound to `gpu.stream`, with its own workspace."""

    def __init__(self, gpu: Gpu):
        from nvmath.bindings import cublas

        self._cublas = cublas
        self.gpu = gpu
        self.handle = cublas.create()
        cublas.set_stream(self.handle, int(gpu.stream.handle))
        self.workspace = gpu.empty((WORKSPACE_BYTES,), "u8")
        cublas.set_workspace(self.handle, self.workspace.ptr, WORKSPACE_BYTES)
        # alpha and beta are read from host memory (the default pointer mode); keep them alive here.
        self._alpha = np.ones(1, dtype=np.float32)
        self._beta = np.zeros(1, dtype=np.float32)

    @property
    def version(self) -> int:
        """cuBLAS's version: which kernel its heuristic runs for a shape, and so its time, may change with it."""
        return int(self._cublas.get_version(self.handle))

    def linear(self, x: DeviceArray, w: DeviceArray, y: DeviceArray) -> None:
        """y = x @ w^T.   x: (M, K) bf16, w: (N, K) bf16, y: (M, N) bf16 or f32; fp32 accumulation."""
        from nvmath import CudaDataType

        cublas = self._cublas
        (m_rows, k), (n, k_w) = x.shape, w.shape
        if k != k_w or y.shape != (m_rows, n) or x.dtype != "bf16" or w.dtype != "bf16":
            raise ValueError(f"linear: x {x.shape} {x.dtype} @ w {w.shape}^T {w.dtype} -> y {y.shape} {y.dtype}")
        out_type = {"bf16": CudaDataType.CUDA_R_16BF, "f32": CudaDataType.CUDA_R_32F}[y.dtype]
        cublas.gemm_ex(
            self.handle, cublas.Operation.T, cublas.Operation.N,
            n, m_rows, k,
            self._alpha.ctypes.data,
            w.ptr, CudaDataType.CUDA_R_16BF, k,
            x.ptr, CudaDataType.CUDA_R_16BF, k,
            self._beta.ctypes.data,
            y.ptr, out_type, n,
            cublas.ComputeType.COMPUTE_32F, cublas.GemmAlgo.DFALT,
        )

    def close(self) -> None:
        if self.handle:
            self._cublas.destroy(self.handle)
            self.handle = 0
