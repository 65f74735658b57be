"""kernels.dtypes against the oracles: ml_dtypes float8_e4m3fn and numpy float16.

Decode is checked on every code, bitwise (NaN payloads included).  Encode is
checked on > 10**7 float32 values: random bit patterns plus every edge class
(midpoints between adjacent codes in every binade and one ulp either side,
subnormals, 448, 464, overflow, ±inf, NaN, -0.0, float32 subnormals, huge).
A mismatch is any bit difference, except that where the oracle gives NaN we
require NaN with the same sign (NaN payload bits of a float32→fp16 cast differ
between numpy's software and hardware conversion paths).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kernels import dtypes
from kernels.dtypes import fp8_decode, fp8_encode, fp16_decode, fp16_encode

SEED = 1234
F8 = ml_dtypes.float8_e4m3fn


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def _edge_values() -> np.ndarray:
    """Float32 values in every edge class of both codecs (both signs)."""
    parts = []
    f8_vals = np.arange(0, 127, dtype=np.uint8).view(F8).astype(np.float64)
    f16_vals = np.arange(0, 0x7C01, dtype=np.uint16).view(np.float16).astype(np.float64)
    for vals in (f8_vals, f16_vals):
        mid = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)  # exact in float32
        parts += [mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))]
        parts.append(vals.astype(np.float32))
    specials = np.array(
        [0.0, 448.0, 464.0, 480.0, 496.0, 65504.0, 65520.0, 3.0e38, 1e-45, 1e-40,
         2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-6, 2.0**-14,
         np.inf, np.nan],
        dtype=np.float32,
    )
    parts.append(specials)
    parts.append(np.nextafter(specials, np.float32(np.inf)))
    parts.append(np.nextafter(specials, np.float32(0)))
    # float32 subnormals and NaNs with assorted payloads
    parts.append(np.arange(1, 5000, dtype=np.uint32).view(np.float32))
    nan_bits = np.array([0x7F800001, 0x7FC00000, 0x7FC00001, 0x7F802000, 0x7FFFFFFF,
                         0x7F801FFF], dtype=np.uint32)
    parts.append(nan_bits.view(np.float32))
    pos = np.concatenate(parts).astype(np.float32)
    return np.concatenate([pos, -pos])


def _encode_inputs() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    random_bits = rng.integers(0, 2**32, size=6_000_000, dtype=np.uint64).astype(np.uint32)
    in_range = rng.uniform(-520.0, 520.0, size=2_000_000).astype(np.float32)
    log_mag = np.exp2(rng.uniform(-28.0, 18.0, size=2_000_000)).astype(np.float32)
    log_mag *= np.where(rng.random(2_000_000) < 0.5, -1.0, 1.0).astype(np.float32)
    return np.concatenate([random_bits.view(np.float32), in_range, log_mag, _edge_values()])


def _mismatches(ours: np.ndarray, oracle: np.ndarray, nan_oracle: np.ndarray,
                nan_ours: np.ndarray, sign_bit: int) -> int:
    plain = ~nan_oracle & (ours != oracle)
    nan_bad = nan_oracle & (~nan_ours | ((ours & sign_bit) != (oracle & sign_bit)))
    return int(plain.sum() + nan_bad.sum())


@pytest.fixture(scope="module")
def encode_inputs() -> np.ndarray:
    x = _encode_inputs()
    assert x.size >= 10_000_000
    return x


def test_fp8_decode_all_codes_bitwise() -> None:
    codes = np.arange(256, dtype=np.uint8)
    expect = codes.view(F8).astype(np.float32)
    got = fp8_decode(codes)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(_bits(got), _bits(expect))
    assert np.isnan(got).sum() == 2


def test_fp16_decode_all_codes_bitwise() -> None:
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    expect = codes.view(np.float16).astype(np.float32)
    got = fp16_decode(codes)
    np.testing.assert_array_equal(_bits(got), _bits(expect))


def test_fp8_encode_matches_ml_dtypes(encode_inputs: np.ndarray) -> None:
    x = encode_inputs
    with np.errstate(over="ignore", invalid="ignore"):
        oracle = x.astype(F8).view(np.uint8)
    ours = fp8_encode(x)
    nan_oracle = (oracle & 0x7F) == 0x7F
    nan_ours = (ours & 0x7F) == 0x7F
    assert _mismatches(ours, oracle, nan_oracle, nan_ours, 0x80) == 0


def test_fp16_encode_matches_numpy(encode_inputs: np.ndarray) -> None:
    x = encode_inputs
    with np.errstate(over="ignore", invalid="ignore"):
        oracle = x.astype(np.float16).view(np.uint16)
    ours = fp16_encode(x)
    nan_oracle = ((oracle & 0x7C00) == 0x7C00) & ((oracle & 0x3FF) != 0)
    nan_ours = ((ours & 0x7C00) == 0x7C00) & ((ours & 0x3FF) != 0)
    assert _mismatches(ours, oracle, nan_oracle, nan_ours, 0x8000) == 0


@pytest.mark.parametrize(
    ("value", "code"),
    [(448.0, 0x7E), (464.0, 0x7E), (465.0, 0x7F), (np.inf, 0x7F), (-np.inf, 0xFF),
     (np.nan, 0x7F), (-0.0, 0x80), (2.0**-10, 0x00), (3 * 2.0**-11, 0x01), (-1.0, 0xB8)],
)
def test_fp8_edge_codes(value: float, code: int) -> None:
    assert int(fp8_encode(np.array([value], dtype=np.float32))[0]) == code
    assert dtypes.f32_to_f8(np.float32(value)) == code


def test_scalar_codecs_and_load_store_roundtrip() -> None:
    mem = np.zeros(64, dtype=np.uint8)
    dtypes.store(mem, 3, dtypes.DT_FP16, np.float32(-1.5))
    assert mem[3] == 0x00 and mem[4] == 0xBE  # 0xBE00 little-endian
    assert dtypes.load(mem, 3, dtypes.DT_FP16) == np.float32(-1.5)
    dtypes.store(mem, 8, dtypes.DT_FP32, np.float32(3.25))
    assert bytes(mem[8:12]) == np.array([3.25], np.float32).tobytes()
    assert dtypes.load(mem, 8, dtypes.DT_FP32) == np.float32(3.25)
    dtypes.store(mem, 20, dtypes.DT_FP8, np.float32(500.0))
    assert mem[20] == 0x7F and np.isnan(dtypes.load(mem, 20, dtypes.DT_FP8))
    assert dtypes.f16_to_f32(0x3C00) == np.float32(1.0)
    assert dtypes.f32_to_f16(np.float32(65520.0)) == 0x7C00
    assert dtypes.f8_to_f32(0x01) == np.float32(2.0**-9)
    assert dtypes.dtype_code("fp16") == dtypes.DT_FP16
    with pytest.raises(ValueError, match="bf16"):
        dtypes.dtype_code("bf16")
