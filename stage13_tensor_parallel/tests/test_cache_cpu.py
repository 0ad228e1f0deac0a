"""CPU: the paged KV cache's size, and the block sizes the kernels accept."""
from dataclasses import replace

import pytest

from common.synthetic import PRESETS

from ..cache import check_block_size, kv_cache_bytes


def test_1b_cache_is_32_kib_per_position_and_gqa_makes_it_4x_smaller():
    cfg = PRESETS["llama-3.2-1b"]
    assert kv_cache_bytes(cfg, 1) == 16 * 2 * 8 * 64 * 2 == 32 << 10
    assert kv_cache_bytes(cfg, 16) == 512 << 10                               # one block of 16 positions
    assert kv_cache_bytes(replace(cfg, num_key_value_heads=32), 4096) == 4 * kv_cache_bytes(cfg, 4096)


@pytest.mark.parametrize("bad", [0, 3, 12, 512, 16.0, True, "16"])
def test_a_block_size_is_a_power_of_two_up_to_256(bad):
    with pytest.raises(ValueError, match=f"block_size={bad!r}" if not isinstance(bad, int) or bad < 1
                       or isinstance(bad, bool) else f"block_size={bad} must be a power of two"):
        check_block_size(bad)
    assert [check_block_size(b) for b in (1, 8, 16, 32, 256)] == [1, 8, 16, 32, 256]
