"""The README's cross-stage table and benchmarks/report.png are generated from the committed results."""
from common import report


def test_report_is_current():
    assert report.main(["--check"]) == 0, "run python -m common.report"


def test_newest_result_wins_and_old_names_are_mapped():
    results = report.newest()
    assert "common.hf_engine" not in {e for w in results.values() for e in w}
    latency = results["latency"]
    assert latency["stage03_kvcache"][1] > "NVIDIA-H200_2026-12-03_latency-02-03.json"   # the 3-run harness's


def test_chart_digest_follows_the_data():
    data = report.chart_data()
    changed = dict(data, floor_ms=(data["floor_ms"] or 0) + 1)
    assert report.digest(data) != report.digest(changed)
