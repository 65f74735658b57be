"""fp8 (e4m3fn), fp16 and fp32 codecs on raw bits, jitted (contracts §1).

Numba has no float16 on CPU, so every 8/16-bit value travels as its integer
code.  The scalar codecs work on integer bit patterns and reproduce, bit for
bit, what the oracles do on `astype`:

- fp8 e4m3fn = `ml_dtypes.float8_e4m3fn`: bias 7, 3 mantissa bits, no inf; codes
  0x7F/0xFF are NaN.  Round to nearest even; |x| > 464 (the midpoint between
  448 and the NaN code) and ±inf become NaN with the input's sign; exactly 464
  rounds to 448 (ties to even); NaN keeps its sign; -0.0 stays 0x80.
- fp16 = numpy `float16`: round to nearest even, overflow to ±inf, NaN keeps its
  sign and the top 10 payload bits (forced non-zero so it stays NaN).
- decoding to float32 is exact; fp16 NaN payloads shift up by 13 bits, fp8 NaN
  decodes to the quiet NaN 0x7FC00000 with the code's sign.

Scalar API (jitted, callable from other `@njit` code): `f8_to_f32`, `f32_to_f8`,
`f16_to_f32`, `f32_to_f16`, `load(mem, addr, dtype)`, `store(mem, addr, dtype,
value)`, where `mem` is a uint8 tile image, `addr` a byte offset into it
(little-endian) and `dtype` one of `DT_FP8/DT_FP16/DT_FP32`.  Array API (plain
Python): `fp8_encode/fp8_decode/fp16_encode/fp16_decode`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from kernels.abi import DT_FP8, DT_FP16, DT_FP32, DTYPE_BYTES, DTYPE_NAMES
from tilecommon.jit import kjit, kjit_inline

__all__ = ["DT_FP8", "DT_FP16", "DT_FP32", "DTYPE_BYTES", "DTYPE_NAMES"]  # codes: kernels.abi


def dtype_code(name: str) -> int:
    """Dtype code of a graph dtype name; raises ValueError naming the value."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {DTYPE_NAMES}")
    return DTYPE_NAMES.index(name)


@kjit_inline
def dtype_bytes(dtype):  # type: ignore[no-untyped-def]
    """Bytes per element of a dtype code (0 for an unknown code)."""
    if dtype == DT_FP8:
        return 1
    if dtype == DT_FP16:
        return 2
    if dtype == DT_FP32:
        return 4
    return 0


# --- bit casts: plain Python twins, with a zero-cost LLVM bitcast inside numba ---


def f32_as_u32(x: float) -> int:
    """The IEEE bits of float32(x) as an int in [0, 2**32)."""
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def u32_as_f32(u: int) -> np.float32:
    """The float32 whose IEEE bits are the low 32 bits of u."""
    word = np.array([int(u) & 0xFFFFFFFF], dtype=np.uint32)
    return np.float32(word.view(np.float32)[0])


