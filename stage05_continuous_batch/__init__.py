"""Continuous batching (in progress): requests join and leave at every step; so far its scheduler, CPU-tested."""
from .engine import Engine

__all__ = ["Engine"]
