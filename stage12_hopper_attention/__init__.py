"""Hopper attention: prompt tiles on warpgroup MMA (wgmma) with their K/V tiles brought by the tensor memory
accelerator (TMA) into a ring of shared-memory stages, mbarriers between a producer and two or three consumer
warpgroups (sm_90a); other GPUs keep the mma.sync kernel."""
from .engine import Engine

__all__ = ["Engine"]
