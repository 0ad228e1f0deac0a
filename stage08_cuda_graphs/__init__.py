"""CUDA graphs: a decode step's kernels captured once per batch size and replayed with one launch, and the kernels
measured one by one against their floors."""
from .engine import Engine

__all__ = ["Engine"]
