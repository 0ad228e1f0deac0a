"""Online-softmax attention: tiles of queries and keys on tensor cores, split decodes, no score matrix stored."""
from .engine import Engine

__all__ = ["Engine"]
