"""common.bench.gpu_tests: a GPU test run's verbose logs as per-stage counts (the README's status comes from them)."""
import json

from common.bench.gpu_tests import main, per_stage

FIRST = """============================= test session starts ==============================
stage01_loading/tests/test_gpu.py::test_a PASSED                         [ 10%]
stage01_loading/tests/test_gpu.py::test_b[tiny] SKIPPED (no padded use)  [ 20%]
stage07_paged_attention/tests/test_kernels_gpu.py::test_c[64-128] FAILED [ 30%]
stage07_paged_attention/tests/test_kernels_gpu.py::test_d PASSED         [ 40%]
stage07_paged_attention/tests/test_kernels_gpu.py::test_d ERROR          [ 40%]
tests/test_serve_gpu.py::test_e[05] PASSED                               [ 50%]
FAILED stage07_paged_attention/tests/test_kernels_gpu.py::test_c[64-128] - AssertionError
============ 1 failed, 3 passed, 1 skipped, 1 error in 12.50s (0:00:12) ============
"""
CUT = """stage13_tensor_parallel/tests/test_gpu.py::test_f PASSED              [  1%]
"""


def test_cases_count_once_under_their_top_folder_by_their_worst_outcome():
    stages, wall, complete = per_stage([FIRST])
    assert stages == {"stage01_loading": {"passed": 1, "failed": 0, "skipped": 1},
                      "stage07_paged_attention": {"passed": 0, "failed": 2, "skipped": 0},
                      "tests": {"passed": 1, "failed": 0, "skipped": 0}}
    assert (wall, complete) == (12.5, True)


def test_a_log_cut_off_before_pytests_closing_line_makes_the_summary_incomplete():
    stages, wall, complete = per_stage([FIRST, CUT])
    assert stages["stage13_tensor_parallel"] == {"passed": 1, "failed": 0, "skipped": 0}
    assert (wall, complete) == (12.5, False)


def test_the_summary_file_is_named_by_gpu_and_date_and_a_missing_log_is_one_line(tmp_path, capsys):
    (tmp_path / "run.log").write_text(FIRST)
    assert main([str(tmp_path / "run.log"), "--commit", "abc1234", "--gpu", "NVIDIA H200", "--out",
                 str(tmp_path)]) == 0
    [path] = tmp_path.glob("NVIDIA-H200_*_gpu-tests.json")
    record = json.loads(path.read_text())
    assert record["commit"] == "abc1234" and record["complete"] and record["stages"]["tests"]["passed"] == 1
    assert main([str(tmp_path / "none.log"), "--commit", "a", "--gpu", "g", "--out", str(tmp_path)]) == 2
    assert "none.log: no such log" in capsys.readouterr().err


def test_ids_with_spaces_a_module_that_fails_to_import_and_an_interrupted_run(tmp_path):
    log = """stage02_forward/tests/test_gpu.py::test_p[a b] PASSED              [ 10%]
stage02_forward/tests/test_gpu.py::test_p[a c] PASSED              [ 20%]
==================================== ERRORS ====================================
_____________ ERROR collecting stage03_kvcache/tests/test_gpu.py ______________
E   ImportError: cannot import name 'x'
!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!
=============================== 1 error in 0.18s ===============================
"""
    stages, _, complete = per_stage([log])
    assert stages["stage02_forward"]["passed"] == 2                   # two cases, though their ids hold a space
    assert stages["stage03_kvcache"]["failed"] == 1 and not complete
    (tmp_path / "gpu.txt").write_text("name, driver\nNVIDIA H100, 580\nTue Dec  8 01:16:35 AM UTC 2026\n"
                                      "day 2026-12-07\ncommit abc\n")
    (tmp_path / "gpu-tests.log").write_text(FIRST)
    assert main([str(tmp_path / "gpu-tests.log"), "--commit", "abc", "--gpu", "G", "--out", str(tmp_path),
                 "--selected", "-k gemv"]) == 0
    record = json.loads((tmp_path / "G_2026-12-07_gpu-tests.json").read_text())   # the run's day, not today's
    assert record["selected"] == "-k gemv" and not record["complete"] and record["logs"] == ["gpu-tests.log"]
