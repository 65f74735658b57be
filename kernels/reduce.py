"""REDUCE (id 3): sum of k partial blocks (K-split matmul partials), fp32 or fp16.

Numerics = kernels.formulas.reduce_parts: acc = part_0, acc = acc + part_j for
j = 1..k-1 in fp32, then + bias (fp16[N] decoded) if given, rounded once to
out_dtype.  Part j's row i starts at parts + j*part_stride + i*ld_parts; the
partials are fp32, or fp16 when `parts_fp16` is 1 (decoded exactly to fp32
before the sums).

The cycle model below is fitted to the published IPU21 reductions, which
read fp16 partials (the vendor matmul's "half" partials type); fp32 partials
are charged the same slots per chunk (an optimistic bound for them: they
load twice the bytes).

Cycle model (the IPU21 reduction's structure): the elements are split over
the workers in chunks of `reduce_grain`; a chunk costs `reduce_chunk` slots
(load the first partial, convert, store) plus `reduce_partial` slots per
further partial (the bias counts as one):

    work   = rows * ceil(cols / (workers * grain)) * workers
             * (reduce_chunk + reduce_partial * (k - 1 + bias))
    cycles = reduce_call + work

A block whose partials and output are contiguous is one row of M * N.
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_block, read_row, write_block
from kernels.cost import contiguous, put_region, vector_pass
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes
from kernels.status import BAD_DTYPE, BAD_SHAPE, OK
from kernels.tile import D_REDUCE_CALL, D_REDUCE_CHUNK, D_REDUCE_GRAIN, D_REDUCE_PARTIAL
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
RED = ARGS.REDUCE


@kjit
def reduce_check(args):  # type: ignore[no-untyped-def]
    """REDUCE argument check (kernels.status code)."""
    if args[RED.k] < 1 or args[RED.M] < 1 or args[RED.N] < 1:
        return BAD_SHAPE
    if args[RED.out_dtype] < 0 or args[RED.out_dtype] > DT_FP32:
        return BAD_DTYPE
    if args[RED.parts_fp16] != 0 and args[RED.parts_fp16] != 1:
        return BAD_DTYPE
    return OK


@kjit
def reduce_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """REDUCE numeric body; returns a kernels.status code."""
    k, m, n, out_dt = args[RED.k], args[RED.M], args[RED.N], args[RED.out_dtype]
    st = reduce_check(args)
    if st != OK:
        return st
    bias = np.zeros(n, dtype=np.float32)
    if args[RED.bias] != 0:
        read_row(mem, args[RED.bias] - base, n, DT_FP16, bias)
    # whole blocks (one flat pass each when dense), element order as a row loop
    parts = args[RED.parts] - base
    pdt = DT_FP16 if args[RED.parts_fp16] != 0 else DT_FP32
    acc = np.empty((m, n), dtype=np.float32)
    read_block(mem, parts, m, n, args[RED.ld_parts], pdt, acc)
    part = np.empty((m, n), dtype=np.float32)
    for j in range(1, k):
        read_block(mem, parts + j * args[RED.part_stride], m, n, args[RED.ld_parts], pdt, part)
        for i in range(m):
            for c in range(n):
                acc[i, c] = acc[i, c] + part[i, c]
    if args[RED.bias] != 0:
        for i in range(m):
            for c in range(n):
                acc[i, c] = acc[i, c] + bias[c]
    write_block(mem, args[RED.out] - base, m, n, args[RED.ldo], out_dt, acc)
    return OK


@kjit_inline
def reduce_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a REDUCE vertex (module docstring)."""
    m, n = max(args[RED.M], 1), max(args[RED.N], 1)
    extra = max(args[RED.k], 1) - 1 + (1 if args[RED.bias] != 0 else 0)
    per_chunk = desc[D_REDUCE_CHUNK] + desc[D_REDUCE_PARTIAL] * extra
    out_dt = args[RED.out_dtype]
    ob = dtype_bytes(out_dt) if out_dt >= 0 and out_dt <= DT_FP32 else 4
    pb = 2 if args[RED.parts_fp16] != 0 else 4
    if contiguous(m, args[RED.ld_parts], n * pb) and contiguous(m, args[RED.ldo], n * ob):
        m, n = 1, m * n
    return desc[D_REDUCE_CALL], vector_pass(m, n, desc[D_REDUCE_GRAIN], per_chunk, 0, desc)


@kjit_inline
def reduce_regions(args, out):  # type: ignore[no-untyped-def]
    """REDUCE regions: k partial blocks read, (bias read), out written."""
    m, n = args[RED.M], args[RED.N]
    pb = 2 if args[RED.parts_fp16] != 0 else 4
    i = put_region(out, 0, args[RED.parts], args[RED.k], args[RED.part_stride], m,
                   args[RED.ld_parts], n * pb, 0)
    if args[RED.bias] != 0:
        i = put_region(out, i, args[RED.bias], 1, 0, 1, 0, n * 2, 0)
    ob = dtype_bytes(args[RED.out_dtype])
    return put_region(out, i, args[RED.out], 1, 0, m, args[RED.ldo], n * ob, 1)
