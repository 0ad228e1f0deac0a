"""Weights from a validated checkpoint onto the GPU: one device arena, one pinned staging pass.

Path of every byte:  file --(page cache / disk, mmap)--> pinned staging buffer --(DMA over PCIe)--> GPU arena
  * pinned (page-locked) host memory is what the copy engine can read directly; from ordinary pageable memory
    the driver would first copy into a pinned bounce buffer of its own, and the copy could not overlap our work;
  * BUFFERS staging buffers rotate: worker threads fill them from the mapped file while the DMA engine drains the
    ones already full; one thread alone copies only ~5 GB/s out of the page cache (measured, see the chapter);
  * one arena (a single cudaMalloc) holds every tensor at a 256-byte aligned offset: one allocation, no
    fragmentation, and the whole model is one address range;
  * tied embeddings (Llama 3.2 1B): lm_head is the same device memory as embed_tokens, not a copy;
  * fusion for free: a weight is (N_out, K) row-major, so stacking two weights along N_out is just placing
    their bytes end to end. Each layer's q/k/v projections sit back to back in the arena, and so do gate/up:
    `GpuWeights.fused(layer, "qkv")` is one (nh*hd + 2*nkv*hd, H) matrix, one GEMM instead of three, with no
    copy and no extra memory;
  * a rank of a model split over GPUs loads only its part of each tensor (`part`: tensor_parallel.shard_tensor),
    cut out of the mapped file; its arena is laid out from the parts' shapes, and a tied LM head is the rank's
    rows (`vocab`) of the embedding it holds whole.
"""
from __future__ import annotations

import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from common.checkpoint import Checkpoint
from common.device import DeviceArray, Gpu

ALIGN = 256
BUFFER_BYTES = 32 << 20  # a pinned staging buffer: large enough for full-speed DMA
BUFFERS = 4             # staging buffers, and threads filling them: one thread copies ~5 GB/s out of the page cache
FUSED = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),   # rows of the fused matrix,
         "gate_up": ("mlp.gate_proj", "mlp.up_proj")}                           # in this order


@dataclass
class LoadStats:
    bytes: int              # weight bytes copied to the GPU
    seconds: float          # file read + staging + copy, until the GPU has every byte
    gpu_bytes_used: int     # drop in free device memory across the load (arena + allocator rounding)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9


class GpuWeights:
    """name -> DeviceArray of every model tensor (HF names); `lm_head` resolves the tie."""

    def __init__(self, arena: DeviceArray, tensors: dict[str, DeviceArray], tied: bool, stats: LoadStats,
                 vocab: range | None = None):
        self.arena, self.tensors, self.tied, self.stats, self.vocab = arena, tensors, tied, stats, vocab

    def __getitem__(self, name: str) -> DeviceArray:
        return self.tensors[name]

    def fused(self, layer: int, group: str) -> DeviceArray:
        """The layer's FUSED[group] weights as one (sum of N_out, K) matrix: a view, they are adjacent."""
        parts = [self.tensors[f"model.layers.{layer}.{m}.weight"] for m in FUSED[group]]
        return DeviceArray(parts[0].ptr, (sum(p.shape[0] for p in parts), parts[0].shape[1]), "bf16", parts[0].owner)

    @property
    def lm_head(self) -> DeviceArray:
        if not self.tied:
            return self.tensors["lm_head.weight"]
        table = self.tensors["model.embed_tokens.weight"]
        if self.vocab is None:
            return table
        H = table.shape[1]
        return table.view(2 * H * self.vocab.start, (len(self.vocab), H))


def load_weights(ckpt: Checkpoint, gpu: Gpu, progress: bool = True, buffers: int = BUFFERS, part=None,
                 vocab: range | None = None) -> GpuWeights:
    """Every tensor of ckpt into one device arena, or with part(name, array) -> array each tensor's part (a rank's
    shard; `vocab`: its rows of a tied LM head); `buffers` pinned staging buffers, each filled by its own thread."""
    free_before, _ = gpu.memory()
    start = time.perf_counter()
    entries = ckpt.file_order()
    arrays = {e.name: (part or _whole)(e.name, ckpt.raw(e.name)) for e in entries}   # views of the mapped file
    offsets, total = arena_layout(ckpt, {name: a.nbytes for name, a in arrays.items()})
    arena = gpu.empty((total,), "u8")
    # The work, in file order: pieces of at most one staging buffer, each (tensor, byte offset in it, length).
    pieces = [(e, lo, min(BUFFER_BYTES, arrays[e.name].nbytes - lo)) for e in entries
              for lo in range(0, arrays[e.name].nbytes, BUFFER_BYTES)]
    stage = gpu.staging(buffers * BUFFER_BYTES)    # one pinned block, cut into `buffers` buffers
    buffer_free = [None] * buffers                 # event: the DMA out of that buffer has finished
    flat = _Contiguous(arrays, pieces)

    def fill(i: int) -> None:                      # runs on a worker thread: file bytes -> pinned buffer
        e, lo, n = pieces[i]
        base = (i % buffers) * BUFFER_BYTES
        stage.array[base:base + n] = flat.piece(e.name, lo, n)

    def submit(i: int):
        if buffer_free[i % buffers] is not None:
            buffer_free[i % buffers].sync()        # never overwrite bytes the DMA engine is still reading
        return pool.submit(fill, i)

    copied, bar = 0, _Progress(sum(a.nbytes for a in arrays.values()), progress)
    with ThreadPoolExecutor(buffers) as pool:      # numpy copies release the GIL: `buffers` copies at once
        filling = {i: submit(i) for i in range(min(buffers, len(pieces)))}
        for i, (e, lo, n) in enumerate(pieces):    # DMAs are issued in order, as their buffer fills
            filling.pop(i).result()
            b = i % buffers
            gpu.copy_to_device_async(arena.ptr + offsets[e.name] + lo, stage.ptr + b * BUFFER_BYTES, n)
            buffer_free[b] = gpu.stream.record()
            if i + buffers < len(pieces):
                filling[i + buffers] = submit(i + buffers)
            copied += n
            bar.update(copied)
    gpu.sync()
    seconds = time.perf_counter() - start
    bar.close()
    tensors = {name: arena.view(offsets[name], a.shape, "bf16") for name, a in arrays.items()}
    stats = LoadStats(copied, seconds, free_before - gpu.memory()[0])
    return GpuWeights(arena, tensors, ckpt.config.tie_word_embeddings, stats, vocab)


