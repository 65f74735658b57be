"""CAST (id 9): y = convert(x * 2**shift) between fp8, fp16 and fp32.

Numerics: x decoded exactly to float32, multiplied by 2**shift in float32
(exact unless it over/underflows — kernels.formulas.scale_pow2), rounded once
to dtype_y with the rounding of kernels.dtypes (fp8: ml_dtypes float8_e4m3fn,
saturating to NaN above 464).  Casting to fp8 with scale exponent e uses
shift = -e (contracts §1); decoding fp8 codes with exponent e uses shift = e.

Cycle model (kernels.cost.vector_pass): the elements are split over the
workers in chunks of `cast_grain`, `cast_slots` slots per chunk; each further
non-contiguous row costs `cast_row`; cycles = cast_call + work.  A contiguous
block is one row of M * N.  The power-of-two scale is folded into the
conversion instruction.
"""

from __future__ import annotations

import math

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_row, write_row
from kernels.cost import contiguous, put_region, vector_pass
from kernels.dtypes import DT_FP32, dtype_bytes
from kernels.status import BAD_DTYPE, BAD_SHAPE, OK
from kernels.tile import D_CAST_CALL, D_CAST_GRAIN, D_CAST_ROW, D_CAST_SLOTS
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
CA = ARGS.CAST


@kjit
def cast_check(args):  # type: ignore[no-untyped-def]
    """CAST argument check (kernels.status code)."""
    dx, dy = args[CA.dtype_x], args[CA.dtype_y]
    if args[CA.M] < 1 or args[CA.N] < 1:
        return BAD_SHAPE
    if dx < 0 or dx > DT_FP32 or dy < 0 or dy > DT_FP32:
        return BAD_DTYPE
    return OK


@kjit
def cast_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """CAST numeric body; returns a kernels.status code."""
    m, n, dx, dy = args[CA.M], args[CA.N], args[CA.dtype_x], args[CA.dtype_y]
    st = cast_check(args)
    if st != OK:
        return st
    s = np.float32(math.ldexp(1.0, int(args[CA.shift])))
    if contiguous(m, args[CA.ldx], n * dtype_bytes(dx)) and contiguous(m, args[CA.ldy],
                                                                      n * dtype_bytes(dy)):
        m, n = 1, m * n  # one pass over a dense block
    x = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[CA.x] - base + i * args[CA.ldx], n, dx, x)
        if args[CA.shift] != 0:
            for j in range(n):
                x[j] = x[j] * s
        write_row(mem, args[CA.y] - base + i * args[CA.ldy], n, dy, x)
    return OK


@kjit_inline
def cast_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a CAST vertex (module docstring)."""
    m, n = max(args[CA.M], 1), max(args[CA.N], 1)
    dx, dy = args[CA.dtype_x], args[CA.dtype_y]
    valid = dx >= 0 and dx <= DT_FP32 and dy >= 0 and dy <= DT_FP32
    if valid and (contiguous(m, args[CA.ldx], n * dtype_bytes(args[CA.dtype_x]))
                  and contiguous(m, args[CA.ldy], n * dtype_bytes(args[CA.dtype_y]))):
        m, n = 1, m * n
    return desc[D_CAST_CALL], vector_pass(m, n, desc[D_CAST_GRAIN], desc[D_CAST_SLOTS],
                                          desc[D_CAST_ROW], desc)


@kjit_inline
def cast_regions(args, out):  # type: ignore[no-untyped-def]
    """CAST regions: x read; y written."""
    m, n = args[CA.M], args[CA.N]
    bx, by = dtype_bytes(args[CA.dtype_x]), dtype_bytes(args[CA.dtype_y])
    i = put_region(out, 0, args[CA.x], 1, 0, m, args[CA.ldx], n * bx, 0)
    return put_region(out, i, args[CA.y], 1, 0, m, args[CA.ldy], n * by, 1)
