"""LAYERNORM (id 6) and RMSNORM (id 12): fp16 rows in, fp16 rows out, fp32 statistics.

Numerics = kernels.formulas.layernorm: mean = f32(sum64(x) / N) with a float64
row sum, d = x - mean in fp32, biased var = f32(sum64(d*d) / N) (second pass,
float64 squares and sum), then y = d / sqrt(var + eps) * gamma + beta in fp32,
rounded once to fp16.  The float64 sums make the statistics independent of the
summation order (kernels.formulas), so the kernel sums in four interleaved
partial sums.  eps arrives as the bits of a float32 in arg 8.

Cycle model (the IPU21 layernorm's structure): the six workers share each
row; a row costs `ln_row` (worker rendezvous, the row's statistics, 1/sqrt)
plus `ln_stats` per workers x 8 elements of the statistics pass and
`ln_chunk` per workers x 4 elements of the moments and apply passes:

    shared = rows * (ln_row + ln_stats * ceil(N / (8 w)) + ln_chunk * ceil(N / (4 w)))

With many rows the workers may instead take whole rows each (no sharing:
ceil(rows / w) rounds of ln_row + ln_stats * ceil(N / 8) + ln_chunk *
ceil(N / 4)); the kernel takes the cheaper.  cycles = ln_call + work.

RMSNORM (kernels.formulas.rmsnorm): ms = f32(sum64(x*x) / N), y = x /
sqrt(ms + eps) * gamma, rounded once to fp16.  Not measured: its model
borrows LAYERNORM's, which it is one pass short of.  Its statistics pass
sums squares (the `ln_stats` pass: the same loads, a multiply-accumulate
instead of an add), there is no mean to subtract and no moments pass, and its
apply pass has no beta: of `ln_chunk` (moments + apply) half remains:

    shared = rows * (ln_row + ln_stats * ceil(N / (8 w)) + ln_chunk / 2 * ceil(N / (4 w)))
"""

from __future__ import annotations

import math

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_row, write_row
from kernels.cost import ceil_div, put_region
from kernels.dtypes import DT_FP16, u32_as_f32
from kernels.status import BAD_SHAPE, OK
from kernels.tile import D_LN_CALL, D_LN_CHUNK, D_LN_ROW, D_LN_STATS, D_WORKERS
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
LN = ARGS.LAYERNORM
RN = ARGS.RMSNORM


@kjit_inline
def _sq(a, square):  # type: ignore[no-untyped-def]
    return a * a if square else a


@kjit_inline
def _sum64(x, n, square):  # type: ignore[no-untyped-def]
    """float64 sum of x[:n], or of x[:n]**2 if `square`, in four interleaved
    partial sums: the order does not change the float32 statistic
    (kernels.formulas), and four independent add chains pipeline (1.5x faster
    than one chain)."""
    s0 = s1 = s2 = s3 = 0.0
    j = 0
    while j + 4 <= n:
        s0 += _sq(np.float64(x[j]), square)
        s1 += _sq(np.float64(x[j + 1]), square)
        s2 += _sq(np.float64(x[j + 2]), square)
        s3 += _sq(np.float64(x[j + 3]), square)
        j += 4
    while j < n:
        s0 += _sq(np.float64(x[j]), square)
        j += 1
    return (s0 + s1) + (s2 + s3)


@kjit
def layernorm_check(args):  # type: ignore[no-untyped-def]
    """LAYERNORM argument check (kernels.status code)."""
    return BAD_SHAPE if args[LN.M] < 1 or args[LN.N] < 1 else OK


