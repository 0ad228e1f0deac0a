"""The paged KV cache: one pool of fixed-size blocks that every sequence draws on as it grows.

Layout: one allocation, viewed per layer as K and V of shape (num_blocks, block_size, n_kv_heads, head_dim) bf16.
Block b holds cache slots b * block_size .. b * block_size + block_size - 1; which blocks a sequence holds, and
in what order, is its block table (block_manager.py). Keys are stored after RoPE, as in stage03.

Size:  num_blocks x layers x 2 (K, V) x block_size x n_kv_heads x head_dim x 2 bytes.
For Llama 3.2 1B: 32 KiB per position, 512 KiB per block of 16. A sequence holds blocks for the positions it has
(at most block_size - 1 of them unused, in its last block), not a region sized for the longest sequence the
engine accepts (stage06 reserved max_model_len x 32 KiB = 128 MiB per sequence at 4096, used or not).
How many blocks: plan_num_blocks, from the memory the GPU has left after the weights and the activations.
"""
from __future__ import annotations

from common.config import LlamaConfig
from common.device import DeviceArray, Gpu

BLOCK_SIZE = 16      # vLLM's default: positions per block
MAX_NUM_SEQS = 256   # vLLM's default ceiling on sequences in flight
MAX_SLOTS = 2**31 - 1   # cache slots an int32 slot mapping can name


def kv_cache_bytes(config: LlamaConfig, positions: int) -> int:
    """Bytes of K and V for `positions` cache slots, every layer."""
    return config.num_hidden_layers * 2 * positions * config.num_key_value_heads * config.head_dim * 2


def check_count(name: str, value) -> int:
    """`value`, when it is an integer >= 1; else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1")
    return value


def check_block_size(block_size) -> int:
    """A power of two (the kernels split a position into block and offset by shift and mask), at most 256."""
    check_count("block_size", block_size)
    if block_size & (block_size - 1) or block_size > 256:
        raise ValueError(f"block_size={block_size} must be a power of two from 1 to 256 (vLLM's: 8, 16, 32)")
    return block_size


def plan_num_blocks(config: LlamaConfig, block_size: int, total_bytes: int, used_bytes: int,
                    gpu_memory_utilization: float = 0.9, num_gpu_blocks: int | None = None,
                    kv_cache_memory_bytes: int | None = None) -> int:
    """How many blocks the pool gets, as vLLM sizes it: the device's total memory times gpu_memory_utilization,
    less what is in use already (weights, activations, the context: measured, `used_bytes`). Or exactly
    num_gpu_blocks, or as many as kv_cache_memory_bytes holds, when asked: then, as in vLLM,
    gpu_memory_utilization does not apply, and the blocks need only fit in what the device has free (so a
    second engine beside a first can be given a small cache). Refused here, naming the figures to change,
    before anything is allocated."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization!r} must be in (0, 1]")
    per_block = kv_cache_bytes(config, block_size)
    if kv_cache_memory_bytes is not None:
        check_count("kv_cache_memory_bytes", kv_cache_memory_bytes)
        if num_gpu_blocks is not None:
            raise ValueError("give num_gpu_blocks or kv_cache_memory_bytes, not both")
        num_gpu_blocks = kv_cache_memory_bytes // per_block
        if num_gpu_blocks < 1:
            raise ValueError(f"kv_cache_memory_bytes={kv_cache_memory_bytes} holds no block of "
                             f"{per_block} bytes")
    if num_gpu_blocks is not None:
        free = max(total_bytes - used_bytes, 0)
        if check_count("num_gpu_blocks", num_gpu_blocks) * block_size > MAX_SLOTS:
            raise ValueError(f"num_gpu_blocks={num_gpu_blocks} of {block_size} positions is more cache slots than "
                             f"an int32 slot mapping names ({MAX_SLOTS:,})")
        if num_gpu_blocks > free // per_block:
            raise MemoryError(f"num_gpu_blocks={num_gpu_blocks} does not fit: {free / 2**30:.2f} GiB are free on "
                              f"the device ({used_bytes / 2**30:.2f} GiB of {total_bytes / 2**30:.1f} in use), "
                              f"{per_block / 2**10:.0f} KiB per block of {block_size} positions, so at most "
                              f"{free // per_block}; lower it")
        return num_gpu_blocks
    budget = max(int(total_bytes * gpu_memory_utilization) - used_bytes, 0)
    if budget < per_block:
        raise MemoryError(f"not even one block fits: {budget / 2**30:.2f} GiB are left for the KV cache "
                          f"(gpu_memory_utilization={gpu_memory_utilization} of {total_bytes / 2**30:.1f} GiB, "
                          f"less {used_bytes / 2**30:.2f} GiB in use), {per_block / 2**10:.0f} KiB per block of "
                          f"{block_size} positions; raise gpu_memory_utilization, or give kv_cache_memory_bytes")
    # slots are int32 in the slot mapping: 0.9 of an H200 holds 2^31 positions of 60 bytes, so a model whose
    # position costs less (one layer, one K/V head of 16: 64 bytes) comes close; a pool stops at the last slot
    # int32 can name
    return min(budget // per_block, MAX_SLOTS // block_size)


class KVCache:
    def __init__(self, config: LlamaConfig, num_blocks: int, block_size: int, gpu: Gpu):
        self.config, self.num_blocks, self.block_size = config, num_blocks, block_size
        self.nbytes = kv_cache_bytes(config, num_blocks * block_size)
        free, _ = gpu.memory()
        if self.nbytes > free:          # plan_num_blocks left room; this guards a Model built by hand
            raise MemoryError(f"KV cache of {num_blocks} blocks x {block_size} positions: "
                              f"{self.nbytes / 2**30:.2f} GiB needed, {free / 2**30:.2f} GiB free on the GPU; "
                              "lower num_gpu_blocks")
        self.buffer = gpu.empty((self.nbytes,), "u8")
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        per = self.nbytes // (2 * config.num_hidden_layers)
        self.k = [self.buffer.view((2 * i) * per, shape, "bf16") for i in range(config.num_hidden_layers)]
        self.v = [self.buffer.view((2 * i + 1) * per, shape, "bf16") for i in range(config.num_hidden_layers)]

    def layer(self, i: int) -> tuple[DeviceArray, DeviceArray]:
        return self.k[i], self.v[i]
