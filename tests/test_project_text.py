"""The project's text speaks of the project alone: no run labels of the place it was built in, no issue numbers.

A label is a word like "session" or "call" glued to a number ("call" + "4", "session" + " 12"): it named a
working session or a machine command while the project was built, and means nothing to a reader. A run is named
by its date, its GPU and what ran (the log folders under benchmarks/logs/ are named so). Words that merely end
in "call", such as "recall", are no labels; a label inside an identifier, after or before an underscore, is
one. The file's own examples are built from pieces, so that this file passes its own check.
"""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
LABEL = re.compile(r"(?<![a-z])(sessions?|calls?)[ _-]?\d+", re.IGNORECASE)


def tracked_files():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the project's files are those git tracks")
    return [name for name in out.decode().split("\0") if name]


def text_of(path):
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8) or one that is gone."""
    try:
        data = path.read_bytes()
    except OSError:                                 # deleted in the working tree, not yet in the index
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def labels_in(name, text):
    """'file:line: text' for each run label in a file's path or its lines."""
    found = [f"{name}: its path" for _ in LABEL.finditer(name)][:1]
    for number, line in enumerate(text.splitlines(), 1):
        if LABEL.search(line):
            found.append(f"{name}:{number}: {line.strip()[:160]}")
    return found


@pytest.mark.parametrize("text, labels", [
    ("measured in " + "sess" + "ion12 " + "ca" + "ll3", 1),
    ("Sess" + "ion 9's logs", 1),
    ("lo" + "gs/2026-12-04-H200-" + "sess" + "ion12/" + "ca" + "ll4", 1),
    ("the " + "_ca" + "ll5 helper and " + "ca" + "ll5_time", 1),
    ("ca" + "lls 2-4 and " + "sess" + "ions 9-10", 1),
    ("top-1 recall 5 times, recall2, a call to step(), 991 calls, 3 ms each, syscall3", 0),
    ("a session of 2 users; 3 calls", 0),
])
def test_the_label_pattern_flags_labels_and_leaves_words(text, labels):
    assert len(labels_in("x.md", text)) == labels


def test_no_tracked_text_file_carries_a_run_label():
    found = []
    for name in tracked_files():
        text = text_of(ROOT / name)
        found += labels_in(name, text if text is not None else "")
    assert not found, "run labels (name the run by date, GPU and what ran):\n" + "\n".join(found)


ISSUE = re.compile(r"\bissues? \d+|\bthe issue(?:'s| asks| wants| says)\b", re.IGNORECASE)


@pytest.mark.parametrize("text, hits", [
    ("as " + "iss" + "ue 35 said", 1),
    ("where the " + "iss" + "ue asks 3x", 1),
    ("the issue slots busy 45% (ncu)", 0),
])
def test_the_issue_pattern_flags_tickets_and_leaves_words(text, hits):
    assert len(ISSUE.findall(text)) == hits


def test_no_tracked_text_file_names_an_issue_by_number():
    """The work was planned as numbered issues of a tracker the reader never sees: a chapter says what a stage set
    out to do, not which ticket asked for it (by number, or as what "the issue" asks)."""
    found = [f"{name}:{number}: {line.strip()[:160]}" for name in tracked_files()
             for number, line in enumerate((text_of(ROOT / name) or "").splitlines(), 1) if ISSUE.search(line)]
    assert not found, "issue numbers:\n" + "\n".join(found)


LOG_FOLDER = re.compile(r"\blogs/(\d{4}-\d{2}-\d{2}-[A-Za-z0-9-]+)")


def test_every_log_folder_the_text_cites_exists():
    """A chapter or note that cites `benchmarks/logs/DATE-GPU-WHAT/` names a folder that is there."""
    logs = ROOT / "benchmarks" / "logs"
    missing = []
    for name in tracked_files():
        text = text_of(ROOT / name) or ""
        for number, line in enumerate(text.splitlines(), 1):
            missing += [f"{name}:{number}: logs/{m}" for m in LOG_FOLDER.findall(line) if not (logs / m).is_dir()]
    assert not missing, "cited log folders that do not exist:\n" + "\n".join(missing)
