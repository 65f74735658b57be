"""Elementwise vector kernels: ADD (id 4), BIAS_ADD (id 5), GELU (id 7).

Numerics follow kernels.formulas: operands decoded exactly to float32, one
float32 operation (add) or the GELU tanh formula, one rounding at the output.
Rows are processed one at a time (read a row, compute, write it), so y may
alias x.

Cycle models (the IPU21 kernels' structure):

- ADD / BIAS_ADD: the elements are split over the workers in vector groups
  of `lanes` = vector_bytes / element bytes (4 fp16, 2 fp32; fp8 operands are
  widened to fp16).  A block whose operands are all contiguous is one run of
  M * N elements through the pipelined loop, `add_slots` slots per group;
  otherwise (a broadcast operand — the bias, a row-periodic b — or strided
  rows) the row-by-row loop runs, `add_row_slots` per group and `add_row`
  cycles per further row:

      contiguous: ceil(M N / (workers * lanes)) * workers * add_slots
      rows:       M * ceil(N / (workers * lanes)) * workers * add_row_slots
                  + (M - 1) * add_row
- GELU: the elements are dealt to the workers in blocks of `gelu_block_elems`.
  A whole number of blocks takes the fast path, `gelu_block` cycles per block
  on the busiest worker.  Otherwise (a tail of n mod block elements) every
  block costs `gelu_tail_block` and the worker after the last block also runs
  the tail, `gelu_pair` per pair plus `gelu_tail_setup`; the call waits for
  the busiest worker.  So a row with a tail can cost more than a longer row
  without one (measured: 94 elements 1,182 cycles, 96 elements 792); the model
  is monotone in whole blocks and in rows.  Each further non-contiguous row
  costs `gelu_row`.
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_row, write_row
from kernels.cost import ceil_div, contiguous, put_region, vector_pass
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes
from kernels.formulas import GELU_C0, GELU_C1
from kernels.status import BAD_DTYPE, BAD_SHAPE, OK
from kernels.tile import (
    D_ADD_CALL,
    D_ADD_ROW,
    D_ADD_ROW_SLOTS,
    D_ADD_SLOTS,
    D_GELU_BLOCK,
    D_GELU_BLOCK_ELEMS,
    D_GELU_CALL,
    D_GELU_PAIR,
    D_GELU_ROW,
    D_GELU_TAIL_BLOCK,
    D_GELU_TAIL_SETUP,
    D_VECTOR_BYTES,
    D_WORKERS,
)
from kernels.transcend import tanh64
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
AD = ARGS.ADD
BA = ARGS.BIAS_ADD
GE = ARGS.GELU


@kjit
def _valid_dtype(dt):  # type: ignore[no-untyped-def]
    return dt >= 0 and dt <= DT_FP32


@kjit
def add_check(args):  # type: ignore[no-untyped-def]
    """ADD argument check (kernels.status code)."""
    if args[AD.M] < 1 or args[AD.N] < 1:
        return BAD_SHAPE
    if not (_valid_dtype(args[AD.dtype_a]) and _valid_dtype(args[AD.dtype_b])
            and _valid_dtype(args[AD.dtype_c])):
        return BAD_DTYPE
    return OK


@kjit
def add_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """ADD: c = a + b in float32, rounded once to dtype_c."""
    m, n = args[AD.M], args[AD.N]
    st = add_check(args)
    if st != OK:
        return st
    a = np.empty(n, dtype=np.float32)
    b = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[AD.a] - base + i * args[AD.lda], n, args[AD.dtype_a], a)
        read_row(mem, args[AD.b] - base + i * args[AD.ldb], n, args[AD.dtype_b], b)
        for j in range(n):
            a[j] = a[j] + b[j]
        write_row(mem, args[AD.c] - base + i * args[AD.ldc], n, args[AD.dtype_c], a)
    return OK


@kjit
def bias_add_check(args):  # type: ignore[no-untyped-def]
    """BIAS_ADD argument check (kernels.status code)."""
    if args[BA.M] < 1 or args[BA.N] < 1:
        return BAD_SHAPE
    if not (_valid_dtype(args[BA.dtype_x]) and _valid_dtype(args[BA.dtype_y])):
        return BAD_DTYPE
    return OK


@kjit
def bias_add_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """BIAS_ADD: y = x + bias (fp16[N]) in float32, rounded once to dtype_y."""
    m, n = args[BA.M], args[BA.N]
    st = bias_add_check(args)
    if st != OK:
        return st
    bias = np.empty(n, dtype=np.float32)
    read_row(mem, args[BA.bias] - base, n, DT_FP16, bias)
    x = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[BA.x] - base + i * args[BA.ldx], n, args[BA.dtype_x], x)
        for j in range(n):
            x[j] = x[j] + bias[j]
        write_row(mem, args[BA.y] - base + i * args[BA.ldy], n, args[BA.dtype_y], x)
    return OK


@kjit
def gelu_check(args):  # type: ignore[no-untyped-def]
    """GELU argument check (kernels.status code)."""
    return BAD_SHAPE if args[GE.M] < 1 or args[GE.N] < 1 else OK


@kjit
def gelu_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """GELU (tanh form, kernels.formulas.gelu) on fp16 rows, fp16 out."""
    m, n = args[GE.M], args[GE.N]
    if gelu_check(args) != OK:
        return BAD_SHAPE
    x = np.empty(n, dtype=np.float32)
    half = np.float32(0.5)
    one = np.float32(1.0)
    c0 = np.float32(GELU_C0)
    c1 = np.float32(GELU_C1)
    for i in range(m):
        read_row(mem, args[GE.x] - base + i * args[GE.ldx], n, DT_FP16, x)
        for j in range(n):
            v = x[j]
            u = c0 * (v + ((c1 * v) * v) * v)
            t = np.float32(tanh64(np.float64(u)))
            x[j] = (half * v) * (one + t)
        write_row(mem, args[GE.y] - base + i * args[GE.ldy], n, DT_FP16, x)
    return OK


@kjit_inline
def _lanes(dt0, dt1, dt2, desc):  # type: ignore[no-untyped-def]
    widest = max(2, dtype_bytes(dt0), dtype_bytes(dt1), dtype_bytes(dt2))
    return max(desc[D_VECTOR_BYTES] // widest, 1)


@kjit_inline
def add_work(rows, cols, lanes, desc):  # type: ignore[no-untyped-def]
    """Work cycles of an elementwise add of rows x cols (ADD constants); one
    row is the contiguous (pipelined) path."""
    if rows == 1:
        return vector_pass(1, cols, lanes, desc[D_ADD_SLOTS], 0, desc)
    return vector_pass(rows, cols, lanes, desc[D_ADD_ROW_SLOTS], desc[D_ADD_ROW], desc)


@kjit_inline
def add_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of an ADD vertex (module docstring)."""
    m, n = max(args[AD.M], 1), max(args[AD.N], 1)
    if not (_valid_dtype(args[AD.dtype_a]) and _valid_dtype(args[AD.dtype_b])
            and _valid_dtype(args[AD.dtype_c])):
        return desc[D_ADD_CALL], add_work(m, n, 1, desc)
    if (contiguous(m, args[AD.lda], n * dtype_bytes(args[AD.dtype_a]))
            and contiguous(m, args[AD.ldb], n * dtype_bytes(args[AD.dtype_b]))
            and contiguous(m, args[AD.ldc], n * dtype_bytes(args[AD.dtype_c]))):
        m, n = 1, m * n
    lanes = _lanes(args[AD.dtype_a], args[AD.dtype_b], args[AD.dtype_c], desc)
    return desc[D_ADD_CALL], add_work(m, n, lanes, desc)


