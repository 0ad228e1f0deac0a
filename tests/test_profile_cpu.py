"""CPU: the profile's naming of a decode step's kernels, and its floors (common/profile.py)."""
import pytest

from common.checkpoint import Checkpoint
from common.profile import FUSED, floor_bytes, label_step


def test_cublas_kernels_take_the_step_s_gemms_in_order_and_a_reduction_stays_with_its_gemm():
    layer = ["add_rms_norm", "nvjet_a", "rope_inplace", "kv_write", "attention_tiles_hd64", "attention_combine",
             "sm90_gemm_b", "splitKreduce_kernel", "add_rms_norm", "gemv2T_c", "silu_mul", "nvjet_d"]
    names = ["embedding_gather", *layer, *layer, "add_rms_norm", "embedding_gather", "nvjet_head", "sample_tokens"]
    labels = label_step(names, num_layers=2)
    gemms = [lab for name, lab in zip(names, labels) if lab.startswith("gemm")]
    assert gemms == ["gemm qkv", "gemm o", "gemm o", "gemm gate_up", "gemm down"] * 2 + ["gemm lm_head"]
    assert labels[:2] == ["embedding", "norms"] and labels[5:7] == ["attention", "attention"]
    assert labels[-1] == "sample"
    with pytest.raises(ValueError, match="GEMMs"):
        label_step(names + ["nvjet_extra"], num_layers=2)


@pytest.mark.parametrize("fixture", ["tiny_dir", "tiny_untied_dir"])
def test_the_floors_of_zero_rows_are_the_weights_each_read_once(fixture, request):
    """With no rows, only weights move: the GEMMs' and norms' floors add up to the checkpoint's bytes, less the
    embedding table where it is not the LM head (a gather reads only its rows)."""
    ckpt = Checkpoint(request.getfixturevalue(fixture))
    c = ckpt.config
    floors = floor_bytes(c, 0, [])
    untied = c.vocab_size * c.hidden_size * 2 if fixture == "tiny_untied_dir" else 0
    assert sum(v for g, v in floors.items() if g not in FUSED) == ckpt.total_bytes - untied
    more = floor_bytes(c, 4, [100] * 4)
    assert more["attention"] - floors["attention"] >= c.num_hidden_layers * 4 * 100 * 2 * c.num_key_value_heads \
        * c.head_dim * 2                                     # every cached key and value read
    assert more["rope + kv_write"] == more["rope"] + more["kv_write"] > 0   # the fused kernel moves both's bytes


def test_overlapping_kernels_count_once_each_from_the_previous_end():
    """Kernels launched early (programmatic dependent launch) start before the one ahead ends: each is counted
    from that end, so the step's nanoseconds are counted once; without overlap it is each kernel's duration."""
    from common.profile import exposed_ns

    assert exposed_ns([(0, 10, "a"), (12, 20, "b"), (20, 25, "c")]) == [10, 8, 5]          # serial, a gap
    assert exposed_ns([(0, 10, "a"), (3, 14, "b"), (5, 30, "c"), (6, 31, "d")]) == [10, 4, 16, 1]
    assert sum(exposed_ns([(0, 10, "a"), (3, 14, "b"), (5, 30, "c")])) == 30 - 0           # the span, no gaps
