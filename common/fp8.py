"""FP8 e4m3 on the host, as numpy uint8 bit patterns (numpy has no fp8 dtype): the reference the FP8 weights'
quantizer and kernels are checked against.

e4m3 ("fn": finite, no infinities) is 1 sign bit, 4 exponent bits (bias 7) and 3 mantissa bits:

    exponent 1..15   (1 + m / 8) * 2^(e - 7)     normals, 2^-6 .. 448 (S.1111.111 is NaN: 1.75 * 2^8 is the top)
    exponent 0       (m / 8) * 2^-6              subnormals, 2^-9 .. 7 * 2^-9, and zero

Narrowing rounds to nearest, ties to even, and saturates: a value past 448 (an infinity too) becomes +-448, as
vLLM clamps before its cast, since a scaled weight just past the top is a rounding artefact, not an overflow to
report. NaN stays NaN (0x7F, with its sign).

A weight matrix is stored as e4m3 with float32 scales, w ~ scale * decode(q): one scale a row (per output
channel, compressed-tensors' `weight_scale`), or one a 128 x 128 block (the fine-grained layout's
`weight_scale_inv`). Each scale is amax / 448 over its row or block, so the largest |w| there lands on 448.
"""
from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
MIN_NORMAL = 2.0 ** -6
NAN = np.uint8(0x7F)


def e4m3_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint8 bit patterns -> float32 values (exact; 0x7F and 0xFF are NaN)."""
    b = np.asarray(bits, dtype=np.uint8).astype(np.int32)
    e, m = (b >> 3) & 0xF, (b & 7).astype(np.float32)
    value = np.where(e == 0, m / 8 * np.float32(MIN_NORMAL),
                     (1 + m / 8) * np.exp2(e.astype(np.float32) - 7)).astype(np.float32)
    value[(b & 0x7F) == 0x7F] = np.nan
    return np.where(b & 0x80, -value, value).astype(np.float32)


def f32_to_e4m3(values: np.ndarray) -> np.ndarray:
    """float32 values -> uint8 bit patterns: round to nearest even, saturating at +-448; NaN stays NaN."""
    x = np.asarray(values, dtype=np.float32)
    nan = np.isnan(x)
    a = np.where(nan, np.float32(0), np.minimum(np.abs(x), np.float32(E4M3_MAX)))   # saturate (an infinity too)
    # normals: round float32's 23 mantissa bits to 3, ties to even (the carry may step the exponent up), then
    # rebias the exponent from float32's 127 to e4m3's 7: (e32 << 3 | m3) - (120 << 3)
    u = np.ascontiguousarray(a).view(np.uint32)
    rounded = u >> np.uint32(20)
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFFF)
    rounded += u
    rounded >>= np.uint32(20)
    normal = rounded.astype(np.int64) - (120 << 3)
    # subnormals: whole multiples of 2^-9, ties to even (8 of them is 2^-6, the first normal's code)
    sub = np.rint(a * np.float32(2.0 ** 9)).astype(np.int64)
    code = np.where(a < np.float32(MIN_NORMAL), sub, normal)
    code = np.where(nan, int(NAN), code).astype(np.uint8)
    return code | (np.signbit(x).astype(np.uint8) << np.uint8(7))


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) float -> ((N, K) e4m3 bits, (N,) float32 scales): one scale a row (per output channel)."""
    w = np.asarray(w, dtype=np.float32)
    scale = _scales(np.abs(w).max(axis=1))
    return f32_to_e4m3(w / scale[:, None]), scale


def quantize_blocks(w: np.ndarray, block: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) float -> ((N, K) e4m3 bits, (ceil(N / block), ceil(K / block)) float32 scales): one scale a
    block x block tile, the last row and column of tiles cut short where N or K is not a multiple of block."""
    w = np.asarray(w, dtype=np.float32)
    N, K = w.shape
    nb, kb = -(-N // block), -(-K // block)
    padded = np.zeros((nb * block, kb * block), np.float32)
    padded[:N, :K] = np.abs(w)
    scale = _scales(padded.reshape(nb, block, kb, block).max(axis=(1, 3)))
    return f32_to_e4m3(w / expand_blocks(scale, N, K, block)), scale


def expand_blocks(scale: np.ndarray, N: int, K: int, block: int = 128) -> np.ndarray:
    """(nb, kb) block scales -> (N, K): each element's scale."""
    return np.repeat(np.repeat(scale, block, axis=0), block, axis=1)[:N, :K]


def dequantize(bits: np.ndarray, scale: np.ndarray, block: int = 128) -> np.ndarray:
    """e4m3 bits and their scales (per row (N,), or per block (nb, kb)) -> (N, K) float32."""
    q = e4m3_to_f32(bits)
    if scale.ndim == 1:
        return q * scale[:, None]
    return q * expand_blocks(scale, *q.shape, block)


def _scales(amax: np.ndarray) -> np.ndarray:
    """amax / 448, with an all-zero row or block given scale 1 (its codes are all zero whatever the scale)."""
    amax = np.asarray(amax, np.float32)
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
