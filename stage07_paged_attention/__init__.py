"""Paged attention: the KV cache as a pool of fixed-size blocks, block tables, admission by blocks and preemption
by recompute."""
from .engine import Engine

__all__ = ["Engine"]
