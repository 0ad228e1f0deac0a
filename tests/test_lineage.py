"""Each stage is a copy of the previous one plus one idea. Its README names, in a ```lineage block, exactly the
files it adds, changes or removes against the previous stage (the first stage: all of its files). A fix that
reached one copy but not the next shows up here as an unlisted difference. A stage's files never name their own
stage (tests reach it through relative imports), so a copy stays byte-identical unless the idea changes it."""
import filecmp
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(p for p in ROOT.glob("stage[0-9][0-9]_*") if p.is_dir())
SKIP = {"__pycache__", ".pytest_cache", ".benchmarks"}
STAGE_NAME = re.compile(rb"stage[0-9][0-9](_[a-z0-9]+)*")   # stage05, stage05_continuous_batch


def stage_files(stage: Path) -> set[str]:
    return {str(p.relative_to(stage)) for p in stage.rglob("*")
            if p.is_file() and not SKIP & set(p.relative_to(stage).parts) and p.suffix != ".pyc"}


def listed(stage: Path) -> set[str]:
    text = (stage / "README.md").read_text()
    m = re.search(r"```lineage\n(.*?)```", text, re.S)
    assert m, f"{stage.name}/README.md has no ```lineage block"
    return {line.split("#")[0].strip() for line in m.group(1).splitlines() if line.split("#")[0].strip()}


def test_the_stages_are_numbered_from_01_without_a_gap():
    """Each stage is compared with the one before it in this list: a missing number would compare it with the
    wrong one (and an empty list would make every test below vacuous)."""
    assert STAGES and STAGES[0].name == "stage01_loading"
    assert [int(s.name[5:7]) for s in STAGES] == list(range(1, len(STAGES) + 1)), [s.name for s in STAGES]


@pytest.mark.parametrize("index", range(len(STAGES)), ids=[s.name for s in STAGES])
def test_lineage_list_is_exactly_the_difference(index):
    stage = STAGES[index]
    files = stage_files(stage)
    if index == 0:
        changed = files
    else:
        prev = STAGES[index - 1]
        before = stage_files(prev)
        changed = (files ^ before) | {f for f in files & before
                                      if not filecmp.cmp(stage / f, prev / f, shallow=False)}
    assert listed(stage) == changed, (f"{stage.name}: listed but unchanged {sorted(listed(stage) - changed)}; "
                                      f"changed but unlisted {sorted(changed - listed(stage))}")


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_stage_never_imports_another_stage(stage):
    for py in stage.rglob("*.py"):
        for other in STAGES:
            if other != stage:
                assert not re.search(rf"^\s*(from|import)\s+{other.name}\b", py.read_text(), re.M), \
                    f"{py.relative_to(ROOT)} imports {other.name}"


def without_stage_names(text: bytes) -> bytes:
    return STAGE_NAME.sub(b"stageNN", text)


@pytest.mark.parametrize("index", range(1, len(STAGES)), ids=[s.name for s in STAGES[1:]])
def test_no_file_differs_only_by_the_stages_it_names(index):
    """A copy that differs from the one before only in which stages it names (stage04_static_batch where the one
    before says stage03_kvcache, say) has no idea of its own in it: it should stay identical. Every stage name is
    blanked, not only the stage's own: a file never names its own stage (the test below), so blanking that
    alone would leave every pair of files as it was."""
    stage, prev = STAGES[index], STAGES[index - 1]
    for f in sorted(stage_files(stage) & stage_files(prev)):
        a, b = (stage / f).read_bytes(), (prev / f).read_bytes()
        assert a == b or without_stage_names(a) != without_stage_names(b), \
            f"{stage.name}/{f} differs from {prev.name}/{f} only in the stage names it holds"


@pytest.mark.parametrize("stage", STAGES, ids=[s.name for s in STAGES])
def test_no_file_names_its_own_stage(stage):
    for f in sorted(stage_files(stage) - {"README.md"}):
        text = (stage / f).read_text(errors="replace")
        assert stage.name not in text, f"{stage.name}/{f} names its own stage (use a relative import or 'this stage')"
