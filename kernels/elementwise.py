"""Elementwise vector kernels: ADD (id 4), BIAS_ADD (id 5), GELU (id 7).

Numerics follow kernels.formulas: operands decoded exactly to float32, one
float32 operation (add) or the activation's formula, one rounding at the
output.  Rows are processed one at a time (read a row, compute, write it), so
y may alias x.

GELU is the activation kernel: arg `form` picks the function (formulas.ACT_*:
0 the tanh-form GELU, 1 the exact erf-form GELU, 2 CLIP's quick GELU x ·
sigmoid(1.702 x), 3 SiLU x · sigmoid(x), 4 tanh), and a non-zero `b` (fp16
rows at stride `ldb`) multiplies the result by b (the gated MLP's product,
SwiGLU = silu(gate) · up), one float32 multiply before the rounding.  Packages
saved before `form` existed have 0 there: the tanh form, no gate.

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
  Only the tanh form was measured.  The other forms borrow this structure
  (the same workers, blocks, tails and rows) with a block's cost
  interpolated by the vector operations per element between two measured
  kernels: ADD (1 operation: `add_slots` per group of lanes, A cycles for a
  block) and the tanh GELU (ACT_OPS = 9: x², x³, two scalings, an add, tanh,
  1 + t, 0.5x and the product): block(ops) = A + (gelu_block - A)(ops - 1)/8,
  likewise for `gelu_tail_block` and `gelu_pair`.  Operation counts
  (ACT_OPS): erf GELU 18 (no erf instruction: a rational approximation of
  ~13 operations, the exp of its tail and the GELU product), quick GELU 3
  (scale, sigmoid, multiply: the IPU's vector unit has a sigmoid instruction),
  SiLU 2, tanh 1 (the tanh instruction alone); a gate adds 1 (the multiply).
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_row, write_row
from kernels.cost import ceil_div, contiguous, put_region, vector_pass
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes
from kernels.formulas import (
    ACT_GELU_ERF,
    ACT_GELU_TANH,
    ACT_QUICK_GELU,
    ACT_SILU,
    ACT_TANH,
    GELU_C0,
    GELU_C1,
    QUICK_GELU,
    SQRT1_2,
)
from kernels.status import BAD_DTYPE, BAD_FLAGS, BAD_SHAPE, OK
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
from kernels.transcend import erf64, exp_nonpos, tanh64
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
AD = ARGS.ADD
BA = ARGS.BIAS_ADD
GE = ARGS.GELU

# vector operations per element of each activation form (module docstring)
ACT_OPS = (9, 18, 3, 2, 1)
GELU_OPS = ACT_OPS[ACT_GELU_TANH]  # the measured form


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
    """GELU (activation) argument check (kernels.status code)."""
    if args[GE.M] < 1 or args[GE.N] < 1:
        return BAD_SHAPE
    if args[GE.form] < ACT_GELU_TANH or args[GE.form] > ACT_TANH:
        return BAD_FLAGS
    return OK


@kjit_inline
def activation(form, v):  # type: ignore[no-untyped-def]
    """The activation `form` of float32 `v` (kernels.formulas, bit for bit)."""
    half = np.float32(0.5)
    one = np.float32(1.0)
    if form == ACT_GELU_TANH:
        u = np.float32(GELU_C0) * (v + ((np.float32(GELU_C1) * v) * v) * v)
        y = (half * v) * (one + np.float32(tanh64(np.float64(u))))
    elif form == ACT_GELU_ERF:
        t = np.float32(erf64(np.float64(v * np.float32(SQRT1_2))))
        y = (half * v) * (one + t)
    elif form == ACT_QUICK_GELU:
        z = np.float32(QUICK_GELU) * v
        y = v / (one + np.float32(exp_nonpos(np.float64(-z))))
    elif form == ACT_SILU:
        y = v / (one + np.float32(exp_nonpos(np.float64(-v))))
    else:
        y = np.float32(tanh64(np.float64(v)))
    return y


@kjit
def gelu_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """GELU (the activation `form`, optionally times the gate b) on fp16 rows,
    fp16 out (module docstring)."""
    m, n = args[GE.M], args[GE.N]
    st = gelu_check(args)
    if st != OK:
        return st
    form, gate = args[GE.form], args[GE.b] != 0
    x = np.empty(n, dtype=np.float32)
    b = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[GE.x] - base + i * args[GE.ldx], n, DT_FP16, x)
        if gate:
            read_row(mem, args[GE.b] - base + i * args[GE.ldb], n, DT_FP16, b)
            for j in range(n):
                x[j] = activation(form, x[j]) * b[j]
        else:
            for j in range(n):
                x[j] = activation(form, x[j])
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
def act_scaled(cycles, ops, desc):  # type: ignore[no-untyped-def]
    """A measured tanh-GELU block cost `cycles` for an activation of `ops`
    vector operations per element (module docstring): interpolated between
    ADD's cost of the same block (1 operation) and the GELU's (GELU_OPS)."""
    lanes = max(desc[D_VECTOR_BYTES] // 2, 1)
    a = desc[D_ADD_SLOTS] * desc[D_WORKERS] * ceil_div(desc[D_GELU_BLOCK_ELEMS], lanes)
    return a + (cycles - a) * (ops - 1) // (GELU_OPS - 1)


@kjit_inline
def gelu_row_work(n, ops, desc):  # type: ignore[no-untyped-def]
    """Busiest-worker cycles of an activation of `ops` operations per element
    over one contiguous run of n elements."""
    w = desc[D_WORKERS]
    nb = n // desc[D_GELU_BLOCK_ELEMS]
    rem = n - nb * desc[D_GELU_BLOCK_ELEMS]
    block = act_scaled(desc[D_GELU_BLOCK], ops, desc)
    tail_block = act_scaled(desc[D_GELU_TAIL_BLOCK], ops, desc)
    pair = act_scaled(desc[D_GELU_PAIR], ops, desc)
    full, tail_worker = nb // w, nb % w
    others = tail_block * (full + (1 if tail_worker > 0 else 0))
    tail = tail_block * full + pair * ((rem + 1) // 2) + desc[D_GELU_TAIL_SETUP]
    return block * ceil_div(nb, w) if rem == 0 else max(others, tail)


@kjit_inline
def gelu_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a GELU vertex (module docstring)."""
    m, n = max(args[GE.M], 1), max(args[GE.N], 1)
    form, gate = args[GE.form], args[GE.b] != 0
    ops = ACT_OPS[form] if form >= 0 and form < len(ACT_OPS) else GELU_OPS
    ops += 1 if gate else 0
    if (contiguous(m, args[GE.ldx], 2 * n) and contiguous(m, args[GE.ldy], 2 * n)
            and (not gate or contiguous(m, args[GE.ldb], 2 * n))):
        m, n = 1, m * n
    return desc[D_GELU_CALL], m * gelu_row_work(n, ops, desc) + (m - 1) * desc[D_GELU_ROW]


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
    """GELU regions: x (and the gate b) read; y written (fp16)."""
    m, n = args[GE.M], args[GE.N]
    i = put_region(out, 0, args[GE.x], 1, 0, m, args[GE.ldx], n * 2, 0)
    if args[GE.b] != 0:
        i = put_region(out, i, args[GE.b], 1, 0, m, args[GE.ldb], n * 2, 0)
    return put_region(out, i, args[GE.y], 1, 0, m, args[GE.ldy], n * 2, 1)
