"""The KV cache of continuous batching: one region per seq_slot, each the stage03 cache of one sequence.

Layout: one allocation, viewed per layer as K and V of shape (num_seqs, max_model_len, n_kv_heads, head_dim)
bf16. A sequence owns the region of its seq_slot from its admission to its finish; its position p is cache slot
seq_slot * max_model_len + p (the slot mapping, kv_write.cu). Keys are stored after RoPE, as in stage03.

Size:  num_seqs x layers x 2 (K, V) x max_model_len x n_kv_heads x head_dim x 2 bytes.
For Llama 3.2 1B: 32 KiB per token, so a region of 4096 positions is 128 MiB, reserved whether its sequence
uses it or not: every region is sized for the longest sequence the engine accepts (stage07's paged cache hands
out memory as sequences grow instead). How many regions: plan_num_seqs, from the memory the GPU has left.
"""
from __future__ import annotations

from common.config import LlamaConfig
from common.device import DeviceArray, Gpu


def kv_cache_bytes(config: LlamaConfig, max_model_len: int, num_seqs: int = 1) -> int:
    return (num_seqs * config.num_hidden_layers * 2 * max_model_len * config.num_key_value_heads
            * config.head_dim * 2)


MAX_NUM_SEQS = 256   # vLLM's default ceiling on sequences in flight


def check_count(name: str, value) -> int:
    """`value`, when it is an integer >= 1; else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be an integer >= 1")
    return value


def plan_num_seqs(config: LlamaConfig, max_model_len: int, total_bytes: int, used_bytes: int,
                  activation_bytes: int, gpu_memory_utilization: float = 0.9,
                  max_num_seqs: int | None = None) -> int:
    """How many seq_slots of max_model_len positions the KV cache gets, as vLLM sizes it: the device's total
    memory times gpu_memory_utilization, less what is in use already (the weights, the context) and what the
    activations will take; then up to MAX_NUM_SEQS of them, or exactly `max_num_seqs` when asked. A
    configuration that cannot fit is refused here, naming the figures to lower, before anything is allocated."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization!r} must be in (0, 1]")
    per_seq = kv_cache_bytes(config, max_model_len)
    budget = int(total_bytes * gpu_memory_utilization) - used_bytes - activation_bytes
    fits = max(budget, 0) // per_seq
    why = (f"{max(budget, 0) / 2**30:.2f} GiB are left for the KV cache (gpu_memory_utilization="
           f"{gpu_memory_utilization} of {total_bytes / 2**30:.1f} GiB, less {used_bytes / 2**30:.2f} GiB in use "
           f"and {activation_bytes / 2**30:.2f} GiB of activations), {per_seq / 2**20:.0f} MiB per sequence of "
           f"max_model_len={max_model_len}")
    if max_num_seqs is not None:
        if check_count("max_num_seqs", max_num_seqs) > fits:
            raise MemoryError(f"max_num_seqs={max_num_seqs} does not fit: {why}, so at most {fits}; lower "
                              "max_num_seqs or max_model_len, or raise gpu_memory_utilization")
        return max_num_seqs
    if fits < 1:
        raise MemoryError(f"not even one sequence fits: {why}; lower max_model_len or raise gpu_memory_utilization")
    return min(fits, MAX_NUM_SEQS)


class KVCache:
    def __init__(self, config: LlamaConfig, num_seqs: int, max_model_len: int, gpu: Gpu):
        self.config, self.num_seqs, self.max_model_len = config, num_seqs, max_model_len
        self.nbytes = kv_cache_bytes(config, max_model_len, num_seqs)
        free, _ = gpu.memory()
        if self.nbytes > free:          # plan_num_seqs left room; this guards a Model built by hand
            raise MemoryError(f"KV cache for num_seqs={num_seqs} x max_model_len={max_model_len}: "
                              f"{self.nbytes / 2**30:.2f} GiB needed, {free / 2**30:.2f} GiB free on the GPU; "
                              "lower max_num_seqs or max_model_len")
        self.buffer = gpu.empty((self.nbytes,), "u8")
        shape = (num_seqs, max_model_len, config.num_key_value_heads, config.head_dim)
        per = self.nbytes // (2 * config.num_hidden_layers)
        self.k = [self.buffer.view((2 * i) * per, shape, "bf16") for i in range(config.num_hidden_layers)]
        self.v = [self.buffer.view((2 * i + 1) * per, shape, "bf16") for i in range(config.num_hidden_layers)]

    def layer(self, i: int) -> tuple[DeviceArray, DeviceArray]:
        return self.k[i], self.v[i]
