import re
from pathlib import Path

import pytest

from common.course import readme


def test_generated_readme_blocks_are_current(capsys):
    """Tables come from code and committed results: regenerate with `python -m common.readme`."""
    assert readme.main(["--check"]) == 0
    out = capsys.readouterr().out       # --check said nothing on success
    assert out.startswith("up to date: ") and f"generated blocks in {len(readme.readmes())} READMEs" in out, out


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--chek"], 2)])
def test_help_and_a_typo_write_nothing(argv, code, capsys, monkeypatch):
    """Any argument but --check was taken as "regenerate": --help rewrote every stale README."""
    stale = Path(__file__).parents[1] / "README.md"
    monkeypatch.setattr(readme, "render", lambda text, path: text + "stale")
    monkeypatch.setattr(readme, "readmes", lambda: [stale])
    written = []
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: written.append(self))
    with pytest.raises(SystemExit) as exit_:
        readme.main(argv)
    assert exit_.value.code == code and written == []
    if code:
        err = capsys.readouterr().err
        assert err.splitlines()[-1] == "python -m common.readme: error: unrecognized arguments: --chek", err


def test_every_stage_readme_has_its_chapter_parts():
    for path in (p for p in readme.readmes() if p.parent.name.startswith("stage")):
        text = path.read_text()
        for part in ("```lineage", "diff -ru", "## Measured", "## Caveats"):
            assert part in text, f"{path} lacks {part!r}"


NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


def test_package_description_counts_no_stages_it_lacks():
    """pyproject's description said "seven stages" with eight in the tree: a count there must be the tree's."""
    text = (readme.ROOT / "pyproject.toml").read_text()
    description = re.search(r'^description = "(.*)"$', text, re.M).group(1).lower()
    stages = len(list(readme.ROOT.glob("stage[0-9][0-9]_*/__init__.py")))
    counts = [w for w in re.findall(r"\b(\w+) stages\b", description) if w in NUMBERS or w.isdigit()]
    assert all(w in (NUMBERS[stages], str(stages)) for w in counts), (description, f"{stages} stages in the tree")
