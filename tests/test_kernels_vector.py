"""Vector kernels (REDUCE, ADD, BIAS_ADD, LAYERNORM, GELU, SOFTMAX, CAST, COPY,
TRANSPOSE) bit-identical to their numpy twins in kernels.formulas on random
shapes: odd sizes, 1-row blocks, padded (non-contiguous) row strides."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kernels import abi, dispatch, formulas
from kernels.dtypes import (
    DT_FP8,
    DT_FP16,
    DT_FP32,
    fp8_decode,
    fp8_encode,
    fp16_decode,
    fp16_encode,
)
from kernels.registry import by_name
from kernels.testing import TileImage, random_codes

SEED = 23
SHAPES = [(1, 1), (1, 31), (5, 1), (3, 17), (9, 64), (2, 257)]
NP_CODE = {DT_FP8: np.uint8, DT_FP16: np.uint16, DT_FP32: np.float32}
BYTES = {DT_FP8: 1, DT_FP16: 2, DT_FP32: 4}


def _decode(codes: np.ndarray, dt: int) -> np.ndarray:
    if dt == DT_FP8:
        return fp8_decode(codes)
    if dt == DT_FP16:
        return fp16_decode(codes)
    return codes.astype(np.float32)


def _encode(x: np.ndarray, dt: int) -> np.ndarray:
    if dt == DT_FP8:
        return fp8_encode(x)
    if dt == DT_FP16:
        return fp16_encode(x)
    return x.astype(np.float32)


def _run(name: str, img: TileImage, **named: float | int) -> None:
    spec = by_name(name)
    assert dispatch.vertex_execute(spec.id, img.mem, img.base, spec.make_args(**named)) == 0


def _out(img: TileImage, m: int, n: int, dt: int, pad: int = 8) -> tuple[int, int]:
    ld = n * BYTES[dt] + pad
    return img.alloc(ld * (m - 1) + n * BYTES[dt]), ld


def _assert_bits(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


@pytest.mark.parametrize("shape", SHAPES)
def test_reduce(shape: tuple[int, int]) -> None:
    m, n = shape
    rng = np.random.default_rng(SEED + m * n)
    for k, out_dt, bias, half in [(1, DT_FP32, False, 0), (3, DT_FP16, True, 0),
                                  (5, DT_FP32, True, 0), (4, DT_FP16, True, 1),
                                  (2, DT_FP32, False, 1)]:
        img = TileImage(1 << 16)
        parts = random_codes(rng, (k, m, n), DT_FP16 if half else DT_FP32)
        ld = (n * (2 if half else 4) + 7) // 8 * 8 + 16
        stride = m * ld + 8
        base_addr = img.alloc(stride * k)
        for j in range(k):
            img.put(parts[j], ld=ld, at=base_addr + j * stride)
        b = random_codes(rng, (n,), DT_FP16)
        y, ldy = _out(img, m, n, out_dt)
        _run("REDUCE", img, parts=base_addr, ld_parts=ld, part_stride=stride, k=k, out=y,
             ldo=ldy, M=m, N=n, out_dtype=out_dt, bias=img.put(b) if bias else 0,
             parts_fp16=half)
        values = fp16_decode(parts) if half else parts
        want = _encode(formulas.reduce_parts(values, fp16_decode(b) if bias else None), out_dt)
        _assert_bits(img.get(y, m, n, ldy, NP_CODE[out_dt]), want)


@pytest.mark.parametrize("shape", SHAPES)
def test_add_and_bias_add(shape: tuple[int, int]) -> None:
    m, n = shape
    rng = np.random.default_rng(SEED + 1 + m * n)
    for da, db, dc in [(DT_FP16, DT_FP16, DT_FP16), (DT_FP32, DT_FP16, DT_FP16),
                       (DT_FP16, DT_FP32, DT_FP32), (DT_FP8, DT_FP16, DT_FP8)]:
        img = TileImage(1 << 16)
        a = random_codes(rng, (m, n), da)
        b = random_codes(rng, (m, n), db)
        lda, ldb = n * BYTES[da] + 8, n * BYTES[db]
        c, ldc = _out(img, m, n, dc)
        _run("ADD", img, a=img.put(a, ld=lda), lda=lda, b=img.put(b, ld=ldb), ldb=ldb, c=c,
             ldc=ldc, M=m, N=n, dtype_a=da, dtype_b=db, dtype_c=dc)
        want = _encode(_decode(a, da) + _decode(b, db), dc)
        _assert_bits(img.get(c, m, n, ldc, NP_CODE[dc]), want)
    img = TileImage(1 << 16)
    x = random_codes(rng, (m, n), DT_FP16)
    bias = random_codes(rng, (n,), DT_FP16)
    ldx = n * 2 + 24
    y, ldy = _out(img, m, n, DT_FP16)
    _run("BIAS_ADD", img, x=img.put(x, ld=ldx), ldx=ldx, bias=img.put(bias), y=y, ldy=ldy, M=m,
         N=n, dtype_x=DT_FP16, dtype_y=DT_FP16)
    want = fp16_encode(fp16_decode(x) + fp16_decode(bias))
    _assert_bits(img.get(y, m, n, ldy, np.uint16), want)


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm(shape: tuple[int, int]) -> None:
    m, n = shape
    rng = np.random.default_rng(SEED + 2 + m * n)
    img = TileImage(1 << 16)
    x = random_codes(rng, (m, n), DT_FP16, std=3.0)
    x = fp16_encode(fp16_decode(x) + np.float32(1.5))  # a non-zero mean
    gamma = random_codes(rng, (n,), DT_FP16)
    beta = random_codes(rng, (n,), DT_FP16)
    ldx = n * 2 + 8
    y, ldy = _out(img, m, n, DT_FP16, pad=16)
    _run("LAYERNORM", img, x=img.put(x, ld=ldx), ldx=ldx, gamma=img.put(gamma),
         beta=img.put(beta), y=y, ldy=ldy, M=m, N=n, eps=1e-6)
    want = formulas.layernorm(fp16_decode(x), fp16_decode(gamma), fp16_decode(beta),
                              float(np.float32(1e-6)))
    _assert_bits(img.get(y, m, n, ldy, np.uint16), fp16_encode(want))


@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_and_softmax(shape: tuple[int, int]) -> None:
    m, n = shape
    rng = np.random.default_rng(SEED + 3 + m * n)
    img = TileImage(1 << 16)
    x = random_codes(rng, (m, n), DT_FP16, std=3.0)
    ldx = n * 2 + 8
    xa = img.put(x, ld=ldx)
    y, ldy = _out(img, m, n, DT_FP16)
    _run("GELU", img, x=xa, ldx=ldx, y=y, ldy=ldy, M=m, N=n)
    _assert_bits(img.get(y, m, n, ldy, np.uint16), fp16_encode(formulas.gelu(fp16_decode(x))))
    for dy, scale in [(DT_FP16, 0.125), (DT_FP32, 1.0)]:
        s, lds = _out(img, m, n, dy)
        _run("SOFTMAX", img, x=xa, ldx=ldx, y=s, ldy=lds, M=m, N=n, scale=scale,
             dtype_x=DT_FP16, dtype_y=dy)
        want = _encode(formulas.softmax(fp16_decode(x), scale), dy)
        _assert_bits(img.get(s, m, n, lds, NP_CODE[dy]), want)


def test_gelu_close_to_float64_formula() -> None:
    x = np.linspace(-6, 6, 1001)
    ref = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(formulas.gelu(x.astype(np.float32)), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_cast_all_pairs_with_shift(shape: tuple[int, int]) -> None:
    m, n = shape
    rng = np.random.default_rng(SEED + 4 + m * n)
    for dx in (DT_FP8, DT_FP16, DT_FP32):
        for dy in (DT_FP8, DT_FP16, DT_FP32):
            for shift in (-3, 0, 2):
                img = TileImage(1 << 16)
                x = random_codes(rng, (m, n), dx, std=8.0)
                ldx = n * BYTES[dx] + 8
                y, ldy = _out(img, m, n, dy)
                _run("CAST", img, x=img.put(x, ld=ldx), ldx=ldx, y=y, ldy=ldy, M=m, N=n,
                     dtype_x=dx, dtype_y=dy, shift=shift)
                want = _encode(formulas.scale_pow2(_decode(x, dx), shift), dy)
                _assert_bits(img.get(y, m, n, ldy, NP_CODE[dy]), want)


def test_cast_to_fp8_matches_ml_dtypes_with_scale() -> None:
    """contracts §1: casting x to fp8 with exponent e stores fp8(x * 2**-e)."""
    rng = np.random.default_rng(SEED)
    img = TileImage(1 << 16)
    x = (rng.standard_normal((4, 50)) * 900).astype(np.float32)  # some saturate to NaN
    e = 2
    y, ldy = _out(img, 4, 50, DT_FP8)
    _run("CAST", img, x=img.put(x), ldx=200, y=y, ldy=ldy, M=4, N=50, dtype_x=DT_FP32,
         dtype_y=DT_FP8, shift=-e)
    with np.errstate(over="ignore", invalid="ignore"):
        want = (x * np.float32(2.0**-e)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    _assert_bits(img.get(y, 4, 50, ldy, np.uint8), want)


@pytest.mark.parametrize("shape", SHAPES)
def test_copy_and_transpose(shape: tuple[int, int]) -> None:
    m, n = shape
    rng = np.random.default_rng(SEED + 5 + m * n)
    img = TileImage(1 << 16)
    src = rng.integers(0, 256, size=(m, n), dtype=np.uint8)
    lds = n + 5
    dst, ldd = _out(img, m, n, DT_FP8, pad=3)
    _run("COPY", img, src=img.put(src, ld=lds), lds=lds, dst=dst, ldd=ldd, rows=m, row_bytes=n)
    np.testing.assert_array_equal(img.get(dst, m, n, ldd, np.uint8), src)
    for dt in (DT_FP8, DT_FP16, DT_FP32):
        x = random_codes(rng, (m, n), dt)
        ldx = n * BYTES[dt] + 8
        y, ldy = _out(img, n, m, dt)
        _run("TRANSPOSE", img, src=img.put(x, ld=ldx), lds=ldx, dst=y, ldd=ldy, M=m, N=n,
             elem_bytes=BYTES[dt])
        _assert_bits(img.get(y, n, m, ldy, NP_CODE[dt]), x.T)


def test_in_place_gelu_and_transpose() -> None:
    rng = np.random.default_rng(SEED)
    img = TileImage(1 << 12)
    x = random_codes(rng, (4, 4), DT_FP16)
    a = img.put(x)
    _run("GELU", img, x=a, ldx=8, y=a, ldy=8, M=4, N=4)
    _assert_bits(img.get(a, 4, 4, 8, np.uint16), fp16_encode(formulas.gelu(fp16_decode(x))))
    y = img.get(a, 4, 4, 8, np.uint16).copy()
    _run("TRANSPOSE", img, src=a, lds=8, dst=a, ldd=8, M=4, N=4, elem_bytes=2)
    _assert_bits(img.get(a, 4, 4, 8, np.uint16), y.T)
    assert abi.TRANSPOSE == 11
