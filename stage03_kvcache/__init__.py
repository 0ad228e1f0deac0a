"""A contiguous KV cache, so prefill runs once and each decode step computes one token."""
from .engine import Engine

__all__ = ["Engine"]
