"""cuBLASLt for y = x @ W^T with an algorithm chosen by measurement, not by the library's heuristic.

cuBLAS's gemm_ex (common/cublas.py) asks cuBLASLt's heuristic for one algorithm per shape and runs it. The
heuristic ranks by a model of the GPU, and on the thin GEMMs of a decode step (M = 1..256 rows against weights of
thousands) its first choice is not always the fastest. cuBLASLt can return its whole ranked list instead
(cublasLtMatmulAlgoGetHeuristic with a count), and any of them can run: graphs.pick_lt_algos times each candidate
on the real weights and keeps the fastest where it clearly beats gemm_ex.

The layouts are common/cublas.py's column-major reading of row-major data: A = W's bytes, column-major (K, N),
transposed (op(A) = W); B = x's bytes, column-major (K, M); C = D = y's bytes, column-major (N, M). fp32
accumulation and scale; alpha = 1, beta = 0 from host memory. The workspace is the Cublas handle's (one stream:
their GEMMs never run at once), so an algorithm that needs one finds it at a fixed address, as graph capture
requires.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.cublas import WORKSPACE_BYTES, Cublas
from common.device import DeviceArray

CANDIDATES = 8          # how many of the heuristic's ranked algorithms are timed for a shape


@dataclass(frozen=True)
class Algo:
    """One cuBLASLt algorithm for one shape: its opaque 64 bytes, where the heuristic ranked it (0: its first
    choice) and, to say which won, its algorithm and tile ids and its split-K factor."""

    data: np.ndarray         # (8,) uint64, cublasLtMatmulAlgo_t
    rank: int
    algo_id: int
    tile: str
    split_k: int

    def __str__(self) -> str:
        return f"algo {self.algo_id}, tile {self.tile}, split-K {self.split_k}, the heuristic's #{self.rank + 1}"


class CublasLt:
    """A cuBLASLt handle sharing `cublas`'s stream and workspace."""

    def __init__(self, cublas: Cublas):
        from nvmath import CudaDataType
        from nvmath.bindings import cublas as blas
        from nvmath.bindings import cublasLt as lt

        self._lt, self.gpu, self.workspace = lt, cublas.gpu, cublas.workspace
        self.handle = lt.create()
        self.desc = lt.matmul_desc_create(int(blas.ComputeType.COMPUTE_32F), int(CudaDataType.CUDA_R_32F))
        for attr, op in ((lt.MatmulDescAttribute.TRANSA, blas.Operation.T),
                         (lt.MatmulDescAttribute.TRANSB, blas.Operation.N)):
            value = np.array([int(op)], np.int32)
            lt.matmul_desc_set_attribute(self.desc, int(attr), value.ctypes.data, value.nbytes)
        self.preference = lt.matmul_preference_create()
        limit = np.array([WORKSPACE_BYTES], np.uint64)
        lt.matmul_preference_set_attribute(self.preference, int(lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES),
                                           limit.ctypes.data, limit.nbytes)
        self._types = {"bf16": int(CudaDataType.CUDA_R_16BF), "f32": int(CudaDataType.CUDA_R_32F)}
        self._layouts: dict[tuple, int] = {}
        self._alpha, self._beta = np.ones(1, np.float32), np.zeros(1, np.float32)

    @property
    def version(self) -> int:
        """cuBLASLt's version: its heuristic's ranking of the candidates depends on it."""
        return int(self._lt.get_version())

    def _layout(self, dtype: str, rows: int, cols: int) -> int:
        key = (dtype, rows, cols)
        if key not in self._layouts:
            self._layouts[key] = self._lt.matrix_layout_create(self._types[dtype], rows, cols, rows)
        return self._layouts[key]

    def _shape(self, M: int, N: int, K: int, out: str) -> tuple[int, int, int]:
        """The layouts of A (W), B (x) and C = D (y) for y (M, N) = x (M, K) @ W (N, K)^T."""
        return self._layout("bf16", K, N), self._layout("bf16", K, M), self._layout(out, N, M)

    def candidates(self, M: int, N: int, K: int, out: str = "bf16", count: int = CANDIDATES) -> list[Algo]:
        """The heuristic's ranked algorithms for this shape (at most `count`), each one it says can run."""
        lt = self._lt
        a, b, c = self._shape(M, N, K, out)
        results = np.zeros(count, lt.matmul_heuristic_result_dtype)
        found = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, self.desc, a, b, c, c, self.preference, count,
                                     results.ctypes.data, found.ctypes.data)
        algos = []
        for rank in range(int(found[0])):
            if results[rank]["state"] != 0:          # CUBLAS_STATUS_SUCCESS: this one can run
                continue
            data = np.ascontiguousarray(results[rank]["algo"]["data_"]).astype(np.uint64)
            algos.append(Algo(data, rank, self._config(data, lt.MatmulAlgoConfigAttribute.ID),
                              self._tile(data), self._config(data, lt.MatmulAlgoConfigAttribute.SPLITK_NUM)))
        return algos

    def _config(self, data: np.ndarray, attr) -> int:
        value, written = np.zeros(1, np.int32), np.zeros(1, np.uint64)
        self._lt.matmul_algo_config_get_attribute(data.ctypes.data, int(attr), value.ctypes.data, value.nbytes,
                                                  written.ctypes.data)
        return int(value[0])

    def _tile(self, data: np.ndarray) -> str:
        tile = self._config(data, self._lt.MatmulAlgoConfigAttribute.TILE_ID)
        try:
            return self._lt.MatmulTile(tile).name.removeprefix("TILE_").lower()
        except ValueError:
            return str(tile)

    def linear(self, x: DeviceArray, w: DeviceArray, y: DeviceArray, algo: Algo) -> None:
        """y = x @ w^T with `algo` (one of candidates() for this shape).   x (M, K) bf16, w (N, K) bf16,
        y (M, N) bf16 or f32."""
        (M, K), (N, K_w) = x.shape, w.shape
        if K != K_w or y.shape != (M, N) or x.dtype != "bf16" or w.dtype != "bf16" or y.dtype not in self._types:
            raise ValueError(f"cublaslt linear: x {x.shape} {x.dtype} @ w {w.shape}^T {w.dtype} -> y {y.shape} "
                             f"{y.dtype}")
        a, b, c = self._shape(M, N, K, y.dtype)
        self._lt.matmul(self.handle, self.desc, self._alpha.ctypes.data, w.ptr, a, x.ptr, b,
                        self._beta.ctypes.data, y.ptr, c, y.ptr, c, algo.data.ctypes.data, self.workspace.ptr,
                        WORKSPACE_BYTES, int(self.gpu.stream.handle))
