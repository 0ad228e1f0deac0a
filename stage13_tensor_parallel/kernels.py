"""This stage's kernels: compiled once (NVRTC, disk-cached), with typed launchers that check their arguments.

Every launcher takes DeviceArrays, checks shapes and dtypes (a wrong call is an error here, not garbage on the
GPU), and launches on the engine's stream. LaunchConfigs are built once per shape and reused.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from common.compile import KernelModule, arch_for
from common.device import DeviceArray, Gpu

from .tma import MIN_BLOCK_SIZE

KERNEL_DIR = Path(__file__).parent / "kernels"
KERNEL_FILES = sorted(KERNEL_DIR.glob("*.cu"))
THREADS = 256
SAMPLER_THREADS = 1024   # sampling.cu's THREADS
ATTENTION_THREADS = 128  # attention_rows.cu's and attention_tiles.cu's WARPS * 32
ATTENTION_MAX_GROUP = 32  # attention_rows.cu's WARPS * MAX_HEADS_PER_WARP: query heads per K/V head
TILE_M = 64              # attention_tiles.cu's TILE_M: (query row, query head) pairs a block
TENSOR_CORE_HEAD_DIMS = (64, 128)   # its instantiations; other head_dims take every row through attention_rows.cu
HOPPER_TILE_M = {64: 192, 128: 128}   # attention_hopper.cu's TILE_M for each head_dim: (query row, query head)
#                                       pairs of a prompt tile on sm_90, 64 for each consumer warpgroup
HOPPER_TILE_N = {64: 128, 128: 64}   # its keys a K/V tile for each head_dim
HOPPER_STAGES = {64: 2, 128: 3}   # its STAGES for each head_dim: K/V tiles in shared memory at once
MAX_GRID_Y = 65535       # a launch's most blocks in y: attention_hopper's prompt tiles
MAX_PARTS = 4            # the most pieces attention_hopper splits a prompt tile into (packing.split_tail)
MAX_SPLITS = 32          # flash-decoding: the most blocks one row's keys are split over (a lane each in
#                          split_combine.cuh's merge: at most the warp size)
MIN_KEYS_PER_SPLIT = 64   # one 64-key tile a split: at batch 1 over 256 keys, 4 splits took 6.5 us a layer
#                          against 7.7 for 2 and 7.3 for 1 (bench_attention.py's test_decode_split, H200)
SPLIT_TARGET_BLOCKS_PER_SM = 4
GEMV_MAX_ROWS = 8        # gemv.cu's instantiations: M = 1..8
GEMV_WARPS = 8           # its warps a block: 8 / column_warps output columns, column_warps warps each
GEMV_KEYS_PER_WARP = 2048   # a column's row of K weights gets a warp per 2048 of them (1, 2, 4 or 8 warps),
#                             unless the caller picks the warps a column (graphs.pick_gemms times each)
GEMV_COLUMN_WARPS = (1, 2, 4, 8)   # warps a column: they share a block's 8 warps
GEMV_PAIRED_MAX_WARPS = 4   # gemv_norm_silu's and gemv_norm_rope's: a block holds both columns of a pair
GEMV_KINDS = ("gemv", "gemv_norm", "gemv_norm_silu", "gemv_norm_rope", "gemv_residual",
              "gemv_norm_head")                                         # gemv.cu's, M = 1..8


def tile_rows(n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Query rows a tensor-core tile holds (64 / G for G query heads per K/V head), or 0 where head_dim has no
    tensor-core kernel (every row then goes alone through attention_rows.cu)."""
    return TILE_M // (n_heads // n_kv_heads) if head_dim in TENSOR_CORE_HEAD_DIMS else 0


