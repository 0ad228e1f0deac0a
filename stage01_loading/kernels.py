"""This stage's kernels: compiled once (NVRTC, disk-cached), with typed launchers that check their arguments."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from common.compile import KernelModule
from common.device import DeviceArray, Gpu

KERNEL_DIR = Path(__file__).parent / "kernels"
KERNEL_FILES = sorted(KERNEL_DIR.glob("*.cu"))
THREADS = 256


class Kernels:
    def __init__(self, gpu: Gpu):
        from cuda.core import LaunchConfig

        self.gpu = gpu
        self._embedding = KernelModule(KERNEL_DIR / "embedding.cu", gpu.arch).kernel("embedding_gather")
        self._checksum = KernelModule(KERNEL_DIR / "checksum.cu", gpu.arch).kernel("checksum_u16")
        sms = gpu.device.properties.multiprocessor_count
        self._checksum_config = LaunchConfig(grid=4 * sms, block=THREADS)
        self._embedding_configs: dict[tuple[int, int], object] = {}   # (T, H) -> LaunchConfig, built once

    def embedding(self, ids: DeviceArray, table: DeviceArray, out: DeviceArray) -> None:
        """out[t] = table[ids[t]].   ids (T,) i32, table (V, H) bf16, out (T, H) bf16. ids must be < V."""
        from cuda.core import LaunchConfig

        (T,), (_, H) = ids.shape, table.shape
        if ids.dtype != "i32" or table.dtype != "bf16" or out.dtype != "bf16" or out.shape != (T, H) or H % 8:
            raise ValueError(f"embedding: ids {ids.shape} {ids.dtype}, table {table.shape} {table.dtype}, "
                             f"out {out.shape} {out.dtype} (needs i32, bf16, bf16, out (T, H), H % 8 == 0)")
        config = self._embedding_configs.get((T, H))
        if config is None:
            config = LaunchConfig(grid=(T, -(-H // (8 * THREADS))), block=THREADS)
            self._embedding_configs[(T, H)] = config
        self.gpu.launch(self._embedding, config, ids.arg, table.arg, out.arg, np.int32(H))

    def checksum(self, words: DeviceArray, out: DeviceArray) -> None:
        """out[0] += sum_i (w_i + 1)(2i + 1) mod 2^64 over the array's 16-bit words (zero out first)."""
        if words.nbytes % 2 or out.dtype != "u64":
            raise ValueError(f"checksum: {words.nbytes} bytes (must be even) into {out.dtype} (must be u64)")
        self.gpu.launch(self._checksum, self._checksum_config, words.arg, np.uint64(words.nbytes // 2), out.arg)
