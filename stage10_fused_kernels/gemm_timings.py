"""The GEMM timings behind the kernels a small step takes (graphs.pick_gemms, pick_fused), kept on disk per machine,
so every engine on it takes the kernels the first one timed.

Timing anew at every start is noisy: where gemv.cu's warps a column, or fused against unfused, sit near a tie, two
engines on one machine could pick differently, round their logits differently, and part at a near-tie greedy token
(the server's tests compare two engines token for token). Kept, the first engine's timing decides for every later
one: the same kernels, the same bits. It also saves the start its timing took (about a second for the 1B).

The file is named by a hash of everything that can change what a timing means: the GPU's name, cuBLAS's version
(which picks its kernel for a shape), the kernels timed (TIMED_KERNELS) as compiled, the warps a column tried, and
MEANING, raised where the code that times changes what an entry holds.
An entry is keyed by its kind ("gemm": one GEMM through cuBLAS and gemv.cu's plain and fused kinds, with their
warps; "fused": a layer fused against unfused; "head": the step's end apart against in one GEMV), the GEMM's name,
M and the shapes, and the number of layers timed (their weights stream from HBM, not L2, only when there are
enough of them). Delete the file to time again.

    timings = GemmTimings.for_model(model)     # this machine's file, read if it exists
    timings.get(kind, key) / put(kind, key, value)
    timings.save()                             # entries new to the file written; entries already there kept
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from common.compile import cache_root

KERNELS = Path(__file__).parent / "kernels"
TIMED_KERNELS = ("gemv.cu", "pdl.cuh", "rmsnorm.cu", "rope_kv_write.cu", "silu_mul.cu", "embedding.cu",
                 "sampling.cu", "block_reduce.cuh")                                          # what a timing runs
MEANING = 2   # raised whenever what an entry's times mean changes without a kernel changing (2: the unfused
#               layer of a "fused" entry streams through the plain GEMV where it beat cuBLAS)


class GemmTimings:
    def __init__(self, path: Path):
        self.path = path
        self.entries = self._read()
        self.new: dict[str, list] = {}     # timed by this engine, not yet in the file

    @classmethod
    def for_model(cls, model, *config) -> GemmTimings:
        """The file for this machine and code; `config` adds the warps a column tried (they change what is timed)."""
        h = hashlib.sha256()
        for part in (f"meaning {MEANING}", model.gpu.name, str(model.cublas.version), *map(repr, config),
                     *((KERNELS / name).read_text() for name in TIMED_KERNELS)):
            h.update(part.encode())
            h.update(b"\0")
        return cls(cache_root() / "gemm-timings" / f"{h.hexdigest()[:20]}.json")

    def _read(self) -> dict:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):      # none yet, or unreadable: everything is timed again
            return {}
        return entries if isinstance(entries, dict) else {}

    @staticmethod
    def _name(kind: str, key: tuple) -> str:
        return f"{kind} " + "x".join(map(str, key))

    def get(self, kind: str, key: tuple) -> list | None:
        return self.entries.get(self._name(kind, key))

    def put(self, kind: str, key: tuple, value: list) -> None:
        self.entries[self._name(kind, key)] = self.new[self._name(kind, key)] = value

    def save(self) -> None:
        """Add this engine's new entries to the file. Another engine may have written it since it was read (the
        server's engine process starts beside others): what the file holds by then wins, so the first timing of
        an entry stays the machine's. The write is whole or nothing (a temporary file renamed over it)."""
        if not self.new:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entries = {**self.new, **self._read()}
        tmp = self.path.with_name(f"{self.path.stem}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=0, sort_keys=True))
        os.replace(tmp, self.path)
        self.new = {}
