"""CPU: committed results read under today's engine names (common/course/results.py): the first harness's module names,
and the eight-stage course's stage08, whose results from before the split are stage10's."""
import json

from common.course import results


def test_a_stage08_result_from_before_the_split_is_stage10_s_and_one_after_it_is_stage08_s():
    assert results.engine_name("stage08_cuda_graphs", "2026-12-04") == "stage10_fused_kernels"
    assert results.engine_name("stage08_cuda_graphs", "2026-12-04T19:18:51+00:00") == "stage10_fused_kernels"
    assert results.engine_name("stage08_cuda_graphs", "2026-12-05") == "stage08_cuda_graphs"
    assert results.engine_name("stage07_paged_attention", "2026-12-04") == "stage07_paged_attention"
    assert results.engine_name("common.hf_engine", "2026-12-02") == "hf"


def test_load_renames_the_stages_of_a_harness_result_and_the_stage_of_a_profile(tmp_path):
    harness = {"date": "2026-12-04", "stages": {"stage07_paged_attention": {"x": 1}, "stage08_cuda_graphs": {"x": 2}}}
    profile = {"date": "2026-12-04T14:31:56+00:00", "stage": "stage08_cuda_graphs", "batch": 1}
    later = {"date": "2026-12-06", "stage": "stage08_cuda_graphs"}
    for name, r in (("h", harness), ("p", profile), ("l", later)):
        (tmp_path / f"{name}.json").write_text(json.dumps(r))
    assert results.load(tmp_path / "h.json")["stages"] == {"stage07_paged_attention": {"x": 1},
                                                           "stage10_fused_kernels": {"x": 2}}
    assert results.load(tmp_path / "p.json")["stage"] == "stage10_fused_kernels"
    assert results.load(tmp_path / "l.json")["stage"] == "stage08_cuda_graphs"
