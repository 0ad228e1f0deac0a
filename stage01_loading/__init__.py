"""A Hugging Face checkpoint onto the GPU, validated; the first kernel (embedding gather)."""
from .engine import Engine

__all__ = ["Engine"]
