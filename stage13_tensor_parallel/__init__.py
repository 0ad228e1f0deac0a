"""Tensor parallelism: every layer's GEMMs split across N GPUs (column-parallel qkv and gate_up, row-parallel o and
down, the LM head in vocabulary slices), one process a GPU, the partial sums joined by NCCL all-reduces."""
from .engine import Engine

__all__ = ["Engine"]
