"""common/fp8.py: e4m3 on the host, against its definition, against torch's float8_e4m3fn where torch exists, and
the per-row and per-block quantizers on shapes that are not multiples of the block."""
import numpy as np
import pytest

from common.fp8 import (E4M3_MAX, dequantize, e4m3_to_f32, f32_to_e4m3, quantize_blocks, quantize_rows)

CODES = np.arange(256, dtype=np.uint8)
FINITE = CODES[(CODES & 0x7F) != 0x7F]


def test_every_code_decodes_to_its_definition_and_encodes_back():
    v = e4m3_to_f32(CODES)
    for b in FINITE.tolist():
        s, e, m = b >> 7, (b >> 3) & 0xF, b & 7
        want = (-1) ** s * ((m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
        assert v[b] == want and np.signbit(v[b]) == bool(s), f"code {b:#04x}: {v[b]} != {want}"
    assert np.isnan(v[[0x7F, 0xFF]]).all()
    np.testing.assert_array_equal(f32_to_e4m3(v[FINITE]), FINITE)        # -0.0 back to 0x80 too
    assert v[0x7E] == E4M3_MAX and v[0x01] == 2.0 ** -9


def test_halfway_values_round_to_the_even_code_and_the_rest_to_the_nearest():
    v = e4m3_to_f32(CODES[:0x7F]).astype(np.float64)         # 0 .. 448, ascending
    for lo in range(0x7E):
        mid = np.float32((v[lo] + v[lo + 1]) / 2)                # exact in float32: one bit more than e4m3
        even = lo if lo % 2 == 0 else lo + 1
        assert f32_to_e4m3(mid) == even, f"halfway above code {lo:#04x}"
        assert f32_to_e4m3(np.nextafter(mid, np.float32(0))) == lo
        assert f32_to_e4m3(np.nextafter(mid, np.float32(1e9))) == lo + 1


def test_past_448_saturates_and_nan_stays_nan():
    got = f32_to_e4m3(np.array([464.0, 500.0, 1e30, np.inf, -np.inf, -600.0], np.float32))
    assert got.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]
    assert np.isnan(e4m3_to_f32(f32_to_e4m3(np.array([np.nan], np.float32)))).all()


def test_it_matches_torch_float8_e4m3fn_in_range():
    torch = pytest.importorskip("torch", reason="torch (the ref extra) holds the other implementation")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, 20000), rng.normal(0, 2.0 ** -7, 20000),     # normals and subnormals
                        rng.uniform(-448, 448, 20000)]).astype(np.float32)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(f32_to_e4m3(x), theirs)
    np.testing.assert_array_equal(e4m3_to_f32(CODES[(CODES & 0x7F) != 0x7F]), torch.from_numpy(
        FINITE.copy()).view(torch.float8_e4m3fn).float().numpy())


def test_per_row_scales_put_each_rows_largest_weight_on_448_within_half_a_step():
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.05, (37, 300)).astype(np.float32)
    w[5] = 0.0                                                   # an all-zero row: scale 1, codes 0
    bits, scale = quantize_rows(w)
    assert bits.shape == w.shape and scale.shape == (37,) and scale[5] == 1 and not bits[5].any()
    q = e4m3_to_f32(bits)
    rows = [r for r in range(37) if r != 5]
    assert (np.abs(q[rows]).max(axis=1) == E4M3_MAX).all()
    err = np.abs(dequantize(bits, scale) - w)
    # half a step: 2^-4 of the value for a normal, half of 2^-9 for a subnormal, both times the row's scale
    bound = np.maximum(np.abs(w) * 2.0 ** -4, 2.0 ** -10 * scale[:, None]) * (1 + 1e-6)
    assert (err <= bound).all(), float((err / bound).max())


@pytest.mark.parametrize("shape", [(300, 200), (128, 128), (1, 129)])
def test_per_block_scales_cover_ragged_edges(shape):
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.05, shape).astype(np.float32)
    w[: min(128, shape[0]), : min(128, shape[1])] *= 10          # one block of larger weights
    bits, scale = quantize_blocks(w)
    assert scale.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            assert scale[i, j] == np.float32(np.abs(tile).max() / np.float32(E4M3_MAX)), (i, j)
    deq = dequantize(bits, scale)
    assert deq.shape == shape
    assert np.abs(deq - w).max() <= np.abs(w).max() * 2.0 ** -4
