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

from kernels.blocks import read_row, write_row
from kernels.cost import ceil_div, contiguous, put_region, vector_pass
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes
from kernels.formulas import GELU_C0, GELU_C1
from kernels.jit import kjit, kjit_inline
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
    m, n = max(args[6], 1), max(args[7], 1)
    if not (_valid_dtype(args[8]) and _valid_dtype(args[9]) and _valid_dtype(args[10])):
        return desc[D_ADD_CALL], add_work(m, n, 1, desc)
    if (contiguous(m, args[1], n * dtype_bytes(args[8]))
            and contiguous(m, args[3], n * dtype_bytes(args[9]))
            and contiguous(m, args[5], n * dtype_bytes(args[10]))):
        m, n = 1, m * n
    return desc[D_ADD_CALL], add_work(m, n, _lanes(args[8], args[9], args[10], desc), desc)


@kjit_inline
def bias_add_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a BIAS_ADD vertex: the bias row is broadcast."""
    m, n = max(args[5], 1), max(args[6], 1)
    if not (_valid_dtype(args[7]) and _valid_dtype(args[8])):
        return desc[D_ADD_CALL], add_work(m, n, 1, desc)
    return desc[D_ADD_CALL], add_work(m, n, _lanes(args[7], args[8], DT_FP16, desc), desc)


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
    m, n = max(args[4], 1), max(args[5], 1)
    if contiguous(m, args[1], 2 * n) and contiguous(m, args[3], 2 * n):
        m, n = 1, m * n
    return desc[D_GELU_CALL], m * gelu_row_work(n, desc) + (m - 1) * desc[D_GELU_ROW]


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