def u64_as_f64(u: int) -> np.float64:
    """The float64 whose IEEE bits are the low 64 bits of u."""
    word = np.array([int(u) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    return np.float64(word.view(np.float64)[0])


@intrinsic
def _bitcast_i64_f64(typingctx, u):  # type: ignore[no-untyped-def]
    if u != types.int64:
        return None
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


@overload(u64_as_f64)
def _u64_as_f64_jit(u):  # type: ignore[no-untyped-def]
    def impl(u):  # type: ignore[no-untyped-def]
        return _bitcast_i64_f64(np.int64(u))

    return impl


@intrinsic
def _bitcast_f32_u32(typingctx, x):  # type: ignore[no-untyped-def]
    if x != types.float32:
        return None
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _bitcast_u32_f32(typingctx, u):  # type: ignore[no-untyped-def]
    if u != types.uint32:
        return None
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@overload(f32_as_u32)
def _f32_as_u32_jit(x):  # type: ignore[no-untyped-def]
    def impl(x):  # type: ignore[no-untyped-def]
        return np.int64(_bitcast_f32_u32(np.float32(x)))

    return impl


@overload(u32_as_f32)
def _u32_as_f32_jit(u):  # type: ignore[no-untyped-def]
    def impl(u):  # type: ignore[no-untyped-def]
        return _bitcast_u32_f32(np.uint32(u & 0xFFFFFFFF))

    return impl


# --- integer codecs -----------------------------------------------------------


@kjit
def _top_bit(m):  # type: ignore[no-untyped-def]
    """Index of the highest set bit of m > 0."""
    p = 0
    while (m >> (p + 1)) != 0:
        p += 1
    return p


@kjit
def _rshift_rne(m, s):  # type: ignore[no-untyped-def]
    """round(m / 2**s) to nearest, ties to even; m >= 0, s >= 1."""
    if s > 40:
        return 0
    q = m >> s
    r = m - (q << s)
    half = np.int64(1) << (s - 1)
    if r > half or (r == half and (q & 1) == 1):
        q += 1
    return q


@kjit
def f8_bits_to_f32_bits(q):  # type: ignore[no-untyped-def]
    """float32 bits (int64) of the fp8 e4m3fn code q."""
    q = np.int64(q) & 0xFF
    sign = (q >> 7) << 31
    e = (q >> 3) & 0xF
    m = q & 7
    if e == 15 and m == 7:
        return sign | 0x7FC00000
    if e == 0:
        if m == 0:
            return sign
        p = _top_bit(m)  # value m * 2**-9 = 1.f * 2**(p - 9)
        return sign | ((p - 9 + 127) << 23) | ((m ^ (1 << p)) << (23 - p))
    return sign | ((e - 7 + 127) << 23) | (m << 20)


@kjit
def f16_bits_to_f32_bits(h):  # type: ignore[no-untyped-def]
    """float32 bits (int64) of the fp16 code h."""
    h = np.int64(h) & 0xFFFF
    sign = (h >> 15) << 31
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 31:
        return sign | 0x7F800000 | (m << 13)
    if e == 0:
        if m == 0:
            return sign
        p = _top_bit(m)  # value m * 2**-24
        return sign | ((p - 24 + 127) << 23) | ((m ^ (1 << p)) << (23 - p))
    return sign | ((e - 15 + 127) << 23) | (m << 13)


@kjit
def f32_bits_to_f8_bits(u):  # type: ignore[no-untyped-def]
    """fp8 e4m3fn code of the float32 with bits u (ml_dtypes rounding)."""
    u = np.int64(u) & 0xFFFFFFFF
    sign = (u >> 31) << 7
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:  # inf and NaN: e4m3fn has no inf
        return sign | 0x7F
    e = a >> 23
    if e >= 121:  # |x| >= 2**-6: fp8 normal range (or overflow)
        r = a + 0x7FFFF + ((a >> 20) & 1)
        c = (r >> 20) - (120 << 3)
        if c > 0x7E:
            return sign | 0x7F
        return sign | c
    if e == 0:
        m = a & 0x7FFFFF
        e = 1
    else:
        m = (a & 0x7FFFFF) | 0x800000
    # value m * 2**(e - 150); code = value * 2**9 (may round up to 0x08 = 2**-6)
    return sign | _rshift_rne(m, 141 - e)


@kjit
def f32_bits_to_f16_bits(u):  # type: ignore[no-untyped-def]
    """fp16 code of the float32 with bits u (numpy astype rounding)."""
    u = np.int64(u) & 0xFFFFFFFF
    sign = (u >> 31) << 15
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:
        c = 0x7C00 | ((a & 0x7FFFFF) >> 13)
        if c == 0x7C00:
            c += 1
        return sign | c
    if a == 0x7F800000:
        return sign | 0x7C00
    e = a >> 23
    if e >= 113:  # |x| >= 2**-14: fp16 normal range (or overflow)
        r = a + 0xFFF + ((a >> 13) & 1)
        c = (r >> 13) - (112 << 10)
        if c >= 0x7C00:
            return sign | 0x7C00
        return sign | c
    if e == 0:
        m = a & 0x7FFFFF
        e = 1
    else:
        m = (a & 0x7FFFFF) | 0x800000
    # value m * 2**(e - 150); code = value * 2**24
    return sign | _rshift_rne(m, 126 - e)


# --- scalar float codecs --------------------------------------------------------


@kjit
def f8_to_f32(q):  # type: ignore[no-untyped-def]
    """float32 value of the fp8 e4m3fn code q."""
    return u32_as_f32(f8_bits_to_f32_bits(q))


@kjit
def f16_to_f32(h):  # type: ignore[no-untyped-def]
    """float32 value of the fp16 code h."""
    return u32_as_f32(f16_bits_to_f32_bits(h))


@kjit
def f32_to_f8(x):  # type: ignore[no-untyped-def]
    """fp8 e4m3fn code (int64 0..255) of float32(x)."""
    return f32_bits_to_f8_bits(f32_as_u32(x))


@kjit
def f32_to_f16(x):  # type: ignore[no-untyped-def]
    """fp16 code (int64 0..65535) of float32(x)."""
    return f32_bits_to_f16_bits(f32_as_u32(x))


@kjit
def load(mem, addr, dtype):  # type: ignore[no-untyped-def]
    """float32 value of the `dtype` element at byte offset `addr` of `mem`."""
    if dtype == DT_FP8:
        return f8_to_f32(mem[addr])
    if dtype == DT_FP16:
        return f16_to_f32(np.int64(mem[addr]) | (np.int64(mem[addr + 1]) << 8))
    bits = (
        np.int64(mem[addr])
        | (np.int64(mem[addr + 1]) << 8)
        | (np.int64(mem[addr + 2]) << 16)
        | (np.int64(mem[addr + 3]) << 24)
    )
    return u32_as_f32(bits)


@kjit
def store(mem, addr, dtype, value):  # type: ignore[no-untyped-def]
    """Round float32(value) to `dtype` and write it at byte offset `addr`."""
    if dtype == DT_FP8:
        mem[addr] = f32_to_f8(value)
        return
    if dtype == DT_FP16:
        c = f32_to_f16(value)
        mem[addr] = c & 0xFF
        mem[addr + 1] = c >> 8
        return
    bits = f32_as_u32(value)
    mem[addr] = bits & 0xFF
    mem[addr + 1] = (bits >> 8) & 0xFF
    mem[addr + 2] = (bits >> 16) & 0xFF
    mem[addr + 3] = (bits >> 24) & 0xFF


# --- array API ------------------------------------------------------------------


@kjit
def f8_encode_into(vals, codes):  # type: ignore[no-untyped-def]
    """codes[i] = e4m3fn code of float32 vals[i] (the rounding of
    `f32_bits_to_f8_bits`; `fp8_encode` and kernels.blocks' writes use it),
    branch-free so it vectorizes: the normal range rounds the bits (round to
    nearest even at bit 20), values below 2**-6 are |x| * 2**9 rounded to an
    integer by the float32 add of 2**23 (exact: the sum is rounded to nearest
    even once), and anything that rounds above 448 (inf and NaN too) is the
    NaN code."""
    for i in range(vals.size):
        x = vals[i]
        u = f32_as_u32(x)
        a = u & 0x7FFFFFFF
        c = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - 960
        c = 0x7F if c > 0x7E else c
        v = min(abs(x), np.float32(0.015625)) * np.float32(512.0)
        sub = np.int64(np.int32((v + np.float32(8388608.0)) - np.float32(8388608.0)))
        c = c if a >= 0x3C800000 else sub
        codes[i] = ((u >> 24) & 0x80) | c


@kjit
def _encode16(src, dst):  # type: ignore[no-untyped-def]
    for i in range(src.size):
        dst[i] = f32_bits_to_f16_bits(src[i])


@kjit
def _decode8(src, dst):  # type: ignore[no-untyped-def]
    for i in range(src.size):
        dst[i] = f8_bits_to_f32_bits(src[i])


@kjit
def _decode16(src, dst):  # type: ignore[no-untyped-def]
    for i in range(src.size):
        dst[i] = f16_bits_to_f32_bits(src[i])


def _f32_bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)


def fp8_encode(x: np.ndarray) -> np.ndarray:
    """uint8 e4m3fn codes of `x` (converted to float32 first), same shape."""
    a = np.asarray(x)
    out = np.empty(a.shape, dtype=np.uint8)
    f8_encode_into(np.ascontiguousarray(a, dtype=np.float32).reshape(-1), out.reshape(-1))
    return out


def fp16_encode(x: np.ndarray) -> np.ndarray:
    """uint16 fp16 codes of `x` (converted to float32 first), same shape."""
    a = np.asarray(x)
    out = np.empty(a.shape, dtype=np.uint16)
    _encode16(_f32_bits(a), out.reshape(-1))
    return out


def fp8_decode(q: np.ndarray) -> np.ndarray:
    """float32 values of uint8 e4m3fn codes, same shape."""
    a = np.ascontiguousarray(q, dtype=np.uint8)
    out = np.empty(a.shape, dtype=np.uint32)
    _decode8(a.reshape(-1), out.reshape(-1))
    return out.view(np.float32)


def fp16_decode(h: np.ndarray) -> np.ndarray:
    """float32 values of uint16 fp16 codes, same shape."""
    a = np.ascontiguousarray(h, dtype=np.uint16)
    out = np.empty(a.shape, dtype=np.uint32)
    _decode16(a.reshape(-1), out.reshape(-1))
    return out.view(np.float32)
