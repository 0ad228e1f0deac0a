"""Generated blocks in Markdown: the text between `<!-- generated:NAME -->` and `<!-- end:NAME -->` is what the
generator NAME returns (a function of no arguments returning Markdown), rewritten on every render, so tables and
counts come from code and committed results, never from typing.

    render(text, generators, where)             every block, each by its generator (an unknown NAME is an error)
    render(text, generators, where, only=True)  the blocks whose generator is given; the others as they are
"""
from __future__ import annotations

import re
from typing import Callable

BLOCK = re.compile(r"(<!-- generated:([\w-]+) -->\n)(.*?)(<!-- end:\2 -->)", re.S)


def render(text: str, generators: dict[str, Callable[[], str]], where: str, only: bool = False) -> str:
    def block(m):
        if m.group(2) not in generators:
            if only:
                return m.group(0)
            raise KeyError(f"{where}: no generator {m.group(2)!r} (common/course/readme.py or the stage's chapter.py)")
        return m.group(1) + generators[m.group(2)]() + "\n" + m.group(4)

    return BLOCK.sub(block, text)


def count(text: str) -> int:
    """The generated blocks in a text."""
    return len(BLOCK.findall(text))
