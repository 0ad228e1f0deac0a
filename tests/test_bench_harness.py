from common.bench import WORKLOADS, format_table, growth_rates, make_requests, stage_module, summarise
from common.outputs import Timing


def test_workloads_are_seeded_and_in_range():
    a, b = make_requests("ragged"), make_requests("ragged")
    assert [r[0] for r in a] == [r[0] for r in b] and len(a) == 256
    assert all(100 <= len(p) <= 1024 and 100 <= s.max_tokens <= 1024 and s.ignore_eos for p, s in a)
    assert all(len(p) == 128 and s.max_tokens == 256 for p, s in make_requests("latency"))
    assert set(WORKLOADS) >= {"latency", "growth", "batch", "ragged", "long", "load"}


def test_table_has_ratio_to_previous_stage():
    summary = summarise({"stage01_x": [{"v": 2.0}, {"v": 4.0}, {"v": 3.0}], "stage02_y": [{"v": 6.0}]})
    table = format_table(summary)
    assert "| stage01_x | 3.000 | - |" in table and "| stage02_y | 6.000 | 2.00x |" in table


def test_stage_lookup():
    assert stage_module("01") == "stage01_loading"


def test_baselines_load_like_stages():
    assert stage_module("hf") == "common.hf_engine" and stage_module("numpy") == "common.reference"


def test_growth_rates_count_decode_steps_only():
    """Token 1 comes from prefill (its time is the TTFT); tokens 2..n from n - 1 decode steps."""
    slow_later = Timing(512, ttft_s=1.0, step_s=[0.01] * 255 + [0.02] * 768)   # 1024 new tokens
    rates = growth_rates([slow_later])
    assert abs(rates["decode_tok_per_s_at_64"] - 100.0) < 1e-9
    assert abs(rates["decode_tok_per_s_at_256"] - 100.0) < 1e-9
    assert abs(rates["decode_tok_per_s_at_1024"] - 1023 / (2.55 + 15.36)) < 1e-9
