"""ROPE (id 13): rotary position embedding, rotate-half form, on fp16 rows.

x [M, N] fp16, N = heads × head_dim; `cos` and `sin` hold the table rows of
those M rows (head_dim / 2 entries each, row stride `ldt`, dtype `dtype_t`
fp16 or fp32); per head, with x1 and x2 its two halves,
y1 = x1·cos − x2·sin and y2 = x2·cos + x1·sin in float32, one operation at a
time (kernels.formulas.rope), rounded once to fp16.  y may not alias x.

Cycle model.  Not measured; it borrows ADD's row-by-row path (the halves
make every row two strided runs, and the tables are two more streams): per
output element two multiplies and an add or subtract, so three vector
operations per group of workers × lanes elements where ADD has one:

    work = M * ceil(N / (workers * lanes)) * workers * 3 * add_row_slots + (M - 1) * add_row
    cycles = add_call + work
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_row, write_row
from kernels.cost import put_region, vector_pass
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes
from kernels.status import BAD_DTYPE, BAD_SHAPE, OK
from kernels.tile import D_ADD_CALL, D_ADD_ROW, D_ADD_ROW_SLOTS, D_VECTOR_BYTES
from tilecommon.jit import kjit, kjit_inline

RO = ARGS.ROPE
ROPE_OPS = 3  # vector operations per output element (two multiplies, one add)


@kjit
def rope_check(args):  # type: ignore[no-untyped-def]
    """ROPE argument check (kernels.status code)."""
    m, n, hd = args[RO.M], args[RO.N], args[RO.head_dim]
    if m < 1 or n < 1 or hd < 2 or hd % 2 != 0 or n % hd != 0:
        return BAD_SHAPE
    if args[RO.dtype_t] != DT_FP16 and args[RO.dtype_t] != DT_FP32:
        return BAD_DTYPE
    return OK


@kjit
def rope_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """ROPE numeric body (module docstring); returns a kernels.status code."""
    st = rope_check(args)
    if st != OK:
        return st
    m, n, hd, dt = args[RO.M], args[RO.N], args[RO.head_dim], args[RO.dtype_t]
    half = hd // 2
    x = np.empty(n, dtype=np.float32)
    y = np.empty(n, dtype=np.float32)
    c = np.empty(half, dtype=np.float32)
    s = np.empty(half, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[RO.x] - base + i * args[RO.ldx], n, DT_FP16, x)
        read_row(mem, args[RO.cos] - base + i * args[RO.ldt], half, dt, c)
        read_row(mem, args[RO.sin] - base + i * args[RO.ldt], half, dt, s)
        for h in range(n // hd):
            o = h * hd
            for j in range(half):
                x1, x2 = x[o + j], x[o + half + j]
                y[o + j] = (x1 * c[j]) - (x2 * s[j])
                y[o + half + j] = (x2 * c[j]) + (x1 * s[j])
        write_row(mem, args[RO.y] - base + i * args[RO.ldy], n, DT_FP16, y)
    return OK


@kjit_inline
def rope_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a ROPE vertex (module docstring)."""
    m, n = max(args[RO.M], 1), max(args[RO.N], 1)
    lanes = max(desc[D_VECTOR_BYTES] // 2, 1)
    return desc[D_ADD_CALL], vector_pass(m, n, lanes, ROPE_OPS * desc[D_ADD_ROW_SLOTS],
                                          desc[D_ADD_ROW], desc)


@kjit_inline
def rope_regions(args, out):  # type: ignore[no-untyped-def]
    """ROPE regions: x, cos, sin read; y written."""
    m, n = args[RO.M], args[RO.N]
    tb = (args[RO.head_dim] // 2) * dtype_bytes(args[RO.dtype_t])
    i = put_region(out, 0, args[RO.x], 1, 0, m, args[RO.ldx], n * 2, 0)
    i = put_region(out, i, args[RO.cos], 1, 0, m, args[RO.ldt], tb, 0)
    i = put_region(out, i, args[RO.sin], 1, 0, m, args[RO.ldt], tb, 0)
    return put_region(out, i, args[RO.y], 1, 0, m, args[RO.ldy], n * 2, 1)
