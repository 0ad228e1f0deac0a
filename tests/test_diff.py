"""CPU tier: common.diff, the reader's diff between two stages. Its table and diff of the code alone on two fake
stage folders; its counts against a shortest edit script worked out by brute force and against `diff -ruN
--minimal` where GNU diff is installed; its diff applied with `patch`; the real 07 -> 08 pair against stage08's
lineage list; and bad input, one line and exit 2."""
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.course.diff import ROOT, MinimalMatcher, main, report
from common.testing import for_each_seed, seed_ranges

ENGINE_OLD = "".join(f"line {i}\n" for i in range(12))
ENGINE_NEW = ENGINE_OLD.replace("line 2\n", "line two\n").replace("line 9\n", "line 9\nline 9.5\n")
OLD = {
    "engine.py": ENGINE_OLD,                                   # changed: one line replaced, one added
    "rope.cu": "rotate\nhalves\n",                             # removed
    "tail.py": "a\nb",                                         # changed, no newline at the end of either
    "README.md": "# chapter\n",                                # the chapter, its tables, tests, benchmarks:
    "chapter.py": "A = 1\n",                                   # changed, left out
    "tests/test_engine.py": "def test(): pass\n",
    "bench_load.py": "x = 1\n",
    "blob.bin": "\0\1",                                        # not text
    "__pycache__/engine.cpython-311.pyc": "\0",
}
NEW = {
    "engine.py": ENGINE_NEW,
    "kernels/graphs.cu": "capture\nreplay\nlaunch\n",         # new
    "tail.py": "a\nc",
    "README.md": "# chapter, rewritten\n",
    "chapter.py": "A = 2\n",
    "tests/test_engine.py": "def test(): assert True\n",
    "bench_load.py": "x = 2\n",
    "blob.bin": "\0\2",
    "__pycache__/engine.cpython-311.pyc": "\1",
}