def _whole(name: str, array: np.ndarray) -> np.ndarray:
    return array


class _Contiguous:
    """Each tensor's bytes for the staging threads: a view of the mapped file, or, for a part cut across its rows
    (a rank's columns of o or down), one contiguous copy, made once and dropped after its last piece."""

    def __init__(self, arrays: dict[str, np.ndarray], pieces: list):
        self.arrays, self.left, self.made, self.lock = arrays, {}, {}, threading.Lock()
        for e, _, _ in pieces:
            self.left[e.name] = self.left.get(e.name, 0) + 1

    def piece(self, name: str, lo: int, n: int) -> np.ndarray:
        with self.lock:
            if name not in self.made:
                self.made[name] = np.ascontiguousarray(self.arrays[name]).reshape(-1).view(np.uint8)
            flat = self.made[name]
            self.left[name] -= 1
            if not self.left[name]:
                del self.made[name]
        return flat[lo:lo + n]


def arena_layout(ckpt: Checkpoint, nbytes: dict[str, int] | None = None) -> tuple[dict[str, int], int]:
    """Byte offset of every tensor in the arena, and the arena's size: each tensor, or each FUSED group of one
    layer (members back to back, no padding between them), starts at an ALIGN boundary. `nbytes`: each tensor's
    size where it is not the file's (a rank's parts)."""
    offsets, total = {}, 0
    for e in ckpt.file_order():
        if e.name in offsets:
            continue
        for name in placed_with(e.name):
            offsets[name] = total
            total += ckpt.entries[name].nbytes if nbytes is None else nbytes[name]
        total = -(-total // ALIGN) * ALIGN
    return offsets, total


def placed_with(name: str) -> list[str]:
    """The tensors laid out together with `name`: its FUSED group in the same layer, or itself alone."""
    m = re.fullmatch(r"(model\.layers\.\d+\.)(.+)\.weight", name)
    for members in FUSED.values():
        if m and m.group(2) in members:
            return [f"{m.group(1)}{member}.weight" for member in members]
    return [name]


# ---------------------------------------------------------------------------- verification
def host_checksum(words: np.ndarray, chunk: int = 1 << 22) -> int:
    """sum_i (w_i + 1)(2i + 1) mod 2^64 over uint16 words: the same sum as kernels/checksum.cu.

    Per chunk starting at word lo:  sum_j (w+1)(2(lo+j)+1) = sum_j (w+1)(2j+1) + 2 lo sum_j (w+1),
    so one (2j+1) table serves every chunk; chunks run on all cores (numpy releases the GIL)."""
    flat = words.reshape(-1)
    odd = np.arange(1, 2 * min(chunk, max(flat.size, 1)), 2, dtype=np.uint64)   # 2j + 1

    def part(lo: int) -> int:
        w = flat[lo:lo + chunk].astype(np.uint64) + np.uint64(1)
        return int(np.dot(w, odd[:w.size])) + 2 * lo * int(w.sum())   # uint64 dot wraps mod 2^64: fine

    with ThreadPoolExecutor() as pool:
        return sum(pool.map(part, range(0, flat.size, chunk))) % 2**64


def verify(weights: GpuWeights, ckpt: Checkpoint, kernels, part=None) -> list[str]:
    """Checksum every tensor on the GPU and in the file (or its part there); returns the names that differ (empty
    = identical)."""
    names = list(weights.tensors)
    sums = kernels.gpu.empty((len(names),), "u64")
    kernels.gpu.fill_bytes(sums, 0)
    for i, name in enumerate(names):
        kernels.checksum(weights.tensors[name], sums.view(8 * i, (1,)))
    gpu_sums = kernels.gpu.to_host(sums)
    part = part or _whole
    return [n for n, s in zip(names, gpu_sums) if int(s) != host_checksum(part(n, ckpt.raw(n)))]


class _Progress:
    """A one-line progress bar on stderr (no dependency): bytes copied, percent, GB/s so far. Redrawn in place on
    a terminal; a log file (stderr not a terminal) gets only the final line, not a hundred redraws."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.start, self.shown = total, enabled and total > 256 << 20, time.perf_counter(), -1
        self.live, self.done = self.enabled and sys.stderr.isatty(), 0

    def line(self) -> str:
        pct = int(100 * self.done / self.total)
        rate = self.done / max(time.perf_counter() - self.start, 1e-9) / 1e9
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        return f"  loading [{bar}] {pct:3d}%  {self.done / 1e9:5.2f}/{self.total / 1e9:.2f} GB  {rate:5.2f} GB/s"

    def update(self, done: int) -> None:
        self.done, pct = done, int(100 * done / self.total)
        if self.live and pct != self.shown:
            self.shown = pct
            print("\r" + self.line(), end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.live:
            print(file=sys.stderr)
        elif self.enabled:
            print(self.line(), file=sys.stderr)
