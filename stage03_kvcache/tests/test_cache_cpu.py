"""CPU: the KV cache's size and its bounds."""
import pytest

from common.synthetic import PRESETS
from ..cache import CacheFullError, check_write, kv_cache_bytes


def test_1b_cache_is_32_kib_per_token_and_gqa_makes_it_4x_smaller():
    cfg = PRESETS["llama-3.2-1b"]
    assert kv_cache_bytes(cfg, 1) == 16 * 2 * 8 * 64 * 2 == 32 << 10
    assert kv_cache_bytes(cfg, 4096) == 128 << 20
    from dataclasses import replace
    assert kv_cache_bytes(replace(cfg, num_key_value_heads=32), 4096) == 4 * kv_cache_bytes(cfg, 4096)


def test_writes_append_within_max_model_len():
    check_write(0, 10, 0, 16)                      # prefill
    check_write(10, 1, 10, 16)                     # a decode step right after it
    check_write(15, 1, 15, 16)                     # the last position
    check_write(0, 5, 12, 16)                      # a new sequence restarts at 0
    with pytest.raises(CacheFullError, match="past max_model_len=16"):
        check_write(16, 1, 16, 16)
    with pytest.raises(CacheFullError, match="past max_model_len=16"):
        check_write(0, 17, 0, 16)
    with pytest.raises(CacheFullError, match="holds 10 positions"):
        check_write(12, 1, 10, 16)                 # a gap would attend over stale keys
