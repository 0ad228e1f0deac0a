"""The front page's status of each stage is generated: its GPU tests from the newest committed summary of a GPU
test run (`benchmarks/results/<GPU>_<date>_gpu-tests.json`), what it is short of from the one line its chapter
owns (`<!-- short-of: ... -->` under "## Caveats"); the tables read only the result files git tracks, and CI runs
the README's test line as written."""
import json
import re
import shutil
import subprocess

import pytest

from common.course import blocks, readme, results

ROOT = readme.ROOT


def summary(folder, name, commit, stages):
    (folder / name).write_text(json.dumps({"commit": commit, "stages": stages}))


def test_each_stage_shows_its_newest_summary_or_not_yet_run(tmp_path, monkeypatch):
    monkeypatch.setattr(readme, "RESULTS", tmp_path)
    summary(tmp_path, "NVIDIA-H100-80GB-HBM3_2026-12-07_gpu-tests.json", "1111111aaaa", {
        "stage01_loading": {"passed": 10, "failed": 0, "skipped": 2},
        "stage02_forward": {"passed": 20, "failed": 0, "skipped": 0}})
    summary(tmp_path, "NVIDIA-H200_2026-12-08_gpu-tests.json", "2222222bbbb", {
        "stage02_forward": {"passed": 19, "failed": 1, "skipped": 0}, "tests": {"passed": 5}})
    table = readme.stage_status()
    rows = {line.split(" | ")[0].split("`")[1]: line.split(" | ")[1] for line in table.splitlines()
            if line.startswith("| [`stage")}
    assert rows["stage01_loading"] == "10 passed, 2 skipped; NVIDIA H100 80GB HBM3, 2026-12-07, `1111111`"
    assert rows["stage02_forward"] == "19 passed, **1 failed**; NVIDIA H200, 2026-12-08, `2222222`"   # newer
    assert rows["stage03_kvcache"] == "no summary yet"
    assert set(rows) == {s.name for s in readme.stages()}
    assert "`NVIDIA-H100-80GB-HBM3_2026-12-07_gpu-tests.json`, `NVIDIA-H200_2026-12-08_gpu-tests.json`" in table


def test_without_a_summary_every_stage_is_not_yet_run(tmp_path, monkeypatch):
    monkeypatch.setattr(readme, "RESULTS", tmp_path)
    table = readme.stage_status()
    assert table.count("| no summary yet |") == len(readme.stages()) and "no summary committed yet" in table


@pytest.mark.parametrize("stage", readme.stages(), ids=lambda s: s.name)
def test_every_chapter_owns_one_short_of_line_under_its_caveats(stage):
    text = (stage / "README.md").read_text()
    assert len(re.findall(r"^<!-- short-of: .+ -->$", text, re.M)) == 1, f"{stage.name}: one short-of line"
    lines = text.splitlines()
    assert lines[lines.index("## Caveats") + 1].startswith("<!-- short-of: "), "right under ## Caveats"
    assert readme.short_of(stage) == blocks.field(text, "short-of")


def test_a_chapter_without_the_line_is_named(tmp_path):
    (tmp_path / "stage99_x").mkdir()
    (tmp_path / "stage99_x" / "README.md").write_text("# Stage 99: x\n\n## Caveats\n\n* none\n")
    with pytest.raises(ValueError, match="stage99_x/README.md has no `<!-- short-of: ... -->` line"):
        readme.short_of(tmp_path / "stage99_x")


def test_field_reads_a_whole_line_only():
    text = "a <!-- short-of: inline --> b\n<!-- short-of: the value -->\n<!-- generated:x -->\n"
    assert blocks.field(text, "short-of") == "the value" and blocks.field(text, "lineage") is None


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_only_tracked_result_files_count(tmp_path):
    """A run copied into the results folder and not yet added changes no table; outside a checkout all count."""
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json").write_text("{}")
    assert [p.name for p in results.committed(tmp_path)] == ["a.json", "b.json"]      # not a git checkout
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "a.json"], cwd=tmp_path, check=True)
    assert [p.name for p in results.committed(tmp_path)] == ["a.json"]
    assert results.untracked(tmp_path) == ["b.json"]


def test_ci_runs_the_readme_s_test_line_verbatim():
    """The README's Quick start installs the extras CI does and runs the tests as CI does: one command for both."""
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    [line] = [x for x in quick.splitlines() if "python -m pytest" in x]
    command = line.split("  #")[0].rstrip()
    assert command == 'pip install -e ".[dev,ref,serve]" && python -m pytest', command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci, ".ci/run runs another command than the README's"
    assert "--index-url https://download.pytorch.org/whl/cpu" in quick      # the CPU torch note, as .ci/run has it