@kjit
def layernorm_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """LAYERNORM numeric body; returns a kernels.status code."""
    m, n = args[LN.M], args[LN.N]
    if layernorm_check(args) != OK:
        return BAD_SHAPE
    eps = u32_as_f32(args[LN.eps])
    gamma = np.empty(n, dtype=np.float32)
    beta = np.empty(n, dtype=np.float32)
    read_row(mem, args[LN.gamma] - base, n, DT_FP16, gamma)
    read_row(mem, args[LN.beta] - base, n, DT_FP16, beta)
    x = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[LN.x] - base + i * args[LN.ldx], n, DT_FP16, x)
        mean = np.float32(_sum64(x, n, False) / n)
        for j in range(n):
            x[j] = x[j] - mean
        var = np.float32(_sum64(x, n, True) / n)
        den = np.float32(math.sqrt(var + eps))
        for j in range(n):
            x[j] = (x[j] / den) * gamma[j] + beta[j]
        write_row(mem, args[LN.y] - base + i * args[LN.ldy], n, DT_FP16, x)
    return OK


@kjit_inline
def _norm_work(m, n, chunk, desc):  # type: ignore[no-untyped-def]
    """Work of a row normalisation of m x n with `chunk` cycles per workers x 4
    elements of its apply passes (module docstring): shared rows or whole rows."""
    w, row, stats = desc[D_WORKERS], desc[D_LN_ROW], desc[D_LN_STATS]
    shared = m * (row + stats * ceil_div(n, 8 * w) + chunk * ceil_div(n, 4 * w))
    whole = ceil_div(m, w) * (row + stats * ceil_div(n, 8) + chunk * ceil_div(n, 4))
    return min(shared, whole)


@kjit_inline
def layernorm_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a LAYERNORM vertex (module docstring)."""
    m, n = max(args[LN.M], 1), max(args[LN.N], 1)
    return desc[D_LN_CALL], _norm_work(m, n, desc[D_LN_CHUNK], desc)


@kjit_inline
def layernorm_regions(args, out):  # type: ignore[no-untyped-def]
    """LAYERNORM regions: x, gamma, beta read; y written (all fp16)."""
    m, n = args[LN.M], args[LN.N]
    i = put_region(out, 0, args[LN.x], 1, 0, m, args[LN.ldx], n * 2, 0)
    i = put_region(out, i, args[LN.gamma], 1, 0, 1, 0, n * 2, 0)
    i = put_region(out, i, args[LN.beta], 1, 0, 1, 0, n * 2, 0)
    return put_region(out, i, args[LN.y], 1, 0, m, args[LN.ldy], n * 2, 1)


@kjit
def rmsnorm_check(args):  # type: ignore[no-untyped-def]
    """RMSNORM argument check (kernels.status code)."""
    return BAD_SHAPE if args[RN.M] < 1 or args[RN.N] < 1 else OK


@kjit
def rmsnorm_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """RMSNORM numeric body; returns a kernels.status code."""
    m, n = args[RN.M], args[RN.N]
    if rmsnorm_check(args) != OK:
        return BAD_SHAPE
    eps = u32_as_f32(args[RN.eps])
    gamma = np.empty(n, dtype=np.float32)
    read_row(mem, args[RN.gamma] - base, n, DT_FP16, gamma)
    x = np.empty(n, dtype=np.float32)
    for i in range(m):
        read_row(mem, args[RN.x] - base + i * args[RN.ldx], n, DT_FP16, x)
        ms = np.float32(_sum64(x, n, True) / n)
        den = np.float32(math.sqrt(ms + eps))
        for j in range(n):
            x[j] = (x[j] / den) * gamma[j]
        write_row(mem, args[RN.y] - base + i * args[RN.ldy], n, DT_FP16, x)
    return OK


@kjit_inline
def rmsnorm_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of an RMSNORM vertex (module docstring)."""
    m, n = max(args[RN.M], 1), max(args[RN.N], 1)
    return desc[D_LN_CALL], _norm_work(m, n, desc[D_LN_CHUNK] // 2, desc)


@kjit_inline
def rmsnorm_regions(args, out):  # type: ignore[no-untyped-def]
    """RMSNORM regions: x, gamma read; y written (all fp16)."""
    m, n = args[RN.M], args[RN.N]
    i = put_region(out, 0, args[RN.x], 1, 0, m, args[RN.ldx], n * 2, 0)
    i = put_region(out, i, args[RN.gamma], 1, 0, 1, 0, n * 2, 0)
    return put_region(out, i, args[RN.y], 1, 0, m, args[RN.ldy], n * 2, 1)