def hopper_partial_floats(slots: int, n_kv_heads: int, head_dim: int) -> int:
    """attention_hopper.cu's records of split tiles: a (slot, K/V head, part) holds every consumer thread's piece of
    O (hd / 2 floats a thread) and its two rows' m and l."""
    return slots * n_kv_heads * MAX_PARTS * (head_dim // 2 + 4) * 2 * HOPPER_TILE_M[head_dim]


def hopper_shared_bytes(head_dim: int) -> int:
    """attention_hopper.cu's dynamic shared memory: STAGES x (K and V) x TILE_N keys x head_dim bf16, and 1 KiB to
    align the stages to the swizzle's 1,024-byte atoms."""
    return HOPPER_STAGES[head_dim] * 2 * HOPPER_TILE_N[head_dim] * head_dim * 2 + 1024


def decode_split(n_rows: int, max_keys: int, n_kv_heads: int, sms: int, max_row_splits: int) -> tuple[int, int]:
    """(n_splits, keys_per_split) for n_rows listed rows whose longest attends over max_keys keys: enough
    blocks (rows x K/V heads x splits) for SPLIT_TARGET_BLOCKS_PER_SM per SM, but no split under
    MIN_KEYS_PER_SPLIT keys, at most MAX_SPLITS, and n_rows x n_splits within the partials buffer. keys_per_split
    is a whole number of 32-key tiles."""
    wanted = -(-SPLIT_TARGET_BLOCKS_PER_SM * sms // (n_rows * n_kv_heads))
    n = max(1, min(wanted, max_keys // MIN_KEYS_PER_SPLIT, MAX_SPLITS, max_row_splits // n_rows))
    if n == 1:
        return 1, max_keys
    keys_per_split = 32 * -(-max_keys // (32 * n))           # ceil(max_keys / n), up to whole tiles
    return -(-max_keys // keys_per_split), keys_per_split


def _expect(what: str, ok: bool, *arrays: DeviceArray) -> None:
    if not ok:
        shapes = ", ".join(f"{a.shape} {a.dtype}" for a in arrays)
        raise ValueError(f"{what}: unexpected arguments {shapes}")


def _aligned(H: int, *arrays: DeviceArray) -> bool:
    """rmsnorm.cu moves 8 bf16 (16 bytes) a load where H % 8 == 0: then every array must start 16-byte aligned
    (whole rows of such an array are, when it does)."""
    return H % 8 != 0 or all(a.ptr % 16 == 0 for a in arrays)


def _arg(a: DeviceArray | None) -> np.uint64:
    """A kernel's pointer argument; None is the null pointer (an optional input)."""
    return np.uint64(0) if a is None else a.arg


# What common/bench/profile.py reads to name this stage's kernels in a decode step's CUPTI record: kernel name (a name
# ending in "*" is a prefix) -> the group whose floor, computed there from the model's shapes, it is held to.
# "gemm": a GEMM, taking the next of the step's fixed order as cuBLAS's kernels do; None: never in a decode step.
PROFILE_GROUPS = {
    "embedding_gather": "embedding", "checksum_u16": None, "rms_norm": "norms", "add_rms_norm": "norms",
    "rope_kv_write": "rope + kv_write", "silu_mul": "silu_mul", "attention_*": "attention", "gemv_*": "gemm",
    "sample_tokens": "sample", "block_table_write": "block tables", "attention_hopper_*": None,   # prompts only
}
# A kernel doing the work of several groups -> those groups: its floor is theirs added.
PROFILE_FUSED = {"rope + kv_write": ("rope", "kv_write")}


class Kernels:
    def __init__(self, gpu: Gpu, pdl: bool = True):
        """pdl: launch with programmatic dependent launch (kernels/pdl.cuh); False launches each kernel only
        after the one before has finished (a test compares the two)."""
        self.gpu, self.pdl = gpu, pdl
        self._tables_written = False   # by the launch before: the next one is not early (_config)

        def load(file: str, *names: str):
            module = KernelModule(KERNEL_DIR / file, arch_for(KERNEL_DIR / file, gpu.arch))
            return [module.kernel(n) for n in names]

        self._embedding, = load("embedding.cu", "embedding_gather")
        self._checksum, = load("checksum.cu", "checksum_u16")
        self._rms_norm, self._add_rms_norm = load("rmsnorm.cu", "rms_norm", "add_rms_norm")
        self._silu_mul, = load("silu_mul.cu", "silu_mul")
        self._attention_rows, = load("attention_rows.cu", "attention_rows")
        self._attention_tiles = dict(zip(TENSOR_CORE_HEAD_DIMS, load(
            "attention_tiles.cu", *(f"attention_tiles_hd{hd}" for hd in TENSOR_CORE_HEAD_DIMS))))
        # prompt tiles on Hopper's pipeline (wgmma, TMA: sm_90a code, which runs on compute capability 9.0 alone);
        # other GPUs take attention_tiles.cu for them
        self._attention_hopper = {}
        if gpu.arch == "sm_90":
            self._attention_hopper = dict(zip(TENSOR_CORE_HEAD_DIMS, load(
                "attention_hopper.cu", *(f"attention_hopper_hd{hd}" for hd in TENSOR_CORE_HEAD_DIMS))))
            for hd, kernel in self._attention_hopper.items():
                gpu.allow_shared_memory(kernel, hopper_shared_bytes(hd))
        self._rope_kv_write, = load("rope_kv_write.cu", "rope_kv_write")
        self._block_table_write, = load("block_table.cu", "block_table_write")
        self._sample, = load("sampling.cu", "sample_tokens")
        gemv = load("gemv.cu", *(f"{kind}_m{m}" for kind in GEMV_KINDS for m in range(1, GEMV_MAX_ROWS + 1)))
        self._gemv = {kind: gemv[i * GEMV_MAX_ROWS:(i + 1) * GEMV_MAX_ROWS] for i, kind in enumerate(GEMV_KINDS)}
        self.sms = sms = gpu.device.properties.multiprocessor_count
        self._configs: dict[tuple, object] = {}
        self._checksum_config = self._config("checksum", 4 * sms, THREADS)

    def _config(self, key, grid, block, shmem_size=0):
        """A LaunchConfig per (kernel, shape), built on first use and kept, for the launch about to be made. With
        pdl every kernel is launched with programmatic stream serialization (programmatic dependent launch,
        kernels/pdl.cuh): it may start before the kernel ahead of it in the stream has finished, and waits for it
        inside, where it has to. Not the launch after block_table_write(): attention_tiles.cu reads the tables
        before its wait, so every kernel after the write must start once it has finished."""
        from cuda.core import LaunchConfig

        pdl, self._tables_written = self.pdl and not self._tables_written, False
        config = self._configs.get((key, grid, block, shmem_size, pdl))
        if config is None:
            config = self._configs[(key, grid, block, shmem_size, pdl)] = LaunchConfig(
                grid=grid, block=block, shmem_size=shmem_size, programmatic_stream_serialization=pdl)
        return config

    def embedding(self, ids: DeviceArray, table: DeviceArray, out: DeviceArray, prev_rows: DeviceArray | None = None,
                  prev_ids: DeviceArray | None = None) -> None:
        """out[t] = table[ids[t]], or table[prev_ids[prev_rows[t]]] where prev_rows is given and >= 0.
        ids, prev_rows (T,) i32, prev_ids (n,) i32, table (V, H) bf16, out (T, H) bf16. ids must be < V, and
        prev_rows < n."""
        (T,), (_, H) = ids.shape, table.shape
        _expect("embedding", ids.dtype == "i32" and table.dtype == out.dtype == "bf16" and out.shape == (T, H)
                and H % 8 == 0 and (prev_rows is None or (prev_rows.shape == (T,) and prev_rows.dtype == "i32"
                                                          and prev_ids is not None and prev_ids.dtype == "i32")),
                ids, table, out)
        self.gpu.launch(self._embedding, self._config("embedding", (T, -(-H // (8 * THREADS))), THREADS),
                        ids.arg, _arg(prev_rows), _arg(prev_ids), table.arg, out.arg, np.int32(H))

    def checksum(self, words: DeviceArray, out: DeviceArray) -> None:
        """out[0] += sum_i (w_i + 1)(2i + 1) mod 2^64 over the array's 16-bit words (zero out first)."""
        if words.nbytes % 2 or out.dtype != "u64":
            raise ValueError(f"checksum: {words.nbytes} bytes (must be even) into {out.dtype} (must be u64)")
        self.gpu.launch(self._checksum, self._checksum_config, words.arg, np.uint64(words.nbytes // 2), out.arg)

    def rms_norm(self, x: DeviceArray, w: DeviceArray, y: DeviceArray, eps: float) -> None:
        """y = x / rms(x) * w, row by row.   x, y (T, H) bf16, w (H,) bf16."""
        T, H = x.shape
        _expect("rms_norm", x.dtype == w.dtype == y.dtype == "bf16" and w.shape == (H,) and y.shape == (T, H)
                and _aligned(H, x, w, y), x, w, y)
        self.gpu.launch(self._rms_norm, self._config("norm", T, THREADS), x.arg, w.arg, y.arg, np.int32(H),
                        np.float32(eps))

    def add_rms_norm(self, x: DeviceArray, d: DeviceArray, w: DeviceArray, y: DeviceArray, eps: float) -> None:
        """x += d (in place, bf16), then y = rms_norm(x) * w.   x, d, y (T, H) bf16, w (H,) bf16."""
        T, H = x.shape
        _expect("add_rms_norm", x.dtype == d.dtype == w.dtype == y.dtype == "bf16" and w.shape == (H,)
                and d.shape == y.shape == (T, H) and _aligned(H, x, d, w, y), x, d, w, y)
        self.gpu.launch(self._add_rms_norm, self._config("norm", T, THREADS), x.arg, d.arg, w.arg, y.arg,
                        np.int32(H), np.float32(eps))

    def silu_mul(self, gate_up: DeviceArray, act: DeviceArray) -> None:
        """act = silu(gate) * up.   gate_up (T, 2I) bf16 rows [gate | up], act (T, I) bf16, I even."""
        T, I2 = gate_up.shape
        _expect("silu_mul", gate_up.dtype == act.dtype == "bf16" and act.shape == (T, I2 // 2) and I2 % 4 == 0,
                gate_up, act)
        self.gpu.launch(self._silu_mul, self._config("silu", (-(-I2 // (4 * THREADS)), T), THREADS),
                        gate_up.arg, act.arg, np.int32(I2 // 2))

    def rope_kv_write(self, qkv: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray, slot_mapping: DeviceArray,
                      n_heads: int, n_kv_heads: int, head_dim: int, rope: tuple | None = None) -> None:
        """With rope = (cos, sin, positions): rotate the q and k heads of each qkv row t by its position
        positions[t] (T,) i32, each < max_len; cos, sin (max_len, hd/2) f32. Then K[slot_mapping[t]],
        V[slot_mapping[t]] = the k and v heads of row t, skipping -1. qkv (T, stride) bf16 [q | k | v],
        slot_mapping (T,) i32 (slots < num_blocks * BS), caches (num_blocks, BS, nkv, hd) bf16. rope None: the
        cache write alone."""
        T, stride = qkv.shape
        cos, sin, positions = rope or (None, None, None)
        _expect("rope_kv_write", qkv.dtype == k_cache.dtype == v_cache.dtype == "bf16" and len(k_cache.shape) == 4
                and k_cache.shape == v_cache.shape and k_cache.shape[2:] == (n_kv_heads, head_dim)
                and slot_mapping.shape == (T,) and slot_mapping.dtype == "i32"
                and stride >= (n_heads + 2 * n_kv_heads) * head_dim and head_dim % 2 == 0
                and (rope is None or (cos.dtype == sin.dtype == "f32" and cos.shape == sin.shape
                                      and cos.shape[1] == head_dim // 2 and positions.shape == (T,)
                                      and positions.dtype == "i32")),
                qkv, k_cache, v_cache, slot_mapping)
        pairs = (n_heads + 2 * n_kv_heads) * head_dim // 2
        self.gpu.launch(self._rope_kv_write, self._config("rope_kv_write", (T, -(-pairs // THREADS)), THREADS),
                        qkv.arg, k_cache.arg, v_cache.arg, slot_mapping.arg, _arg(cos), _arg(sin), _arg(positions),
                        np.int32(n_heads), np.int32(n_kv_heads), np.int32(head_dim), np.int32(stride))

    def block_table_write(self, block_tables: DeviceArray, updates: DeviceArray) -> None:
        """block_tables.flat[updates[i, 0]] = updates[i, 1].   block_tables (B, W) i32, updates (n, 2) i32 with
        every index < B W (the caller builds them)."""
        n = updates.shape[0]
        _expect("block_table_write", block_tables.dtype == updates.dtype == "i32" and len(block_tables.shape) == 2
                and updates.shape == (n, 2) and n > 0, block_tables, updates)
        self.gpu.launch(self._block_table_write, self._config("block_table", -(-n // THREADS), THREADS),
                        block_tables.arg, updates.arg, np.int32(n))
        self._tables_written = True

    def attention(self, qkv: DeviceArray, k_cache: DeviceArray, v_cache: DeviceArray, out: DeviceArray,
                  partial: DeviceArray, arrivals: DeviceArray, tiles: DeviceArray, block_tables: DeviceArray,
                  n_heads: int, n_kv_heads: int, head_dim: int, n_splits: int = 1,
                  keys_per_split: DeviceArray | None = None) -> None:
        """Causal GQA attention with the online softmax over a paged cache, a tile of consecutive rows a block:
        tiles (n, 4) i32 = first row, rows, seq_slot, first position, from plan_attention() (rows <=
        tile_rows(); one each where head_dim has no tensor-core kernel, or where n_splits > 1; the caller checks
        the values). Position p of seq_slot b is cache slot block_tables[b, p // BS] * BS + p % BS. Each tile's
        keys are split over n_splits blocks of keys_per_split keys, a (1,) i32 on the device read by the kernels
        (decode_split(); a graph captured for the most splits a step may use follows each step's value; blocks
        past a row's keys return), merged by the last of a row's blocks to finish (split_combine.cuh), through
        partial, f32 scratch of n n_splits nh (hd + 2), and arrivals, i32 of n nkv that must hold zeros (each
        launch leaves them so). qkv (R, stride) bf16 (queries = the first nh heads), caches (num_blocks, BS, nkv,
        hd) bf16 with BS a power of two, block_tables (B, W) i32 covering every tile's positions, out (R, nh*hd)
        bf16 (the tiles' rows written). hd even, <= 256; nh / nkv <= 32."""
        R, stride = qkv.shape
        num_blocks, block_size = k_cache.shape[:2]
        n = tiles.shape[0]
        group = n_heads // n_kv_heads
        _expect("attention", qkv.dtype == out.dtype == k_cache.dtype == v_cache.dtype == "bf16"
                and tiles.dtype == "i32" and tiles.shape == (n, 4) and 0 < n <= R
                and block_tables.dtype == "i32" and len(block_tables.shape) == 2
                and block_size & (block_size - 1) == 0
                and out.shape == (R, n_heads * head_dim) and stride >= n_heads * head_dim and stride % 2 == 0
                and k_cache.shape == v_cache.shape == (num_blocks, block_size, n_kv_heads, head_dim)
                and n_heads % n_kv_heads == 0 and group <= ATTENTION_MAX_GROUP
                and head_dim % 2 == 0 and head_dim <= 256 and 1 <= n_splits <= MAX_SPLITS
                and (n_splits == 1 or isinstance(keys_per_split, DeviceArray) and keys_per_split.dtype == "i32"
                     and keys_per_split.shape == (1,) and partial.dtype == "f32"
                     and partial.size >= n * n_splits * n_heads * (head_dim + 2)
                     and arrivals.dtype == "i32" and arrivals.size >= n * n_kv_heads),
                qkv, k_cache, v_cache, out, partial, arrivals, tiles, block_tables)
        split_keys = keys_per_split.arg if n_splits > 1 else np.uint64(0)    # null: no split
        scratch = (partial.arg, arrivals.arg, tiles.arg)
        paged = (block_tables.arg, np.int32(block_tables.shape[1]), np.int32(block_size.bit_length() - 1))
        common = (n_heads, n_kv_heads)
        if head_dim in TENSOR_CORE_HEAD_DIMS:
            self.gpu.launch(self._attention_tiles[head_dim],
                            self._config("attention_tiles", (n, n_kv_heads, n_splits), ATTENTION_THREADS),
                            qkv.arg, k_cache.arg, v_cache.arg, out.arg, *scratch, *paged,
                            *map(np.int32, (*common, stride)), split_keys)
        else:
            shmem = 4 * 32 * (head_dim // 2 + 1) + 2 * 32 * head_dim + 2 * group * head_dim   # K, V, the queries
            self.gpu.launch(self._attention_rows,
                            self._config("attention_rows", (n, n_kv_heads, n_splits), ATTENTION_THREADS, shmem),
                            qkv.arg, k_cache.arg, v_cache.arg, out.arg, *scratch, *paged,
                            *map(np.int32, (*common, head_dim, stride)), split_keys)

    def hopper_prefill(self, head_dim: int, block_size: int) -> bool:
        """Whether prompt tiles of this shape take attention_hopper(): on sm_90, head_dim 64 or 128, blocks of at
        least tma.MIN_BLOCK_SIZE positions."""
        return head_dim in self._attention_hopper and block_size >= MIN_BLOCK_SIZE

    def attention_hopper(self, qkv: DeviceArray, out: DeviceArray, kv_maps: DeviceArray, pieces: DeviceArray,
                         block_tables: DeviceArray, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int,
                         parts: int = 1, partial: DeviceArray | None = None,
                         arrivals: DeviceArray | None = None) -> None:
        """Causal GQA attention of prompt tiles on Hopper's pipeline (attention_hopper.cu): pieces (n, 8) i32 from
        packing.split_tail() = first row, rows (at most HOPPER_TILE_M[head_dim] / G), seq_slot, first position, first
        and end key tile, merge slot (-1: a whole tile), part; kv_maps (2, 16) u64, the layer's K and V tensor maps
        (tma.py) over a cache of `block_size` positions a block, read through block_tables (B, W) i32; qkv (R, stride)
        bf16 (queries = the first nh heads), out (R, nh hd) bf16 (the tiles' rows written). Where a tile is split
        into `parts` pieces (parts > 1): partial, f32 of at least hopper_partial_floats(slots, nkv, hd) for the
        pieces' slots, and arrivals, i32 of slots x nkv that must hold zeros (the last piece of a tile leaves them
        so). Only where hopper_prefill() says so."""
        R, stride = qkv.shape
        n = pieces.shape[0]
        slots = int(arrivals.size // n_kv_heads) if arrivals is not None else 0
        _expect("attention_hopper", self.hopper_prefill(head_dim, block_size) and qkv.dtype == out.dtype == "bf16"
                and pieces.dtype == "i32" and pieces.shape == (n, 8) and 0 < n <= MAX_GRID_Y
                and kv_maps.dtype == "u64" and kv_maps.shape == (2, 16) and block_tables.dtype == "i32"
                and len(block_tables.shape) == 2 and block_size & (block_size - 1) == 0
                and out.shape == (R, n_heads * head_dim) and stride >= n_heads * head_dim and stride % 2 == 0
                and n_heads % n_kv_heads == 0 and n_heads // n_kv_heads <= ATTENTION_MAX_GROUP
                and 1 <= parts <= MAX_PARTS and (parts == 1 or (
                    partial is not None and arrivals is not None and partial.dtype == "f32"
                    and arrivals.dtype == "i32" and slots > 0
                    and partial.size >= hopper_partial_floats(slots, n_kv_heads, head_dim))),
                qkv, out, kv_maps, pieces, block_tables)
        threads = 2 * HOPPER_TILE_M[head_dim] + (128 if head_dim == 64 else 32)   # consumers, then the producer
        config = self._config("attention_hopper", (n_kv_heads, n), threads, hopper_shared_bytes(head_dim))
        self.gpu.launch(self._attention_hopper[head_dim], config, qkv.arg, out.arg, kv_maps.arg, pieces.arg,
                        block_tables.arg, *map(np.int32, (block_tables.shape[1], block_size.bit_length() - 1,
                                                          n_heads, n_kv_heads, stride)),
                        _arg(partial), _arg(arrivals), np.int32(parts))

    def gemv(self, x: DeviceArray, w: DeviceArray, y: DeviceArray, column_warps: int | None = None,
             norm: tuple[DeviceArray, float] | None = None, silu: bool = False, residual: bool = False,
             rope: tuple | None = None, head: tuple[DeviceArray, DeviceArray, DeviceArray] | None = None) -> None:
        """y = x @ w^T for a few rows, streaming the weights (gemv.cu), with the kernels beside it fused in:
          norm = (g, eps):  y = rms_norm(x) * g @ w^T        (x the residual stream, g (K,) bf16)
          silu (with norm): y = silu(a[:, :I]) * a[:, I:], a = the above over w = [gate | up] (2I, K); y (M, I)
          rope (with norm): y = qkv rows, then rope_kv_write()'s work on them: rope = (k_cache, v_cache,
                            slot_mapping, cos, sin, positions, n_heads, n_kv_heads, head_dim), as there
          head (with norm): y (M, N) f32, the LM head's logits, and ids[m] = argmax_n y[m, n] (the first on ties):
                            head = (best (>= M,) u64, ticket (1,) i32, both zero between launches, ids (>= M,) i32)
          residual:         y += x @ w^T                     (y the residual stream, d rounded to bf16 first)
        x (M, K) bf16 with M <= GEMV_MAX_ROWS, w (N, K) bf16, y (M, N) bf16; K a multiple of 8 and x, w, g 16-byte
        aligned (its loads are 16 bytes). column_warps: the warps each output column's row of weights is shared
        by (GEMV_COLUMN_WARPS; silu and rope: at most GEMV_PAIRED_MAX_WARPS, fewer taken); None: one per
        GEMV_KEYS_PER_WARP weights."""
        (M, K), (N, K_w) = x.shape, w.shape
        g, eps = norm or (None, 0.0)
        with_norm = silu or rope is not None or head is not None             # the kinds that need the norm
        _expect("gemv", x.dtype == w.dtype == "bf16" and y.dtype == ("f32" if head is not None else "bf16") and K == K_w
                and 1 <= M <= GEMV_MAX_ROWS and y.shape == ((M, N // 2) if silu else (M, N)) and K % 8 == 0
                and x.ptr % 16 == 0 and w.ptr % 16 == 0 and column_warps in (None, *GEMV_COLUMN_WARPS)
                and (silu, rope is not None, head is not None, residual).count(True) <= 1
                and (norm is not None or not with_norm) and not (residual and norm is not None)
                and (g is None or (g.dtype == "bf16" and g.shape == (K,) and g.ptr % 16 == 0))
                and (not silu or N % 2 == 0), x, w, y)
        if column_warps is None:
            column_warps = 1
            while column_warps < GEMV_WARPS and K >= 2 * column_warps * GEMV_KEYS_PER_WARP:
                column_warps *= 2
        extra = ()
        if rope is not None:
            k_cache, v_cache, slot_mapping, cos, sin, positions, n_heads, n_kv_heads, head_dim = rope
            _expect("gemv (rope)", N == (n_heads + 2 * n_kv_heads) * head_dim and head_dim % 2 == 0
                    and k_cache.dtype == v_cache.dtype == "bf16" and len(k_cache.shape) == 4
                    and k_cache.shape == v_cache.shape
                    and k_cache.shape[2:] == (n_kv_heads, head_dim) and slot_mapping.shape == positions.shape == (M,)
                    and slot_mapping.dtype == positions.dtype == "i32" and cos.dtype == sin.dtype == "f32"
                    and cos.shape == sin.shape and cos.shape[1] == head_dim // 2,
                    k_cache, v_cache, slot_mapping, cos, sin, positions)
            extra = (k_cache.arg, v_cache.arg, slot_mapping.arg, cos.arg, sin.arg, positions.arg,
                     *map(np.int32, (n_heads, n_kv_heads, head_dim)))
        if head is not None:
            best, ticket, ids = head
            _expect("gemv (head)", best.dtype == "u64" and best.size >= M and ticket.dtype == ids.dtype == "i32"
                    and ticket.size == 1 and ids.size >= M, best, ticket, ids)
            extra = (best.arg, ticket.arg, ids.arg)
        if silu or rope is not None:
            column_warps = min(column_warps, GEMV_PAIRED_MAX_WARPS)
        cols = GEMV_WARPS // column_warps                         # output columns a block
        grid = -(-(N // 2) // (cols // 2)) if silu or rope is not None else -(-N // cols)
        kind = ("gemv_norm_silu" if silu else "gemv_norm_rope" if rope is not None else "gemv_norm_head" if head
                else "gemv_norm" if norm else "gemv_residual" if residual else "gemv")
        self.gpu.launch(self._gemv[kind][M - 1], self._config("gemv", grid, 32 * GEMV_WARPS),
                        w.arg, x.arg, y.arg, np.int32(N), np.int32(K), np.int32(column_warps), _arg(g),
                        np.float32(eps), *extra)

    def sample(self, logits: DeviceArray, temperature: DeviceArray, top_k: DeviceArray, top_p: DeviceArray,
               seed: DeviceArray, logit_seq_slots: DeviceArray, counter: DeviceArray, out: DeviceArray,
               greedy_ids: DeviceArray | None = None) -> None:
        """out[r] = the next token of row r of logits (n, V) f32, with the parameters of seq_slot s =
        logit_seq_slots[r]: argmax where temperature[s] == 0 (greedy_ids[r] where given: the argmax the LM head
        found, gemv()'s head), else a draw from softmax(logits[r] / temperature[s]) cut to top_k[s] / top_p[s],
        with the counter-based generator (seed[s], counter[r]). Per seq_slot (S,): temperature, top_p f32, top_k
        i32, seed u64; per row (n,): logit_seq_slots (each < S), counter, out, greedy_ids i32."""
        n, V = logits.shape
        S = temperature.shape[0]
        _expect("sample", logits.dtype == "f32" and out.dtype == "i32"
                and out.shape == counter.shape == logit_seq_slots.shape == (n,)
                and (greedy_ids is None or (greedy_ids.dtype == "i32" and greedy_ids.size >= n))
                and temperature.dtype == top_p.dtype == "f32" and top_k.dtype == counter.dtype == "i32"
                and logit_seq_slots.dtype == "i32" and seed.dtype == "u64"
                and temperature.shape == top_p.shape == top_k.shape == seed.shape == (S,),
                logits, temperature, top_k, top_p, seed, logit_seq_slots, counter, out)
        self.gpu.launch(self._sample, self._config("sample", n, SAMPLER_THREADS), logits.arg, np.int32(V),
                        temperature.arg, top_k.arg, top_p.arg, seed.arg, logit_seq_slots.arg, counter.arg,
                        _arg(greedy_ids), out.arg)
