"""CPU: the KV cache's size."""
from dataclasses import replace

from common.synthetic import PRESETS
from ..cache import kv_cache_bytes


def test_1b_cache_is_32_kib_per_token_per_seq_slot_and_gqa_makes_it_4x_smaller():
    cfg = PRESETS["llama-3.2-1b"]
    assert kv_cache_bytes(cfg, 1) == 16 * 2 * 8 * 64 * 2 == 32 << 10
    assert kv_cache_bytes(cfg, 4096) == 128 << 20
    assert kv_cache_bytes(cfg, 4096, num_seqs=64) == 8 << 30                # every region sized for 4096 positions
    assert kv_cache_bytes(replace(cfg, num_key_value_heads=32), 4096) == 4 * kv_cache_bytes(cfg, 4096)
