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
    f16_to_f32,
    f32_as_u32,
    f32_to_f8,
    f32_to_f16,
    fp8_decode,
    u32_as_f32,
)
from kernels.jit import kjit

# fp8 decodes by table lookup (a module constant, frozen into the compiled code)
F8_TABLE = fp8_decode(np.arange(256, dtype=np.uint8))


@kjit
def read_row(mem, off, n, dtype, out):  # type: ignore[no-untyped-def]
    """out[:n] = float32 of the n `dtype` elements at byte offset `off`."""
    if dtype == DT_FP8:
        for c in range(n):
            out[c] = F8_TABLE[mem[off + c]]
    elif dtype == DT_FP16:
        for c in range(n):
            o = off + 2 * c
            out[c] = f16_to_f32(np.int64(mem[o]) | (np.int64(mem[o + 1]) << 8))
    else:
        for c in range(n):
            o = off + 4 * c
            bits = (
                np.int64(mem[o])
                | (np.int64(mem[o + 1]) << 8)
                | (np.int64(mem[o + 2]) << 16)
                | (np.int64(mem[o + 3]) << 24)
            )
            out[c] = u32_as_f32(bits)


@kjit
def write_row(mem, off, n, dtype, vals):  # type: ignore[no-untyped-def]
    """Round vals[:n] (float32) to `dtype` and store them at byte offset `off`."""
    if dtype == DT_FP8:
        for c in range(n):
            mem[off + c] = f32_to_f8(vals[c])
    elif dtype == DT_FP16:
        for c in range(n):
            h = f32_to_f16(vals[c])
            o = off + 2 * c
            mem[o] = h & 0xFF
            mem[o + 1] = h >> 8
    else:
        for c in range(n):
            bits = f32_as_u32(vals[c])
            o = off + 4 * c
            mem[o] = bits & 0xFF
            mem[o + 1] = (bits >> 8) & 0xFF
            mem[o + 2] = (bits >> 16) & 0xFF
            mem[o + 3] = (bits >> 24) & 0xFF


@kjit
def read_block(mem, off, rows, cols, ld, dtype, out):  # type: ignore[no-untyped-def]
    """out[:rows, :cols] = float32 of the block at `off` with row stride `ld` bytes."""
    for r in range(rows):
        read_row(mem, off + r * ld, cols, dtype, out[r])


@kjit
def write_block(mem, off, rows, cols, ld, dtype, vals):  # type: ignore[no-untyped-def]
    """Round vals[:rows, :cols] to `dtype` into the block at `off`, stride `ld`."""
    for r in range(rows):
        write_row(mem, off + r * ld, cols, dtype, vals[r])
