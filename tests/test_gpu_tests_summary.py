"""common.bench.gpu_tests: a GPU test run's JUnit XML as per-stage counts (the README's status comes from them)."""
import json

from common.bench.gpu_tests import main, per_stage

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" time="12.5">
<testcase classname="stage01_loading.tests.test_gpu" name="a" time="1"/>
<testcase classname="stage01_loading.tests.test_gpu" name="b" time="1"><skipped message="no"/></testcase>
<testcase classname="stage07_paged_attention.tests.test_kernels_gpu" name="c" time="1"><failure message="x"/></testcase>
<testcase classname="stage07_paged_attention.tests.test_kernels_gpu" name="d" time="1"><error message="f"/></testcase>
<testcase classname="tests.test_serve_gpu" name="e" time="1"/>
</testsuite></testsuites>"""


def test_cases_count_under_their_top_folder_and_errors_as_failures():
    stages, wall = per_stage(XML)
    assert stages == {"stage01_loading": {"passed": 1, "failed": 0, "skipped": 1},
                      "stage07_paged_attention": {"passed": 0, "failed": 2, "skipped": 0},
                      "tests": {"passed": 1, "failed": 0, "skipped": 0}}
    assert wall == 12.5


def test_the_summary_file_is_named_by_gpu_and_date_and_a_missing_xml_is_one_line(tmp_path, capsys):
    (tmp_path / "run.xml").write_text(XML)
    assert main([str(tmp_path / "run.xml"), "--commit", "abc1234", "--gpu", "NVIDIA H200", "--out",
                 str(tmp_path)]) == 0
    [path] = tmp_path.glob("NVIDIA-H200_*_gpu-tests.json")
    record = json.loads(path.read_text())
    assert record["commit"] == "abc1234" and record["stages"]["tests"]["passed"] == 1
    assert main([str(tmp_path / "none.xml"), "--commit", "a", "--gpu", "g", "--out", str(tmp_path)]) == 2
    assert "none.xml: no such JUnit XML file" in capsys.readouterr().err
