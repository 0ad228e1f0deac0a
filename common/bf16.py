"""bfloat16 on the host, as numpy uint16 bit patterns (numpy has no bf16 dtype).

bf16 is the top half of an IEEE float32: 1 sign bit, 8 exponent bits (float32's whole range), 7 mantissa bits
(about 3 significant decimal digits). Widening is a shift; narrowing rounds to nearest, ties to even.
"""
import numpy as np

QUIET_NAN = np.uint16(0x7FC0)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bit patterns -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 values -> uint16 bit patterns, round to nearest even; NaN stays NaN."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    u = x.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds the discarded half to nearest, ties to even (in place: one
    # temporary of the matrix's size, not four).
    rounded = u >> np.uint32(16)
    rounded &= np.uint32(1)
    rounded += np.uint32(0x7FFF)
    rounded += u
    rounded >>= np.uint32(16)
    out = rounded.astype(np.uint16)
    out[np.isnan(x)] = QUIET_NAN
    return out


def round_to_bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> float32 holding exactly the nearest bf16 value (what the GPU will see)."""
    return bf16_to_f32(f32_to_bf16(values))
