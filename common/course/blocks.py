"""Generated blocks in Markdown: the text between `<!-- generated:NAME -->` and `<!-- end:NAME -->` is what the
generator NAME returns (a function of no arguments returning Markdown), rewritten on every render, so tables and
counts come from code and committed results, never from typing.

    render(text, generators, where)             every block, each by its generator (an unknown NAME is an error)
    render(text, generators, where, only=True)  the blocks whose generator is given; the others as they are

A chapter also owns one-line fields that generators elsewhere read, as `<!-- NAME: value -->` on a line of its own
(hidden when the Markdown is rendered): field(text, NAME) is the value, or None where the line is absent.
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


def field(text: str, name: str) -> str | None:
    """The value of the chapter's `<!-- NAME: value -->` line (one line; the first, if there are more), or None."""
    m = re.search(rf"^<!-- {re.escape(name)}: (.+?) -->$", text, re.M)
    return m.group(1).strip() if m else None


def count(text: str) -> int:
    """The generated blocks in a text."""
    return len(BLOCK.findall(text))
