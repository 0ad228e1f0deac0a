from common.bench import WORKLOADS, format_table, make_requests, stage_module, summarise


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
