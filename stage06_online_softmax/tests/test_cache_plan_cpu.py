"""CPU: the KV cache is sized from the device's memory as vLLM sizes it, and a configuration that cannot fit is
refused before anything is allocated, naming the figures to lower."""
import pytest

from common.synthetic import PRESETS

from ..cache import MAX_NUM_SEQS, kv_cache_bytes, plan_num_seqs

GiB = 2**30
CFG = PRESETS["llama-3.2-1b"]                    # 32 KiB of K/V per token: 128 MiB per sequence of 4096


def test_as_many_sequences_as_the_memory_left_holds_up_to_the_ceiling():
    assert kv_cache_bytes(CFG, 4096) == 128 * 2**20
    # 10 GiB total at 0.9 = 9 GiB, less 2.5 in use and 0.5 of activations: 6 GiB = 48 sequences of 128 MiB
    assert plan_num_seqs(CFG, 4096, 10 * GiB, int(2.5 * GiB), GiB // 2) == 48
    assert plan_num_seqs(CFG, 4096, 140 * GiB, 3 * GiB, 2 * GiB) == MAX_NUM_SEQS
    assert plan_num_seqs(CFG, 4096, 140 * GiB, 3 * GiB, 2 * GiB, gpu_memory_utilization=0.1) == 72


def test_an_asked_for_number_is_given_exactly_or_refused_with_the_figures():
    assert plan_num_seqs(CFG, 4096, 10 * GiB, int(2.5 * GiB), GiB // 2, max_num_seqs=48) == 48
    with pytest.raises(MemoryError, match=r"max_num_seqs=49 does not fit: 6.00 GiB are left .* so at most 48; "
                                          r"lower max_num_seqs or max_model_len"):
        plan_num_seqs(CFG, 4096, 10 * GiB, int(2.5 * GiB), GiB // 2, max_num_seqs=49)


def test_nothing_fits_and_bad_values():
    with pytest.raises(MemoryError, match="not even one sequence fits"):
        plan_num_seqs(CFG, 131072, 10 * GiB, 6 * GiB, GiB // 2)            # 2.5 GiB left, 4 GiB a sequence
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        plan_num_seqs(CFG, 4096, 10 * GiB, 0, 0, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        plan_num_seqs(CFG, 4096, 10 * GiB, 0, 0, max_num_seqs=0)
