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
    f16_to_f32,
    f32_as_u32,
    f32_bits_to_f16_bits,
    f32_to_f8,
    u32_as_f32,
)
from kernels.jit import kjit


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
    """out[i] = float32 of fp16 codes[i]: a branch-free (vectorizable) pass for
    normal numbers, then a fix-up pass only if zeros/subnormals/inf/NaN occur."""
    special = 0
    for i in range(codes.size):
        h = np.int64(codes[i])
        e = (h >> 10) & 0x1F
        special |= np.int64(e == 0) | np.int64(e == 31)
        out[i] = u32_as_f32(((h & 0x8000) << 16) | (((h & 0x7FFF) + 0x1C000) << 13))
    if special != 0:
        for i in range(codes.size):
            e = (np.int64(codes[i]) >> 10) & 0x1F
            if e == 0 or e == 31:
                out[i] = f16_to_f32(codes[i])


@kjit
def f16_encode_into(vals, codes):  # type: ignore[no-untyped-def]
    """codes[i] = fp16 code of float32 vals[i]: a branch-free pass for results in
    the fp16 normal range, then a fix-up pass only if other values occur."""
    special = 0
    for i in range(vals.size):
        u = f32_as_u32(vals[i])
        a = u & 0x7FFFFFFF
        special |= np.int64(a < 0x38800000) | np.int64(a >= 0x477FF000)
        fast = (a + 0xFFF + ((a >> 13) & 1) - 0x38000000) >> 13
        codes[i] = ((u >> 16) & 0x8000) | (fast & 0x7FFF)
    if special != 0:
        for i in range(vals.size):
            u = f32_as_u32(vals[i])
            a = u & 0x7FFFFFFF
            if a < 0x38800000 or a >= 0x477FF000:
                codes[i] = f32_bits_to_f16_bits(u)


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
        for c in range(n):
            mem[off + c] = f32_to_f8(vals[c])
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
