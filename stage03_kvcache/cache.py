"""The KV cache: every layer's keys and values of every position so far, so a decode step computes one token.

Layout: one allocation, viewed per layer as K and V of shape (max_model_len, n_kv_heads, head_dim) bf16.
Keys are stored after RoPE: a key's rotation depends only on its own position, which never changes.

Size:  layers x 2 (K, V) x max_model_len x n_kv_heads x head_dim x 2 bytes.
For Llama 3.2 1B: 16 x 2 x L x 8 x 64 x 2 = 32 KiB per token, 128 MiB at L = 4096. With one K/V head per query
head (32, no GQA) it would be 4x that: grouped-query attention is what keeps the cache small.
"""
from __future__ import annotations

from common.config import LlamaConfig
from common.device import DeviceArray, Gpu


def kv_cache_bytes(config: LlamaConfig, max_model_len: int) -> int:
    return config.num_hidden_layers * 2 * max_model_len * config.num_key_value_heads * config.head_dim * 2


class CacheFullError(IndexError):
    """A write past max_model_len: the engine stops a sequence with finish_reason "length" before this."""


class KVCache:
    def __init__(self, config: LlamaConfig, max_model_len: int, gpu: Gpu):
        self.config, self.max_model_len = config, max_model_len
        self.nbytes = kv_cache_bytes(config, max_model_len)
        free, _ = gpu.memory()
        if self.nbytes > free:
            raise MemoryError(f"KV cache for max_model_len={max_model_len}: {self.nbytes / 2**30:.2f} GiB needed, "
                              f"{free / 2**30:.2f} GiB free on the GPU; lower max_model_len")
        self.buffer = gpu.empty((self.nbytes,), "u8")
        self.length = 0                                    # positions [0, length) hold valid K/V
        shape = (max_model_len, config.num_key_value_heads, config.head_dim)
        per = self.nbytes // (2 * config.num_hidden_layers)
        self.k = [self.buffer.view((2 * i) * per, shape, "bf16") for i in range(config.num_hidden_layers)]
        self.v = [self.buffer.view((2 * i + 1) * per, shape, "bf16") for i in range(config.num_hidden_layers)]

    def reserve(self, pos0: int, n: int) -> None:
        """Positions [pos0, pos0 + n) are about to be written: they must follow the valid ones and fit."""
        check_write(pos0, n, self.length, self.max_model_len)
        self.length = pos0 + n

    def layer(self, i: int) -> tuple[DeviceArray, DeviceArray]:
        return self.k[i], self.v[i]


def check_write(pos0: int, n: int, length: int, max_model_len: int) -> None:
    if pos0 != length and pos0 != 0:
        raise CacheFullError(f"cache write at position {pos0}: the cache holds {length} positions (writes append, "
                             "or restart at 0)")
    if n < 1 or pos0 + n > max_model_len:
        raise CacheFullError(f"cache write of positions [{pos0}, {pos0 + n}) past max_model_len={max_model_len}")