@kjit_inline
def bias_add_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a BIAS_ADD vertex: the bias row is broadcast."""
    m, n = max(args[BA.M], 1), max(args[BA.N], 1)
    if not (_valid_dtype(args[BA.dtype_x]) and _valid_dtype(args[BA.dtype_y])):
        return desc[D_ADD_CALL], add_work(m, n, 1, desc)
    lanes = _lanes(args[BA.dtype_x], args[BA.dtype_y], DT_FP16, desc)
    return desc[D_ADD_CALL], add_work(m, n, lanes, desc)


@kjit_inline
def gelu_row_work(n, desc):  # type: ignore[no-untyped-def]
    """Busiest-worker cycles of GELU over one contiguous run of n elements."""
    w = desc[D_WORKERS]
    nb = n // desc[D_GELU_BLOCK_ELEMS]
    rem = n - nb * desc[D_GELU_BLOCK_ELEMS]
    if rem == 0:
        return desc[D_GELU_BLOCK] * ceil_div(nb, w)
    full, tail_worker = nb // w, nb % w
    others = desc[D_GELU_TAIL_BLOCK] * (full + (1 if tail_worker > 0 else 0))
    tail = (desc[D_GELU_TAIL_BLOCK] * full + desc[D_GELU_PAIR] * ((rem + 1) // 2)
            + desc[D_GELU_TAIL_SETUP])
    return max(others, tail)


@kjit_inline
def gelu_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a GELU vertex (module docstring)."""
    m, n = max(args[GE.M], 1), max(args[GE.N], 1)
    if contiguous(m, args[GE.ldx], 2 * n) and contiguous(m, args[GE.ldy], 2 * n):
        m, n = 1, m * n
    return desc[D_GELU_CALL], m * gelu_row_work(n, desc) + (m - 1) * desc[D_GELU_ROW]


@kjit_inline
def add_regions(args, out):  # type: ignore[no-untyped-def]
    """ADD regions: a, b read; c written."""
    m, n = args[AD.M], args[AD.N]
    ba, bb, bc = (dtype_bytes(args[AD.dtype_a]), dtype_bytes(args[AD.dtype_b]),
                  dtype_bytes(args[AD.dtype_c]))
    i = put_region(out, 0, args[AD.a], 1, 0, m, args[AD.lda], n * ba, 0)
    i = put_region(out, i, args[AD.b], 1, 0, m, args[AD.ldb], n * bb, 0)
    return put_region(out, i, args[AD.c], 1, 0, m, args[AD.ldc], n * bc, 1)


@kjit_inline
def bias_add_regions(args, out):  # type: ignore[no-untyped-def]
    """BIAS_ADD regions: x, bias read; y written."""
    m, n = args[BA.M], args[BA.N]
    bx, by = dtype_bytes(args[BA.dtype_x]), dtype_bytes(args[BA.dtype_y])
    i = put_region(out, 0, args[BA.x], 1, 0, m, args[BA.ldx], n * bx, 0)
    i = put_region(out, i, args[BA.bias], 1, 0, 1, 0, n * 2, 0)
    return put_region(out, i, args[BA.y], 1, 0, m, args[BA.ldy], n * by, 1)


@kjit_inline
def gelu_regions(args, out):  # type: ignore[no-untyped-def]
    """GELU regions: x read; y written (fp16)."""
    m, n = args[GE.M], args[GE.N]
    i = put_region(out, 0, args[GE.x], 1, 0, m, args[GE.ldx], n * 2, 0)
    return put_region(out, i, args[GE.y], 1, 0, m, args[GE.ldy], n * 2, 1)