def write_stage(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(text.encode())
    return folder


@pytest.fixture
def stages(tmp_path):
    return write_stage(tmp_path / "stage01_old", OLD), write_stage(tmp_path / "stage02_new", NEW)


def plus_minus(diff_text: str) -> tuple[int, int]:
    lines = diff_text.splitlines()
    return (sum(line.startswith("+") and not line.startswith("+++ ") for line in lines),
            sum(line.startswith("-") and not line.startswith("--- ") for line in lines))


def test_the_table_lists_the_code_alone_with_its_counts_then_the_diff_of_the_same_files(stages):
    old, new = stages
    text = report(old, new)
    table, diff = text.split("\n\n", 2)[1:]
    assert table.splitlines() == [
        "file                added  removed",
        "engine.py              +2       -1",
        "kernels/graphs.cu      +3       -0  new",
        "rope.cu                +0       -2  removed",
        "tail.py                +1       -1",
        "4 files, +6 -4 lines of code",
    ]
    assert re.findall(r"^diff -ruN (\S+) (\S+)$", diff, re.M) == [
        (f"stage01_old/{f}", f"stage02_new/{f}") for f in ("engine.py", "kernels/graphs.cu", "rope.cu", "tail.py")]
    assert plus_minus(diff) == (6, 4)
    assert "@@ -0,0 +1,3 @@\n+capture\n+replay\n+launch\n" in diff
    assert "-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n" in diff
    for left_out in ("README.md", "chapter.py", "tests/", "bench_load.py", "blob.bin", "__pycache__"):
        assert left_out not in diff, left_out


def test_stat_is_the_table_alone_and_all_adds_chapter_tests_and_benchmarks(stages):
    old, new = stages
    assert report(old, new, stat=True) == report(old, new).split("\n\ndiff -ruN ")[0] + "\n"
    everything = report(old, new, everything=True, stat=True)
    for name in ("README.md", "chapter.py", "tests/test_engine.py", "bench_load.py"):
        assert re.search(rf"^{re.escape(name)} +\+1 +-1$", everything, re.M), name
    assert everything.splitlines()[-1] == "8 files, +10 -8 lines"
    assert "blob.bin" not in everything and "__pycache__" not in everything


def brute_force_edits(a: list, b: list) -> int:
    """Lines removed plus lines added by a shortest edit script: len(a) + len(b) - 2 * LCS, by dynamic
    programming (slow, and obviously right)."""
    lcs = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if a[i] == b[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    return len(a) + len(b) - 2 * lcs[0][0]


@seed_ranges(300, 5000)
def test_the_counts_are_a_shortest_edit_scripts_and_its_opcodes_rebuild_the_new_file(seeds):
    """difflib's own matcher is not minimal (on 27 of the first 300 seeds it counts more lines than needed, 12
    where 8 do on seed 17): its counts would disagree with `diff --minimal`."""
    def check(seed):
        rng = random.Random(seed)
        a = [rng.choice("abc") for _ in range(rng.randrange(12))]
        b = [rng.choice("abc") for _ in range(rng.randrange(12))]
        rebuilt, edits = [], 0
        for tag, i1, i2, j1, j2 in MinimalMatcher(None, a, b, autojunk=False).get_opcodes():
            assert tag == "equal" or a[i1:i2] != b[j1:j2]
            rebuilt += a[i1:i2] if tag == "equal" else b[j1:j2]
            edits += 0 if tag == "equal" else i2 - i1 + j2 - j1
        assert rebuilt == b, (a, b)
        assert edits == brute_force_edits(a, b), (a, b, edits)
    for_each_seed(seeds, check)


def gnu_minimal(old: Path, new: Path, *excluded: str) -> str | None:
    """`diff -ruN --minimal` of the two folders, or None where no GNU diff is installed."""
    if not shutil.which("diff"):
        return None
    args = [a for x in excluded + ("__pycache__", ".pytest_cache", "*.bin") for a in ("-x", x)]
    done = subprocess.run(["diff", "-ruN", "--minimal", *args, old.name, new.name], cwd=old.parent,
                          capture_output=True, text=True)
    return done.stdout if done.returncode in (0, 1) else None


CODE_ONLY = ("README.md", "chapter.py", "tests", "bench_*.py")


def per_file(diff_text: str) -> dict[str, tuple[int, int]]:
    """{path inside the stage: (+, -)} of a diff -ruN output, GNU's (its options and file times in the headers)
    or ours."""
    chunks = re.split(r"^diff .*\n", diff_text, flags=re.M)[1:]
    return {re.search(r"^\+\+\+ [^/\n]+/([^\t\n]+)", c, re.M).group(1): plus_minus(c) for c in chunks}


def test_the_counts_agree_with_gnu_diff_minimal_on_the_fake_pair(stages):
    old, new = stages
    for everything, excluded in ((False, CODE_ONLY), (True, ())):
        want = gnu_minimal(old, new, *excluded)
        if want is None:
            pytest.skip("no GNU diff here")
        got = report(old, new, everything)
        assert per_file(got) == per_file(want)


@pytest.mark.skipif(not shutil.which("patch"), reason="no patch here")
def test_the_diff_applied_with_patch_turns_the_old_folder_into_the_new(stages):
    old, new = stages
    diff = report(old, new, everything=True).split("\n\n", 2)[2]
    patched = shutil.copytree(old, old.parent / "alone" / old.name)     # where no new folder is beside it
    subprocess.run(["patch", "-p0", "-s", "-E"], input=diff, text=True, cwd=patched.parent, check=True)
    for name in set(OLD) | set(NEW):
        if name.endswith((".bin", ".pyc")):
            continue
        assert (patched / name).exists() == (name in NEW), name
        if name in NEW:
            assert (patched / name).read_text() == NEW[name], name


def lineage(stage: Path) -> set[str]:
    block = re.search(r"```lineage\n(.*?)```", (stage / "README.md").read_text(), re.S).group(1)
    return {line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()}


def test_the_real_07_08_table_is_code_from_stage08s_lineage_list_and_agrees_with_gnu_diff(capsys):
    main(["07", "08"])
    out = capsys.readouterr().out
    table = out.split("\n\n")[1].splitlines()
    files = {row.split()[0] for row in table[1:-1]}
    new = next(ROOT.glob("stage08_*"))
    assert files and files <= lineage(new), sorted(files - lineage(new))
    assert not {f for f in files if f.startswith("tests/") or f in ("README.md", "chapter.py")}
    added, removed = (int(n) for n in re.fullmatch(r"\d+ files, \+(\d+) -(\d+) lines of code", table[-1]).groups())
    want = gnu_minimal(next(ROOT.glob("stage07_*")), new, *CODE_ONLY)
    if want is not None:
        assert per_file(out) == per_file(want)
        assert (added, removed) == plus_minus(want)


@pytest.mark.parametrize("argv, line", [
    (["99", "08"], "common.diff: no stage 99 (the stages are 01-"),
    (["seven", "08"], "common.diff: 'seven' is not a stage number (the stages are 01-"),
    (["hf", "08"], "common.diff: 'hf' is not a stage number"),
    (["7", "07"], "common.diff: 7 and 07 are the same stage (stage07_"),
])
def test_bad_input_is_one_line_and_exit_2(argv, line, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith(line), err


def test_the_command_as_a_reader_types_it():
    done = subprocess.run([sys.executable, "-m", "common.diff", "07", "08", "--stat"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert re.search(r"^\d+ files, \+\d+ -\d+ lines of code$", done.stdout.splitlines()[-1])
    bad = subprocess.run([sys.executable, "-m", "common.diff", "07", "08", "--stats"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].endswith("unrecognized arguments: --stats")
