"""The README's cross-stage table and benchmarks/report.png are generated from the committed results."""
from common import report


def test_report_is_current():
    assert report.main(["--check"]) == 0, "run python -m common.report"


def test_newest_result_wins_and_old_names_are_mapped():
    results = report.newest()
    assert "common.hf_engine" not in {e for w in results.values() for e in w}
    latency = results["latency"]
    assert latency["stage03_kvcache"][1][-1] > "NVIDIA-H200_2026-12-03_latency-02-03.json"   # the 3-run harness's


def test_a_cut_off_run_keeps_its_figures_and_a_later_run_fills_in_only_what_it_missed():
    s, names = report.newest()["long"]["stage04_static_batch"]
    assert {"prefill_tok_per_s_at_2048", "prefill_tok_per_s_at_32768"} <= set(s)
    assert names == ["NVIDIA-H200_2026-12-03_long-hf-sdpa-03-04_141237.json",   # cut off before 32768
                     "NVIDIA-H200_2026-12-03_long-04_141951.json"]              # 32768 alone


def test_chart_digest_follows_the_data():
    data = report.chart_data()
    changed = dict(data, floor_ms=(data["floor_ms"] or 0) + 1)
    assert report.digest(data) != report.digest(changed)
