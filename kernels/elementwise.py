"""Elementwise vector kernels: ADD (id 4), BIAS_ADD (id 5), GELU (id 7).

Numerics follow kernels.formulas: operands decoded exactly to float32, one
float32 operation (add) or the GELU tanh formula, one rounding at the output.
Rows are processed one at a time (read a row, compute, write it), so y may
alias x.

Cycle model (kernels.cost): rows split over the workers, each worker at
1/workers of the tile vector rate.  ADD/BIAS_ADD: 1 vector op per element at
the fp16 rate (4/cycle/tile) when every operand is fp16 — an fp16 add rounded
once equals the fp32 add rounded to fp16, so the hardware may use half-precision
SIMD — else at the fp32 rate (2/cycle/tile).  GELU: GELU_PASSES fp32 vector ops
per element: x*x, *x, fma with 0.044715, scale by sqrt(2/pi), tanh (one op on
the IPU's hardware transcendental unit), +1, 0.5*x, final multiply.
"""

from __future__ import annotations

import numpy as np

from kernels.blocks import read_row, write_row
from kernels.cost import put_region, vector_cycles
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes
from kernels.formulas import GELU_C0, GELU_C1
from kernels.jit import kjit, kjit_inline
from kernels.status import BAD_DTYPE, BAD_SHAPE, OK
from kernels.tile import D_VEC_FP16, D_VEC_FP32
from kernels.transcend import tanh64

GELU_PASSES = 8


@kjit
def _valid_dtype(dt):  # type: ignore[no-untyped-def]
    return dt >= 0 and dt <= DT_FP32


@kjit
def add_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """ADD: c = a + b in float32, rounded once to dtype_c."""
    m, n = args[6], args[7]
    if m < 1 or n < 1:
        return BAD_SHAPE
    if not (_valid_dtype(args[8]) and _valid_dtype(args[9]) and _valid_dtype(args[10])):
        return BAD_DTYPE
    a = np.empty(n, dtype=np.float32)
    b = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[0] - base + i * args[1], n, args[8], a)
        read_row(mem, args[2] - base + i * args[3], n, args[9], b)
        for j in range(n):
            a[j] = a[j] + b[j]
        write_row(mem, args[4] - base + i * args[5], n, args[10], a)
    return OK


@kjit
def bias_add_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """BIAS_ADD: y = x + bias (fp16[N]) in float32, rounded once to dtype_y."""
    m, n = args[5], args[6]
    if m < 1 or n < 1:
        return BAD_SHAPE
    if not (_valid_dtype(args[7]) and _valid_dtype(args[8])):
        return BAD_DTYPE
    bias = np.empty(n, dtype=np.float32)
    read_row(mem, args[2] - base, n, DT_FP16, bias)
    x = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[0] - base + i * args[1], n, args[7], x)
        for j in range(n):
            x[j] = x[j] + bias[j]
        write_row(mem, args[3] - base + i * args[4], n, args[8], x)
    return OK


@kjit
def gelu_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """GELU (tanh form, kernels.formulas.gelu) on fp16 rows, fp16 out."""
    m, n = args[4], args[5]
    if m < 1 or n < 1:
        return BAD_SHAPE
    x = np.empty(n, dtype=np.float32)
    half = np.float32(0.5)
    one = np.float32(1.0)
    c0 = np.float32(GELU_C0)
    c1 = np.float32(GELU_C1)
    for i in range(m):
        read_row(mem, args[0] - base + i * args[1], n, DT_FP16, x)
        for j in range(n):
            v = x[j]
            u = c0 * (v + ((c1 * v) * v) * v)
            t = np.float32(tanh64(np.float64(u)))
            x[j] = (half * v) * (one + t)
        write_row(mem, args[2] - base + i * args[3], n, DT_FP16, x)
    return OK


@kjit_inline
def _rate(dt0, dt1, dt2, desc):  # type: ignore[no-untyped-def]
    if dt0 == DT_FP16 and dt1 == DT_FP16 and dt2 == DT_FP16:
        return desc[D_VEC_FP16]
    return desc[D_VEC_FP32]


@kjit_inline
def add_stream(args, desc):  # type: ignore[no-untyped-def]
    return vector_cycles(max(args[6], 1), max(args[7], 1), 1,
                         _rate(args[8], args[9], args[10], desc), desc)


@kjit_inline
def bias_add_stream(args, desc):  # type: ignore[no-untyped-def]
    return vector_cycles(max(args[5], 1), max(args[6], 1), 1,
                         _rate(args[7], args[8], DT_FP16, desc), desc)


@kjit_inline
def gelu_stream(args, desc):  # type: ignore[no-untyped-def]
    return vector_cycles(max(args[4], 1), max(args[5], 1), GELU_PASSES, desc[D_VEC_FP32], desc)


@kjit_inline
def add_regions(args, out):  # type: ignore[no-untyped-def]
    """ADD regions: a, b read; c written."""
    m, n = args[6], args[7]
    i = put_region(out, 0, args[0], 1, 0, m, args[1], n * dtype_bytes(args[8]), 0)
    i = put_region(out, i, args[2], 1, 0, m, args[3], n * dtype_bytes(args[9]), 0)
    return put_region(out, i, args[4], 1, 0, m, args[5], n * dtype_bytes(args[10]), 1)


@kjit_inline
def bias_add_regions(args, out):  # type: ignore[no-untyped-def]
    """BIAS_ADD regions: x, bias read; y written."""
    m, n = args[5], args[6]
    i = put_region(out, 0, args[0], 1, 0, m, args[1], n * dtype_bytes(args[7]), 0)
    i = put_region(out, i, args[2], 1, 0, 1, 0, n * 2, 0)
    return put_region(out, i, args[3], 1, 0, m, args[4], n * dtype_bytes(args[8]), 1)


@kjit_inline
def gelu_regions(args, out):  # type: ignore[no-untyped-def]
    """GELU regions: x read; y written (fp16)."""
    m, n = args[4], args[5]
    i = put_region(out, 0, args[0], 1, 0, m, args[1], n * 2, 0)
    return put_region(out, i, args[2], 1, 0, m, args[3], n * 2, 1)
