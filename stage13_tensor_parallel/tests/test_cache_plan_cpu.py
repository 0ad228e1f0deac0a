"""CPU: the block pool is sized from the device's memory as vLLM sizes it, or to an asked-for number of blocks or
bytes, and a configuration that cannot fit is refused before anything is allocated, naming the figures."""
from dataclasses import replace

import pytest

from common.synthetic import PRESETS

from ..cache import MAX_SLOTS, kv_cache_bytes, plan_num_blocks

GiB = 2**30
CFG = PRESETS["llama-3.2-1b"]                    # 512 KiB of K/V per block of 16 positions


def test_as_many_blocks_as_the_memory_left_holds():
    # 10 GiB total at 0.9 = 9 GiB, less 3 GiB in use (weights, activations, context): 6 GiB = 12,288 blocks
    assert plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB) == 6 * 2048
    assert plan_num_blocks(CFG, 32, 10 * GiB, 3 * GiB) == 6 * 1024
    assert plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, gpu_memory_utilization=0.5) == 2 * 2048


def test_an_asked_for_number_or_budget_is_given_exactly_or_refused_with_the_figures():
    assert plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, num_gpu_blocks=100) == 100
    assert plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, kv_cache_memory_bytes=4 * GiB) == 4 * 2048
    assert plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, kv_cache_memory_bytes=kv_cache_bytes(CFG, 16) * 3 + 1) == 3
    # as in vLLM, an asked-for size ignores gpu_memory_utilization: 7 GiB are free, so 6.5 GiB fits
    assert plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, gpu_memory_utilization=0.1,
                           kv_cache_memory_bytes=int(6.5 * GiB)) == 13 * 1024
    with pytest.raises(MemoryError, match=r"num_gpu_blocks=14337 does not fit: 7.00 GiB are free on the device "
                                          r"\(3.00 GiB of 10.0 in use\), 512 KiB per block .* so at most 14336"):
        plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, num_gpu_blocks=14337)
    with pytest.raises(MemoryError, match=r"num_gpu_blocks=16384 does not fit"):            # 8 GiB asked
        plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, kv_cache_memory_bytes=8 * GiB)
    with pytest.raises(ValueError, match="not both"):
        plan_num_blocks(CFG, 16, 10 * GiB, 3 * GiB, num_gpu_blocks=1, kv_cache_memory_bytes=GiB)


def test_nothing_fits_and_bad_values():
    with pytest.raises(MemoryError, match="not even one block fits: 0.00 GiB are left"):
        plan_num_blocks(CFG, 16, 10 * GiB, 9 * GiB)
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        plan_num_blocks(CFG, 16, 10 * GiB, 0, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="num_gpu_blocks=0"):
        plan_num_blocks(CFG, 16, 10 * GiB, 0, num_gpu_blocks=0)
    with pytest.raises(ValueError, match="kv_cache_memory_bytes=1000 holds no block"):
        plan_num_blocks(CFG, 16, 10 * GiB, 0, kv_cache_memory_bytes=1000)


def test_a_pool_never_has_more_slots_than_int32_names():
    small = replace(CFG, num_hidden_layers=1, num_key_value_heads=1, head_dim=16)      # 64 bytes a position
    assert kv_cache_bytes(small, 1) == 64
    assert plan_num_blocks(small, 16, 150 * GiB, 2 * GiB) == MAX_SLOTS // 16           # 2.2e9 positions would fit
    with pytest.raises(ValueError, match=r"num_gpu_blocks=134217728 of 16 positions is more cache slots than an "
                                         r"int32 slot mapping names"):
        plan_num_blocks(small, 16, 150 * GiB, 2 * GiB, num_gpu_blocks=2**27)
