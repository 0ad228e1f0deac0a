"""Static batching, so one decode step reads the weights once for up to max_batch_size sequences."""
from .engine import Engine

__all__ = ["Engine"]
