"""Prefix caching: a full block of the KV cache is named by a hash of its tokens and every token before it, and a
request whose prompt begins with blocks an earlier one computed takes them and computes only the rest."""
from .engine import Engine

__all__ = ["Engine"]
