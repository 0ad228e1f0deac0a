"""The generated tables of this stage's chapter (README.md), from the committed results; `python -m common.readme`
renders them with the common, data-driven ones."""
from __future__ import annotations

from common.readme import split_table


def kvcache_split() -> str:
    return split_table("pytest-bench-kvcache", "cache_length", "cached positions")


GENERATORS = {"kvcache-split": kvcache_split}
