"""Asynchronous scheduling: the host plans, packs and launches step t+1 while the GPU runs step t, and reads step
t's sampled ids back after; a persistent batch keeps each sequence's per-step numbers in arrays between steps."""
from .engine import Engine

__all__ = ["Engine"]
