from common import readme


def test_generated_readme_blocks_are_current():
    """Tables come from code and committed results: regenerate with `python -m common.readme`."""
    assert readme.main(["--check"]) == 0


def test_every_stage_readme_has_its_chapter_parts():
    for path in (p for p in readme.readmes() if p.parent.name.startswith("stage")):
        text = path.read_text()
        for part in ("```lineage", "diff -ru", "## Measured", "## Caveats"):
            assert part in text, f"{path} lacks {part!r}"
