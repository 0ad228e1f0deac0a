"""RoPE frequencies and angles, with Llama 3's frequency scaling: the one table the reference and every stage share.

Position p rotates the pair (x_i, x_{i+hd/2}) of every q and k head by the angle p * theta_i.
"""
from __future__ import annotations

import numpy as np

from common.config import LlamaConfig


def rope_inv_freq(cfg: LlamaConfig) -> np.ndarray:
    """theta_i = rope_theta^(-2i/hd), i < hd/2, with Llama 3 scaling: wavelengths longer than
    original_max/low_freq_factor are divided by `factor`, shorter than original_max/high_freq_factor kept,
    and a linear ramp (in 1/wavelength) between."""
    hd = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    r = cfg.rope_scaling
    if r is None:
        return inv
    wavelen = 2 * np.pi / inv
    low_wavelen = r.original_max_position_embeddings / r.low_freq_factor
    high_wavelen = r.original_max_position_embeddings / r.high_freq_factor
    scaled = np.where(wavelen > low_wavelen, inv / r.factor, inv)
    smooth = ((r.original_max_position_embeddings / wavelen - r.low_freq_factor)
              / (r.high_freq_factor - r.low_freq_factor))
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, (1 - smooth) * scaled / r.factor + smooth * scaled, scaled)


def rope_cos_sin(cfg: LlamaConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    angles = np.outer(positions, rope_inv_freq(cfg))                  # (T, hd/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
