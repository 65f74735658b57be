"""SOFTMAX (id 8): row softmax of x*scale, fp32 inside, max-subtracted.

Numerics = kernels.formulas.softmax: z = x*scale (fp32; scale arrives as the
bits of a float32 in arg 6), e = f32(exp(f64(z - max z))) with the exp of
kernels.transcend, s = f32(sum(e)) with a float64 row sum (independent of
the summation order, kernels.formulas; four interleaved partial sums here),
y = e / s in fp32, rounded once to dtype_y.

Cycle model (kernels.cost): rows split over the workers at 1/workers of the
fp32 vector rate, SOFTMAX_PASSES vector ops per element (scale, max, subtract,
exp on the hardware transcendental unit, sum, divide) plus SOFTMAX_ROW_INSTRS
scalar instructions per row (horizontal max and sum), each one worker issue
slot = `workers` cycles.
"""

from __future__ import annotations

import numpy as np

from kernels.blocks import read_row, write_row
from kernels.cost import put_region, vector_cycles, worker_rows
from kernels.dtypes import DT_FP32, dtype_bytes, u32_as_f32
from kernels.jit import kjit, kjit_inline
from kernels.status import BAD_DTYPE, BAD_SHAPE, OK
from kernels.tile import D_VEC_FP32, D_WORKERS
from kernels.transcend import exp_nonpos

SOFTMAX_PASSES = 6
SOFTMAX_ROW_INSTRS = 6


@kjit_inline
def _sum64(x, n):  # type: ignore[no-untyped-def]
    """float64 sum of x[:n] in four interleaved partial sums (the order does not
    change the float32 sum, kernels.formulas; four add chains pipeline)."""
    s0 = s1 = s2 = s3 = 0.0
    j = 0
    while j + 4 <= n:
        s0 += np.float64(x[j])
        s1 += np.float64(x[j + 1])
        s2 += np.float64(x[j + 2])
        s3 += np.float64(x[j + 3])
        j += 4
    while j < n:
        s0 += np.float64(x[j])
        j += 1
    return (s0 + s1) + (s2 + s3)


@kjit
def softmax_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """SOFTMAX numeric body; returns a kernels.status code."""
    m, n = args[4], args[5]
    if m < 1 or n < 1:
        return BAD_SHAPE
    if args[7] < 0 or args[7] > DT_FP32 or args[8] < 0 or args[8] > DT_FP32:
        return BAD_DTYPE
    scale = u32_as_f32(args[6])
    x = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[0] - base + i * args[1], n, args[7], x)
        for j in range(n):
            x[j] = x[j] * scale
        mx = x[0]
        for j in range(1, n):
            if x[j] > mx:
                mx = x[j]
        for j in range(n):  # independent per element: vectorizes
            x[j] = np.float32(exp_nonpos(np.float64(x[j] - mx)))
        s = np.float32(_sum64(x, n))
        for j in range(n):
            x[j] = x[j] / s
        write_row(mem, args[2] - base + i * args[3], n, args[8], x)
    return OK


@kjit_inline
def softmax_stream(args, desc):  # type: ignore[no-untyped-def]
    m = max(args[4], 1)
    vec = vector_cycles(m, max(args[5], 1), SOFTMAX_PASSES, desc[D_VEC_FP32], desc)
    return vec + worker_rows(m, desc) * SOFTMAX_ROW_INSTRS * desc[D_WORKERS]


@kjit_inline
def softmax_regions(args, out):  # type: ignore[no-untyped-def]
    """SOFTMAX regions: x read; y written."""
    m, n = args[4], args[5]
    i = put_region(out, 0, args[0], 1, 0, m, args[1], n * dtype_bytes(args[7]), 0)
    return put_region(out, i, args[2], 1, 0, m, args[3], n * dtype_bytes(args[8]), 1)
