"""Tensor parallelism: every layer's GEMMs split across N GPUs (column-parallel qkv and gate_up, row-parallel o and
down, the vocabulary in slices), the partial sums joined by all-reduces. Begun: the split and its proof on the CPU;
the engine is still stage12's."""
from .engine import Engine

__all__ = ["Engine"]
