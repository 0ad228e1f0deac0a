"""A reader's diff between two stages: the idea's code alone, a table of its files first.

    python -m common.diff 07 08          # the table, then the unified diff of the code
    python -m common.diff 07 08 --stat   # the table only
    python -m common.diff 07 08 --all    # the chapter, chapter.py, tests and benchmarks too

`diff -ru` shows everything that differs, and from stage05 on most of it is the chapter, its generated tables,
the tests and the benchmarks. This prints what `diff -ruN` prints for the code alone: README.md, chapter.py,
tests/ and bench_*.py are left out, as are caches and files that are not text (kernels/*.cu and *.cuh are code).

The diff is a shortest one (Myers' algorithm), so its line counts are those of `diff -ruN --minimal` on the same
files; plain `diff` trades minimality for speed on some files and may show a few more lines there. Headers name
the stage folders as `diff -ruN` does, without the file times, so the output can be fed to `patch -p0`.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from common.bench.harness import UnknownEngine, stage_module

ROOT = Path(__file__).resolve().parents[2]
CACHES = {"__pycache__", ".pytest_cache", ".benchmarks"}
LEFT_OUT = "README.md, chapter.py, tests/ and bench_*.py"
CONTEXT = 3                                     # lines of context around a change, as diff -u


def is_code(rel: PurePosixPath) -> bool:
    """What the reader's diff keeps without --all: no chapter, no chapter tables, no tests, no benchmarks."""
    return not (rel.parts[0] == "tests" or rel.name in ("README.md", "chapter.py") or fnmatch(rel.name, "bench_*.py"))


def stage_files(stage: Path, everything: bool) -> set[PurePosixPath]:
    files = {PurePosixPath(p.relative_to(stage).as_posix()) for p in stage.rglob("*") if p.is_file()}
    return {f for f in files if not CACHES & set(f.parts) and f.suffix != ".pyc" and (everything or is_code(f))}


