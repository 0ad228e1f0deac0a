"""The whole Llama forward pass in CUDA kernels and cuBLAS; generation by re-running it per token."""
from .engine import Engine

__all__ = ["Engine"]
