"""The KV cache as the tensor memory accelerator (TMA) sees it: one tensor map per layer's K and per layer's V.

A tensor map is 128 bytes the driver encodes (cuTensorMapEncodeTiled) and a TMA instruction reads: a tensor in
global memory (its address, sizes and strides in bytes), the box one instruction copies, and the swizzle it applies
on the way into shared memory. attention_hopper.cu's producer names a map and the box's coordinates; the copy runs
by itself and counts its bytes down an mbarrier.

One layer's K (and V) is (num_blocks, block_size, nkv, head_dim) bf16, i.e. the 3-D tensor, innermost first,

    (head_dim, nkv, slots):  a head's dims contiguous, heads head_dim * 2 bytes apart, slots nkv head_dim 2 apart

and the box is (64, 1, ROWS): 64 dims of one K/V head at ROWS consecutive slots, ROWS = min(block_size, 64): one
block's positions, at most 64 (a 128-key tile takes two copies or more). Each row is 128 bytes, swizzled 128B (chunk
c of row r stored at c ^ (r % 8)): the layout wgmma reads without bank conflicts. head_dim 128 is two boxes, dims
0-63 and 64-127.
Blocks of fewer than 8 positions would land copies inside a 1,024-byte swizzle atom: refused here (the engine
takes attention_tiles.cu for them).

    maps = kv_tensor_maps(gpu, cache)    (2 L, 16) u64 on the GPU: row 2 i layer i's K map, row 2 i + 1 its V map
"""
from __future__ import annotations

import numpy as np

from common.device import DeviceArray, Gpu, check

BOX_DIMS = 64                 # a box's dims: 128 bytes of bf16, the 128B swizzle's row
MIN_BLOCK_SIZE = 8            # positions a block must hold: 8 rows of 128 bytes make the swizzle's 1,024-byte atom


def box_rows(block_size: int) -> int:
    """Positions one copy moves: a block's, at most 64 (attention_hopper.cu's BOX_ROWS)."""
    return min(block_size, 64)


def encode(address: int, head_dim: int, n_kv_heads: int, slots: int, rows: int) -> bytes:
    """The 128-byte tensor map of one layer's K or V at `address`."""
    from cuda.bindings import driver as t

    result = t.cuTensorMapEncodeTiled(
        t.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, address,
        [t.cuuint64_t(head_dim), t.cuuint64_t(n_kv_heads), t.cuuint64_t(slots)],
        [t.cuuint64_t(2 * head_dim), t.cuuint64_t(2 * head_dim * n_kv_heads)],        # bytes, dims 1 and 2
        [t.cuuint32_t(BOX_DIMS), t.cuuint32_t(1), t.cuuint32_t(rows)], [t.cuuint32_t(1)] * 3,
        t.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, t.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        t.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        t.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    tensor_map = check(result, "cuTensorMapEncodeTiled")
    return np.array([int(w) for w in tensor_map.opaque], np.uint64).tobytes()


def kv_tensor_maps(gpu: Gpu, cache) -> DeviceArray:
    """Every layer's K and V maps, in one device array (2 L, 16) u64 (128 bytes a map, 64-byte aligned)."""
    num_blocks, block_size, nkv, hd = cache.k[0].shape
    if block_size < MIN_BLOCK_SIZE or hd % BOX_DIMS:
        raise ValueError(f"block_size={block_size}, head_dim={hd}: the TMA maps need blocks of at least "
                         f"{MIN_BLOCK_SIZE} positions and head_dim a multiple of {BOX_DIMS}")
    rows = box_rows(block_size)
    maps = b"".join(encode(a.ptr, hd, nkv, num_blocks * block_size, rows)
                    for k, v in zip(cache.k, cache.v) for a in (k, v))
    return gpu.to_device(np.frombuffer(maps, np.uint64).reshape(2 * len(cache.k), 16))