def read_lines(path: Path) -> list[str] | None:
    """The file's lines split on "\\n" alone, as diff splits them (str.splitlines would also split on a form feed);
    None for a file that is not UTF-8 text. A missing file reads as empty, as under diff -N."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


# ------------------------------------------------------------------------------------------ a shortest edit script
def shortest_edit_matches(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """The (i, j) pairs a[i] == b[j] that a shortest edit script keeps (Myers 1986, greedy forward with a trace).
    difflib's own matcher is not minimal, so its counts would disagree with `diff --minimal` on some files."""
    n, m = len(a), len(b)
    v, trace = {1: 0}, []
    for d in range(n + m + 1):
        trace.append(dict(v))
        for k in range(-d, d + 1, 2):
            x = v[k + 1] if k == -d or (k != d and v[k - 1] < v[k + 1]) else v[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x, y = x + 1, y + 1
            v[k] = x
            if x >= n and y >= m:
                return backtrack(trace, n, m)
    raise AssertionError("unreachable: d = n + m always reaches the end")


def backtrack(trace: list[dict[int, int]], x: int, y: int) -> list[tuple[int, int]]:
    """Walk the trace from the end back to (0, 0), collecting each diagonal (matched) step."""
    pairs = []
    for d in range(len(trace) - 1, -1, -1):
        v, k = trace[d], x - y
        prev_k = k + 1 if k == -d or (k != d and v[k - 1] < v[k + 1]) else k - 1
        prev_x = v[prev_k]
        prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:
            x, y = x - 1, y - 1
            pairs.append((x, y))
        x, y = prev_x, prev_y
    return pairs[::-1]


class MinimalMatcher(difflib.SequenceMatcher):
    """difflib's matcher with a shortest edit script's matches: its opcodes and hunk grouping stay difflib's."""

    def get_matching_blocks(self):
        if self.matching_blocks is None:
            a, b = self.a, self.b
            start = 0                                     # the common head and tail match outright
            while start < min(len(a), len(b)) and a[start] == b[start]:
                start += 1
            tail = 0
            while tail < min(len(a), len(b)) - start and a[-1 - tail] == b[-1 - tail]:
                tail += 1
            middle = shortest_edit_matches(a[start:len(a) - tail], b[start:len(b) - tail])
            pairs = [(i, i) for i in range(start)] + [(start + i, start + j) for i, j in middle] \
                + [(len(a) - tail + t, len(b) - tail + t) for t in range(tail)]
            blocks: list[list[int]] = []
            for i, j in pairs:
                if blocks and blocks[-1][0] + blocks[-1][2] == i and blocks[-1][1] + blocks[-1][2] == j:
                    blocks[-1][2] += 1
                else:
                    blocks.append([i, j, 1])
            self.matching_blocks = [tuple(blk) for blk in blocks] + [(len(a), len(b), 0)]
        return self.matching_blocks


# --------------------------------------------------------------------------------------------------- one file's diff
@dataclass
class FileDiff:
    path: PurePosixPath
    status: str                                     # "new", "removed" or "" (changed)
    added: int = 0
    removed: int = 0
    lines: list[str] = field(default_factory=list)  # its part of the unified diff, headers included


def unified_range(start: int, stop: int) -> str:
    """A hunk's range as diff -u writes it: "5" for one line, "4,0" for none after line 4."""
    length = stop - start
    return str(start + 1) if length == 1 else f"{start + (length > 0)},{length}"


def file_diff(old: Path, new: Path, rel: PurePosixPath) -> FileDiff | None:
    """rel's diff between the two stage folders; None when it is the same in both or is not text."""
    a, b = read_lines(old / rel), read_lines(new / rel)
    if a is None or b is None or a == b:
        return None
    status = "new" if not (old / rel).exists() else "removed" if not (new / rel).exists() else ""
    out = FileDiff(rel, status)
    names = f"{old.name}/{rel}", f"{new.name}/{rel}"
    out.lines = [f"diff -ruN {names[0]} {names[1]}\n", f"--- {names[0]}\n", f"+++ {names[1]}\n"]
    for group in MinimalMatcher(None, a, b, autojunk=False).get_grouped_opcodes(CONTEXT):
        out.lines.append(f"@@ -{unified_range(group[0][1], group[-1][2])} "
                         f"+{unified_range(group[0][3], group[-1][4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.lines += [" " + line for line in a[i1:i2]]
                continue
            out.lines += ["-" + line for line in a[i1:i2]] + ["+" + line for line in b[j1:j2]]
            out.removed, out.added = out.removed + i2 - i1, out.added + j2 - j1
    out.lines = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out.lines]
    return out


def compare(old: Path, new: Path, everything: bool = False) -> list[FileDiff]:
    """Every file that differs between the two folders (the code alone unless everything), in diff -r's order."""
    files = sorted(stage_files(old, everything) | stage_files(new, everything), key=lambda f: f.parts)
    return [d for d in (file_diff(old, new, f) for f in files) if d is not None]


def table(diffs: list[FileDiff], old: Path, new: Path, everything: bool) -> str:
    what = "every text file" if everything else f"the code alone ({LEFT_OUT} left out; --all shows them)"
    width = max([len(str(d.path)) for d in diffs] + [4])
    rows = [f"{old.name} -> {new.name}: {what}", "", f"{'file':<{width}}  {'added':>6}  {'removed':>7}"]
    rows += [f"{str(d.path):<{width}}  {'+' + str(d.added):>6}  {'-' + str(d.removed):>7}  {d.status}".rstrip()
             for d in diffs]
    added, removed = sum(d.added for d in diffs), sum(d.removed for d in diffs)
    rows.append(f"{len(diffs)} files, +{added} -{removed} lines{'' if everything else ' of code'}")
    return "\n".join(rows) + "\n"


def report(old: Path, new: Path, everything: bool = False, stat: bool = False) -> str:
    """What the command prints: the table, then (unless stat) the unified diff of the same files."""
    diffs = compare(old, new, everything)
    text = table(diffs, old, new, everything)
    return text if stat or not diffs else text + "\n" + "".join(line for d in diffs for line in d.lines)


# ------------------------------------------------------------------------------------------------------ the command
def stage_dir(tag: str) -> Path:
    """The stage folder a number names, through the benchmark harness's own lookup; SystemExit with one line."""
    stages = sorted(p.name[5:7] for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "__init__.py").exists())
    known = f"the stages are {stages[0]}-{stages[-1]}" if stages else f"there is no stage in {ROOT}"
    if not re.fullmatch(r"[0-9]+", tag):
        raise SystemExit(f"common.diff: {tag!r} is not a stage number ({known})")
    try:
        return ROOT / stage_module(tag)
    except UnknownEngine:
        raise SystemExit(f"common.diff: no stage {tag} ({known})") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m common.diff", description=__doc__.split("\n")[0])
    parser.add_argument("old", help="the earlier stage's number, e.g. 07")
    parser.add_argument("new", help="the later stage's number, e.g. 08")
    parser.add_argument("--stat", action="store_true", help="the table of files and line counts only")
    parser.add_argument("--all", action="store_true", dest="everything",
                        help=f"every text file: {LEFT_OUT} too")
    args = parser.parse_args(argv)
    try:
        old, new = stage_dir(args.old), stage_dir(args.new)
    except SystemExit as e:
        parser.exit(2, f"{e}\n")
    if old == new:
        parser.exit(2, f"common.diff: {args.old} and {args.new} are the same stage ({old.name}); "
                       f"give two, e.g. 07 08\n")
    try:
        sys.stdout.write(report(old, new, args.everything, args.stat))
        sys.stdout.flush()
    except BrokenPipeError:             # `| head` closed the pipe: what was wanted was read; no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
