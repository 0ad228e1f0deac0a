"""Asynchronous scheduling: the host plans, packs and launches step t+1 while the GPU runs step t, and reads step
t's sampled ids back after."""
from .engine import Engine

__all__ = ["Engine"]
