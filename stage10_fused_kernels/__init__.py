"""Fused kernels: each kernel of a decode step measured against the bytes it must move, and the furthest from its
floor rewritten (16-byte norms, a one-pass greedy sampler, rope and the cache write in one kernel, a GEMV for the
few-row GEMMs, programmatic dependent launch, and the norms, rope, SwiGLU and residual adds inside the GEMV)."""
from .engine import Engine

__all__ = ["Engine"]
