"""Every chapter is written for a reader and fits a sitting: at most 350 lines (stage02, which carries most of
the syllabus, 400), the server's too. A chapter that grows past it has started keeping a lab notebook: the
history of attempts belongs in its short "What was tried and what it gave" list, the figures in generated
tables."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [*sorted(ROOT.glob("stage[0-9][0-9]_*/README.md")), ROOT / "common" / "serve" / "README.md"]
LONGER = {"stage02_forward": 400}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.parent.name for c in CHAPTERS])
def test_chapter_fits_its_length(chapter):
    limit = LONGER.get(chapter.parent.name, 350)
    lines = len(chapter.read_text().splitlines())
    assert lines <= limit, f"{chapter.relative_to(ROOT)}: {lines} lines, past {limit}"


def test_every_stage_has_a_chapter():
    stages = sorted(p for p in ROOT.glob("stage[0-9][0-9]_*") if (p / "__init__.py").exists())
    assert stages and all((s / "README.md").exists() for s in stages)
