"""CUDA graphs: a decode step's kernels captured once per batch size and replayed with one launch, so the host
no longer queues them one by one."""
from .engine import Engine

__all__ = ["Engine"]
