"""Continuous batching: requests join and leave at every step, each forward planned anew, prompts in chunks."""
from .engine import Engine

__all__ = ["Engine"]
