"""The README's cross-stage table and benchmarks/report.png are generated from the committed results."""
from pathlib import Path

import pytest

from common.course import report


def test_report_is_current():
    assert report.main(["--check"]) == 0, "run python -m common.report"


def test_newest_result_wins_and_old_names_are_mapped():
    results = report.newest()
    assert "common.hf_engine" not in {e for w in results.values() for e in w}
    latency = results["latency"]
    assert latency["stage03_kvcache"][1][-1].split("_")[1] > "2026-12-03"      # not the 1-run harness's of 12-03


def _result(folder, name, workload, stages, time, **extra):
    import json
    r = {"workload": {"name": workload}, "environment": {"gpu": "NVIDIA H200"}, "date": "2026-12-06", "time": time,
         "stages": stages, **extra}
    (folder / name).write_text(json.dumps(r))


def test_a_cut_off_run_keeps_its_figures_and_a_later_run_fills_in_only_what_it_missed(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    _result(tmp_path, "a_long-04_100000.json", "long", {"stage04_static_batch": {
        "prefill_tok_per_s_at_2048": 10.0, "spread": {}}}, "10:00:00")                  # cut off before 32768
    _result(tmp_path, "b_long-04_110000.json", "long", {"stage04_static_batch": {
        "prefill_tok_per_s_at_32768": 3.0, "spread": {}}}, "11:00:00")                  # 32768 alone
    s, names = report.newest()["long"]["stage04_static_batch"]
    assert (s["prefill_tok_per_s_at_2048"], s["prefill_tok_per_s_at_32768"]) == (10.0, 3.0)
    assert names == ["a_long-04_100000.json", "b_long-04_110000.json"]
    _result(tmp_path, "c_long-ladder_120000.json", "long", {"stage06_online_softmax": {
        "prefill_tok_per_s_at_2048": 20.0, "spread": {}}}, "12:00:00", ladder=True, complete=True)
    assert set(report.newest()["long"]) == {"stage06_online_softmax"}       # a complete ladder run stands alone


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


def test_a_complete_ladder_run_is_a_workload_s_only_source(tmp_path, monkeypatch):
    """Once a workload has a complete ladder run, its figures all come from the newest one (separate runs of other
    days and machines do not compare); a ladder run cut off by its time limit does not count; a workload without
    one keeps the newest figures of separate runs, and the table says which it is."""
    import json

    def result(name, date, time, stages, ladder=False, complete=True):
        r = {"workload": {"name": "ragged"}, "date": date, "time": time, "repeats": 3, "ladder": ladder,
             "complete": complete, "environment": {"gpu": "NVIDIA H200"},
             "stages": {e: {"output_tok_per_s": v, "spread": {}} for e, v in stages.items()}}
        (tmp_path / name).write_text(json.dumps(r))

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    result("a.json", "2026-12-06", "10:00:00", {"stage07_paged_attention": 1.0, "hf-sdpa": 5.0})
    result("b.json", "2026-12-06", "11:00:00", {"stage07_paged_attention": 2.0, "stage10_fused_kernels": 3.0})
    assert set(report.newest()["ragged"]) == {"stage07_paged_attention", "hf-sdpa", "stage10_fused_kernels"}
    assert "no ladder run yet" in report.table()
    result("c.json", "2026-12-06", "12:00:00", {"stage07_paged_attention": 7.0, "stage08_cuda_graphs": 8.0},
           ladder=True)
    result("d.json", "2026-12-06", "13:00:00", {"stage07_paged_attention": 9.0}, ladder=True, complete=False)
    ragged = report.newest()["ragged"]
    assert {e: s["output_tok_per_s"] for e, (s, _) in ragged.items()} == {"stage07_paged_attention": 7.0,
                                                                          "stage08_cuda_graphs": 8.0}
    assert "- ragged: the ladder run `c.json`" in report.table()



def test_the_ladders_are_one_gpu_s(tmp_path, monkeypatch):
    """The table's ladders all come from the GPU with ladder runs of the most workloads: a newer ladder of one
    workload on another GPU does not replace that GPU's (its figures would sit in a column beside another
    machine's); once the other GPU has ladders of as many workloads (a tie goes to the newest run's GPU), the
    table is all its own."""
    import json

    def ladder(name, workload, gpu, time, value):
        key = "output_tok_per_s" if workload == "ragged" else "prefill_tok_per_s_at_2048"
        r = {"workload": {"name": workload}, "date": "2026-12-06", "time": time, "repeats": 3, "ladder": True,
             "complete": True, "environment": {"gpu": gpu}, "stages": {"stage07_paged_attention": {key: value,
                                                                                                 "spread": {}}}}
        (tmp_path / name).write_text(json.dumps(r))

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    ladder("a.json", "ragged", "NVIDIA H200", "10:00:00", 1.0)
    ladder("b.json", "long", "NVIDIA H200", "10:10:00", 2.0)
    ladder("c.json", "long", "NVIDIA H100", "11:00:00", 3.0)
    assert {w: e["stage07_paged_attention"][1] for w, e in report.newest().items()} == {"ragged": ["a.json"],
                                                                                      "long": ["b.json"]}
    ladder("d.json", "ragged", "NVIDIA H100", "11:10:00", 4.0)      # two workloads each: the newest run's GPU
    assert {w: e["stage07_paged_attention"][1] for w, e in report.newest().items()} == {"ragged": ["d.json"],
                                                                                      "long": ["c.json"]}
    ladder("e.json", "ragged", "NVIDIA H200", "12:00:00", 5.0)      # still two each; the newest run is the H200's
    assert {w: e["stage07_paged_attention"][1] for w, e in report.newest().items()} == {"ragged": ["e.json"],
                                                                                      "long": ["b.json"]}

def test_report_does_not_import_readme():
    """readme's cross-stage block is report's table, so readme imports report; report renders only that block of
    the README and imports nothing of readme (they imported each other, inside functions)."""
    import subprocess
    import sys

    code = "import sys, common.course.report; assert 'common.course.readme' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_kv_budget_run_shows_only_at_its_ladders_budget_in_a_column_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    gib, length, _ = report.LADDERS["ragged"].budget
    one = {"stage07_paged_attention": {"output_tok_per_s": 2.0, "spread": {}}}
    _result(tmp_path, "a_ragged-kv_100000.json", "ragged", one, "10:00:00", kv_cache_gib=gib, max_model_len=length)
    _result(tmp_path, "b_ragged-kv16_110000.json", "ragged", one, "11:00:00", kv_cache_gib=16.0,
            max_model_len=length)                                                         # another budget: left out
    got = report.newest()
    assert set(got) == {"ragged-kv"} and got["ragged-kv"]["stage07_paged_attention"][1] == ["a_ragged-kv_100000.json"]


def test_a_stage_slower_than_the_one_before_needs_a_sentence_unless_the_run_cannot_tell_them_apart(monkeypatch):
    from common.course import slower

    def figure(x, lo, hi):
        return {"output_tok_per_s": x, "spread": {"output_tok_per_s": (lo, hi)}}, ["GPU_day_ragged-ladder.json"]

    results = {"ragged": {"stage01_a": figure(100, 99, 101), "stage02_b": figure(99.5, 99, 100),
                          "stage03_c": figure(80, 79, 81)}}
    columns = [("ragged: output tok/s", "ragged", "output_tok_per_s", "{}")]
    stages = ["stage01_a", "stage02_b", "stage03_c"]
    cells = slower.slower_cells(results, stages, columns)
    assert [(e, round(r, 3), level) for e, _, _, _, r, level, _ in cells] == [("stage02_b", 1.005, True),
                                                                              ("stage03_c", 1.244, False)]
    said, missing = slower.lines(results, stages, columns)
    assert missing == ["stage03_c: output_tok_per_s (GPU_day_ragged-ladder.json)"] and "**not explained**" in said[-1]
    monkeypatch.setitem(slower.WHY, ("stage03_c", "output_tok_per_s"), ("OTHER_day", "it does more"))
    assert slower.lines(results, stages, columns)[1]                  # a sentence written for another run: owed
    monkeypatch.setitem(slower.WHY, ("stage03_c", "output_tok_per_s"), ("GPU_day", "it does more"))
    said, missing = slower.lines(results, stages, columns)
    assert not missing and said[-1].endswith("1.24x slower than `stage02_b`: it does more.")


def test_a_baseline_run_alone_on_the_ladders_gpu_and_day_joins_its_column(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    one = {"output_tok_per_s": 3.0, "spread": {}}
    _result(tmp_path, "a_ragged-ladder_100000.json", "ragged", {"stage04_static_batch": one}, "10:00:00",
            ladder=True, complete=True)
    _result(tmp_path, "b_ragged-hf-cb_110000.json", "ragged", {"hf-cb": one}, "11:00:00", repeats=1)
    _result(tmp_path, "c_ragged-hf-sdpa_120000.json", "ragged", {"hf-sdpa": one}, "12:00:00",
            environment={"gpu": "another GPU"})                                     # another machine: left out
    got = report.newest()["ragged"]
    assert set(got) == {"stage04_static_batch", "hf-cb"} and got["hf-cb"][1] == ["b_ragged-hf-cb_110000.json"]
