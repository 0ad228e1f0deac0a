"""The README's cross-stage table and benchmarks/report.png are generated from the committed results."""
from pathlib import Path

import pytest

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


def test_check_says_what_it_found_up_to_date(capsys):
    assert report.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("up to date: README.md's generated blocks and benchmarks/report.png"), out


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--chek"], 2)])
def test_help_and_a_typo_write_nothing(argv, code, capsys, monkeypatch):
    """Any argument but --check was taken as "regenerate": --help rewrote the README and the chart."""
    written = []
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: written.append(self))
    monkeypatch.setattr(report, "draw", lambda data, path: written.append(path))
    with pytest.raises(SystemExit) as exit_:
        report.main(argv)
    assert exit_.value.code == code and written == []
    if code:
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == "python -m common.report: error: unrecognized arguments: --chek", err
