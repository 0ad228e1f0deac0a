"""common.bench.prefill_profile without a GPU: its grouping of a prefill's kernels, the FLOPs it holds them to, its
table, and its command line's refusals."""
import pytest

from common.bench import prefill_profile as pp
from common.bench.profile import read_declaration
from common.synthetic import PRESETS

STAGE = "stage12_hopper_attention"
CUBLAS = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"


def test_kernels_group_by_the_stage_s_names_and_prompt_only_ones_keep_theirs():
    declared = read_declaration(STAGE)
    kernels = [(0, 10, "embedding_gather"), (10, 30, CUBLAS), (25, 60, "attention_hopper_hd64"),
               (60, 70, "add_rms_norm"), (70, 90, "gemv_m1_k2048"), (95, 100, "attention_tiles_hd64")]
    # the attention kernel starts 5 ns before the GEMM ends (launched early): its own 30 count, not 35
    assert pp.group_times(kernels, declared) == pytest.approx(
        {"embedding": 10e-6, "gemm": 40e-6, "attention_hopper_hd64": 30e-6, "norms": 10e-6, "attention": 5e-6})


def test_the_flops_of_a_prefill_are_the_gemms_rows_and_attention_s_causal_pairs():
    c = PRESETS["llama-3.2-1b"]
    f = pp.prefill_flops(c, 4)
    per_row = 3072 * 2048 + 2048 * 2048 + 16384 * 2048 + 2048 * 8192
    assert f["gemm"] == 2 * (16 * 4 * per_row + 128256 * 2048)
    assert f["attention"] == 4 * 64 * 32 * (4 * 5 / 2) * 16          # 10 (query, key) pairs a head and layer


def test_the_summary_shares_the_prefill_and_rates_the_gemms_and_attention():
    c = PRESETS["llama-3.2-1b"]
    kernels = [(0, 4_000_000, CUBLAS), (4_000_000, 10_000_000, "attention_hopper_hd64"),
               (11_000_000, 12_000_000, "attention_tiles_hd64")]
    s = pp.summarize(kernels, read_declaration(STAGE), c, 8192)
    assert list(s["groups"]) == ["attention_hopper_hd64", "gemm", "attention"]        # the largest first
    assert sum(g["share"] for g in s["groups"].values()) == pytest.approx(1.0)
    assert s["groups"]["gemm"]["tflop_per_s"] == pytest.approx(pp.prefill_flops(c, 8192)["gemm"] / 4e9)
    assert s["attention_ms"] == pytest.approx(7.0) and s["gaps_ms"] == pytest.approx(1.0)
    assert s["attention_tflop_per_s"] == pytest.approx(pp.prefill_flops(c, 8192)["attention"] / 7e9)
    p = {"stage": STAGE, "prompt_tokens": 8192, "max_num_batched_tokens": 2048, "steps": 4, "gpu": "a GPU",
         "wall_ms": 13.0, **s}
    table = pp.format_prefill(p)
    assert "| attention_hopper_hd64 | 6.00 | 54.5% | - |" in table
    assert "| attention, every kernel | 7.00 | 63.6% |" in table
    assert "a budget of 2,048 rows a step (4 step() calls)" in table


def test_attention_by_chunk_rates_each_chunk_s_launches_on_its_own_pairs():
    c = PRESETS["llama-3.2-1b"]                            # 16 layers
    # a prompt of 5 rows in chunks of 3: rows 0-2 (6 causal pairs a head), then rows 3-4 (2 x 3 + 3 = 9)
    kernels = [(i * 10, i * 10 + 4, "attention_hopper_hd64") for i in range(32)]
    kernels.insert(5, (48, 52, CUBLAS))               # the next attention launch (50-54) starts before it ends
    chunks = pp.attention_by_chunk(kernels, c, 5, 3)
    assert [(ch["first_position"], ch["rows"]) for ch in chunks] == [(0, 3), (3, 2)]
    per_pair = 4 * 64 * 32 * 16
    assert chunks[0]["ms"] == pytest.approx(15 * 4e-6 + 2e-6)       # its first 2 ns are the GEMM's
    assert chunks[1]["tflop_per_s"] == pytest.approx(per_pair * 9 / (16 * 4e-6 * 1e9))
    assert chunks[0]["tflop_per_s"] == pytest.approx(per_pair * 6 / (62e-6 * 1e9))
    assert pp.attention_by_chunk(kernels[:-1], c, 5, 3) is None     # a launch short: no chunk is named
    p = {"stage": STAGE, "prompt_tokens": 5, "max_num_batched_tokens": 3, "steps": 2, "gpu": "a GPU", "wall_ms": 1.0,
         **pp.summarize(kernels, read_declaration(STAGE), c, 5), "attention_by_chunk": chunks}
    line = f"attention by chunk, TFLOP/s from its first position: 0: {chunks[0]['tflop_per_s']:.0f}, 3: "
    assert line in pp.format_prefill(p)


def test_two_prompts_share_no_block_of_16_so_the_second_is_prefilled_whole():
    a, b = pp.prompt_of(64, 0), pp.prompt_of(64, 1)
    assert len(a) == len(b) == 64 and a[0] == b[0] == 128000 and a[1:16] != b[1:16]


@pytest.mark.parametrize("argv, says", [(["--stage", "99"], "no such stage"),
                                        (["--stage", "02"], "has no step()"),
                                        (["--stage", "12", "--prompt-tokens", "1"], "at least 2 tokens")])
def test_the_command_line_refuses_in_one_line(capsys, argv, says):
    assert pp.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err
