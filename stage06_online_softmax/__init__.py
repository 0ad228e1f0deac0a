"""Online-softmax attention: keys a tile at a time, no score matrix stored; context bounded by the KV cache only."""
from .engine import Engine

__all__ = ["Engine"]
