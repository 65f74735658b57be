"""Reading and writing 2-D operand blocks of a tile image as float32.

A block is `rows` rows of `cols` elements of one dtype; row r starts at byte
`off + r * ld` of `mem` (uint8 tile image, offset 0 = memory base), elements
are contiguous and little-endian inside a row.  Every kernel decodes its
operands through `read_row`/`read_block` and rounds its results once through
`write_row`/`write_block`, so all rounding goes through `kernels.dtypes`.
"""

from __future__ import annotations

import numpy as np

from kernels.dtypes import (
    DT_FP8,
    DT_FP16,
    dtype_bytes,
    f8_encode_into,
    f32_as_u32,
    u32_as_f32,
)
from tilecommon.jit import kjit


@kjit
def f8_decode_into(codes, out):  # type: ignore[no-untyped-def]
    """out[i] = float32 of e4m3fn codes[i], branch-free (vectorizes; ~1.6x a table
    lookup): normal codes rebias the exponent, subnormals are (m & 7) * 2**-9,
    0x7F/0xFF are NaN, the sign bit is copied."""
    for i in range(codes.size):
        q = np.int64(codes[i])
        m = q & 0x7F
        normal = (m << 20) + 0x3C000000
        sub = f32_as_u32(np.float32(m & 7) * np.float32(0.001953125))
        bits = normal if m >= 8 else sub
        bits = 0x7FC00000 if m == 0x7F else bits
        out[i] = u32_as_f32(bits | ((q & 0x80) << 24))


@kjit
def f16_decode_into(codes, out):  # type: ignore[no-untyped-def]
    """out[i] = float32 of fp16 codes[i], branch-free (vectorizes): normal
    codes rebias the exponent, subnormals (and zeros) are m * 2**-24 (exact in
    float32), exponent 31 is inf/NaN with the mantissa kept; the sign bit is
    copied."""
    for i in range(codes.size):
        h = np.int64(codes[i])
        e = h & 0x7C00
        normal = ((h & 0x7FFF) + 0x1C000) << 13
        sub = f32_as_u32(np.float32(h & 0x3FF) * np.float32(5.960464477539063e-08))
        bits = normal if e != 0 else sub
        bits = (0x7F800000 | ((h & 0x3FF) << 13)) if e == 0x7C00 else bits
        out[i] = u32_as_f32(bits | ((h & 0x8000) << 16))


@kjit
def f16_encode_into(vals, codes):  # type: ignore[no-untyped-def]
    """codes[i] = fp16 code of float32 vals[i] (numpy's astype rounding, as
    kernels.dtypes.f32_bits_to_f16_bits), branch-free so it vectorizes: the
    normal range rounds the bits (nearest even at bit 13) and saturates to
    inf, values below 2**-14 are |x| * 2**24 rounded to an integer by the
    float32 add of 2**23, NaN keeps its top mantissa bits (made non-zero)."""
    for i in range(vals.size):
        x = vals[i]
        u = f32_as_u32(x)
        a = u & 0x7FFFFFFF
        c = ((a + 0xFFF + ((a >> 13) & 1)) >> 13) - (112 << 10)
        c = 0x7C00 if c > 0x7C00 else c
        v = min(abs(x), np.float32(6.103515625e-05)) * np.float32(16777216.0)
        sub = np.int64(np.int32((v + np.float32(8388608.0)) - np.float32(8388608.0)))
        c = c if a >= 0x38800000 else sub
        nan = 0x7C00 | ((a & 0x7FFFFF) >> 13)
        nan = nan + 1 if nan == 0x7C00 else nan
        c = nan if a > 0x7F800000 else c
        codes[i] = ((u >> 16) & 0x8000) | c


@kjit
def read_row(mem, off, n, dtype, out):  # type: ignore[no-untyped-def]
    """out[:n] = float32 of the n `dtype` elements at byte offset `off` (out contiguous)."""
    if dtype == DT_FP8:
        f8_decode_into(mem[off:off + n], out[:n])
    elif dtype == DT_FP16:
        f16_decode_into(mem[off:off + 2 * n].view(np.uint16), out[:n])
    else:
        out[:n] = mem[off:off + 4 * n].view(np.float32)


@kjit
def write_row(mem, off, n, dtype, vals):  # type: ignore[no-untyped-def]
    """Round vals[:n] (float32, contiguous) to `dtype` and store them at byte offset `off`."""
    if dtype == DT_FP8:
        f8_encode_into(vals[:n], mem[off:off + n])
    elif dtype == DT_FP16:
        f16_encode_into(vals[:n], mem[off:off + 2 * n].view(np.uint16))
    else:
        mem[off:off + 4 * n].view(np.float32)[:] = vals[:n]


@kjit
def read_block(mem, off, rows, cols, ld, dtype, out):  # type: ignore[no-untyped-def]
    """out[:rows, :cols] = float32 of the block at `off` with row stride `ld` bytes;
    out is C-contiguous of shape (rows, cols).  A dense block is one flat pass."""
    if rows > 1 and ld == cols * dtype_bytes(dtype):
        read_row(mem, off, rows * cols, dtype, out.reshape(-1))
        return
    for r in range(rows):
        read_row(mem, off + r * ld, cols, dtype, out[r])


@kjit
def write_block(mem, off, rows, cols, ld, dtype, vals):  # type: ignore[no-untyped-def]
    """Round vals[:rows, :cols] (C-contiguous) to `dtype` into the block at `off`,
    stride `ld`.  A dense block is one flat pass."""
    if rows > 1 and ld == cols * dtype_bytes(dtype):
        write_row(mem, off, rows * cols, dtype, vals.reshape(-1))
        return
    for r in range(rows):
        write_row(mem, off + r * ld, cols, dtype, vals[r])
