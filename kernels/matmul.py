"""AMP matrix multiply: MATMUL (id 1) and BATCH_MATMUL (id 2), contracts §2.

Numerics (the reference's rounding points): operands fp8 e4m3fn or fp16 are
decoded exactly to float32, multiplied with a float32 BLAS gemm (fp32
accumulation; the order of the K sum is BLAS's), the fp32 result is scaled by
2**scale_exp (exact; BATCH_MATMUL carries it in flag bits 8-15), the fp16 bias
is added in fp32, in accumulate mode the old fp32 C is added (C_old + result),
and the sum is rounded once to out_dtype.

Cycle model (the AMP's structure, fitted to IPU21 GEMM measurements): B is
fed to the AMP in coefficient panels of `k grain` x `n grain` (K32 x N16 for
fp8, K16 x N16 for fp16: one 64-entry coefficient store); each panel costs a
fixed load `mm_panel` plus `mm_row` cycles per row of A streamed through it
(the six workers feed the rows together; below `mm_min_rows` rows the AMP
pipeline costs as many):

    panels = ceil(K / k_grain) * ceil(N / n_grain)
    work   = panels * (mm_panel + mm_row * max(M, mm_min_rows))   (x batch)
    cycles = mm_call + work (+ a fused bias / accumulate pass)

A fused bias is an add pass over the result at the output dtype's lanes and
accumulate mode an fp32 add of the old C (kernels.cost.vector_pass with the ADD constants).  The
output dtype does not change the AMP time (accumulation is fp32 either way).
"""

from __future__ import annotations

import math

import numpy as np

from kernels.abi import ARGS, FLAG_ACCUMULATE, FLAG_SCALE_MASK, FLAG_SCALE_SHIFT, FLAG_TRANS_B
from kernels.blocks import read_block, read_row, write_block
from kernels.cost import ceil_div, put_region, vector_pass
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, dtype_bytes
from kernels.status import BAD_DTYPE, BAD_FLAGS, BAD_SHAPE, BAD_STRIDE, OK
from kernels.tile import (
    D_ADD_SLOTS,
    D_MM_CALL,
    D_MM_K_GRAIN_FP8,
    D_MM_K_GRAIN_FP16,
    D_MM_MIN_ROWS,
    D_MM_N_GRAIN,
    D_MM_PANEL,
    D_MM_ROW,
    D_VECTOR_BYTES,
)
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
BMM = ARGS.BATCH_MATMUL
MM = ARGS.MATMUL


@kjit
def _check(lda, ldb, ldc, m, k, n, in_dt, out_dt, flags, allowed_flags):  # type: ignore[no-untyped-def]
    if m < 1 or k < 1 or n < 1:
        return BAD_SHAPE
    if in_dt != DT_FP8 and in_dt != DT_FP16:
        return BAD_DTYPE
    if out_dt != DT_FP16 and out_dt != DT_FP32:
        return BAD_DTYPE
    if (flags & ~allowed_flags) != 0:
        return BAD_FLAGS
    if (flags & FLAG_ACCUMULATE) != 0 and out_dt != DT_FP32:
        return BAD_FLAGS
    ib = dtype_bytes(in_dt)
    b_row = k * ib if (flags & FLAG_TRANS_B) != 0 else n * ib
    if (m > 1 and lda < k * ib) or (ldc < n * dtype_bytes(out_dt) and m > 1):
        return BAD_STRIDE
    b_rows = n if (flags & FLAG_TRANS_B) != 0 else k
    if b_rows > 1 and ldb < b_row:
        return BAD_STRIDE
    return OK


@kjit
def _gemm(mem, a_off, lda, b_off, ldb, m, k, n, in_dt, trans_b):  # type: ignore[no-untyped-def]
    """float32 [m, n] = decoded A @ decoded B (B given as N x K if trans_b)."""
    a = np.empty((m, k), dtype=np.float32)
    read_block(mem, a_off, m, k, lda, in_dt, a)
    if trans_b:
        bt = np.empty((n, k), dtype=np.float32)
        read_block(mem, b_off, n, k, ldb, in_dt, bt)
        return np.dot(a, bt.T)  # F-ordered view: BLAS transposes, no copy
    b = np.empty((k, n), dtype=np.float32)
    read_block(mem, b_off, k, n, ldb, in_dt, b)
    return np.dot(a, b)


@kjit
def matmul_check(args):  # type: ignore[no-untyped-def]
    """MATMUL argument check (kernels.status code): what execute, the engine
    and the verifier all apply."""
    return _check(args[MM.lda], args[MM.ldb], args[MM.ldc], args[MM.M], args[MM.K],
                  args[MM.N], args[MM.in_dtype], args[MM.out_dtype], args[MM.flags],
                  FLAG_TRANS_B | FLAG_ACCUMULATE)


@kjit
def matmul_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """MATMUL numeric body; returns a kernels.status code."""
    m, k, n = args[MM.M], args[MM.K], args[MM.N]
    in_dt, out_dt, flags = args[MM.in_dtype], args[MM.out_dtype], args[MM.flags]
    st = matmul_check(args)
    if st != OK:
        return st
    r = _gemm(mem, args[MM.a] - base, args[MM.lda], args[MM.b] - base, args[MM.ldb], m, k, n, in_dt,
              (flags & FLAG_TRANS_B) != 0)
    if args[MM.scale_exp] != 0:
        s = np.float32(math.ldexp(1.0, int(args[MM.scale_exp])))
        for i in range(m):
            for j in range(n):
                r[i, j] = r[i, j] * s
    if args[MM.bias] != 0:
        bias = np.empty(n, dtype=np.float32)
        read_row(mem, args[MM.bias] - base, n, DT_FP16, bias)
        for i in range(m):
            for j in range(n):
                r[i, j] = r[i, j] + bias[j]
    c_off = args[MM.c] - base
    if (flags & FLAG_ACCUMULATE) != 0:
        old = np.empty((m, n), dtype=np.float32)
        read_block(mem, c_off, m, n, args[MM.ldc], DT_FP32, old)
        for i in range(m):
            for j in range(n):
                r[i, j] = old[i, j] + r[i, j]
    write_block(mem, c_off, m, n, args[MM.ldc], out_dt, r)
    return OK


@kjit
def batch_matmul_check(args):  # type: ignore[no-untyped-def]
    """BATCH_MATMUL argument check (kernels.status code)."""
    st = _check(args[BMM.lda], args[BMM.ldb], args[BMM.ldc], args[BMM.M], args[BMM.K],
                args[BMM.N], args[BMM.in_dtype], args[BMM.out_dtype], args[BMM.flags],
                FLAG_TRANS_B | FLAG_SCALE_MASK)
    if st == OK and args[BMM.batch] < 1:
        return BAD_SHAPE
    return st


@kjit
def batch_matmul_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """BATCH_MATMUL numeric body; returns a kernels.status code."""
    m, k, n = args[BMM.M], args[BMM.K], args[BMM.N]
    in_dt, out_dt = args[BMM.in_dtype], args[BMM.out_dtype]
    flags, batch = args[BMM.flags], args[BMM.batch]
    st = batch_matmul_check(args)
    if st != OK:
        return st
    e = (flags & FLAG_SCALE_MASK) >> FLAG_SCALE_SHIFT
    s = np.float32(math.ldexp(1.0, int(e - 256 if e >= 128 else e)))
    for t in range(batch):
        r = _gemm(mem, args[BMM.a] - base + t * args[BMM.batch_stride_a], args[BMM.lda],
                  args[BMM.b] - base + t * args[BMM.batch_stride_b], args[BMM.ldb], m, k, n,
                  in_dt, (flags & FLAG_TRANS_B) != 0)
        if e != 0:
            for i in range(m):
                for j in range(n):
                    r[i, j] = r[i, j] * s
        write_block(mem, args[BMM.c] - base + t * args[BMM.batch_stride_c], m, n,
                    args[BMM.ldc], out_dt, r)
    return OK


@kjit_inline
def _panels_work(rows, k, n, in_dt, desc):  # type: ignore[no-untyped-def]
    kg = desc[D_MM_K_GRAIN_FP8] if in_dt == DT_FP8 else desc[D_MM_K_GRAIN_FP16]
    panels = ceil_div(k, kg) * ceil_div(n, desc[D_MM_N_GRAIN])
    return panels * (desc[D_MM_PANEL] + desc[D_MM_ROW] * max(rows, desc[D_MM_MIN_ROWS]))


@kjit_inline
def _add_pass(rows, n, elem_bytes, desc):  # type: ignore[no-untyped-def]
    """An add pass over rows x n results of `elem_bytes` (bias or accumulate)."""
    grain = max(desc[D_VECTOR_BYTES] // max(elem_bytes, 2), 1)
    return vector_pass(1, rows * n, grain, desc[D_ADD_SLOTS], 0, desc)


@kjit_inline
def matmul_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a MATMUL vertex (module docstring)."""
    m, k, n = max(args[MM.M], 1), max(args[MM.K], 1), max(args[MM.N], 1)
    work = _panels_work(m, k, n, args[MM.in_dtype], desc)
    if args[MM.bias] != 0:
        work += _add_pass(m, n, 4 if args[MM.out_dtype] == DT_FP32 else 2, desc)
    if (args[MM.flags] & FLAG_ACCUMULATE) != 0:
        work += _add_pass(m, n, 4, desc)
    return desc[D_MM_CALL], work


@kjit_inline
def batch_matmul_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a BATCH_MATMUL vertex: `batch` GEMMs of M rows."""
    batch = max(args[BMM.batch], 1)
    return desc[D_MM_CALL], batch * _panels_work(max(args[BMM.M], 1), max(args[BMM.K], 1),
                                                 max(args[BMM.N], 1), args[BMM.in_dtype], desc)


@kjit_inline
def _b_region(args, out, i, outer, outer_stride):  # type: ignore[no-untyped-def]
    ib = dtype_bytes(args[MM.in_dtype])
    k, n = args[MM.K], args[MM.N]
    if (args[MM.flags] & FLAG_TRANS_B) != 0:
        return put_region(out, i, args[MM.b], outer, outer_stride, n, args[MM.ldb], k * ib, 0)
    return put_region(out, i, args[MM.b], outer, outer_stride, k, args[MM.ldb], n * ib, 0)


@kjit_inline
def matmul_regions(args, out):  # type: ignore[no-untyped-def]
    """Regions of a MATMUL vertex: A, B, (bias), (C read if accumulate), C write."""
    ib = dtype_bytes(args[MM.in_dtype])
    ob = dtype_bytes(args[MM.out_dtype])
    i = put_region(out, 0, args[MM.a], 1, 0, args[MM.M], args[MM.lda], args[MM.K] * ib, 0)
    i = _b_region(args, out, i, 1, 0)
    if args[MM.bias] != 0:
        i = put_region(out, i, args[MM.bias], 1, 0, 1, 0, args[MM.N] * 2, 0)
    if (args[MM.flags] & FLAG_ACCUMULATE) != 0:
        i = put_region(out, i, args[MM.c], 1, 0, args[MM.M], args[MM.ldc], args[MM.N] * ob, 0)
    return put_region(out, i, args[MM.c], 1, 0, args[MM.M], args[MM.ldc], args[MM.N] * ob, 1)


@kjit_inline
def batch_matmul_regions(args, out):  # type: ignore[no-untyped-def]
    """Regions of a BATCH_MATMUL vertex: A, B, C, each `batch` blocks apart."""
    ib = dtype_bytes(args[BMM.in_dtype])
    ob = dtype_bytes(args[BMM.out_dtype])
    batch, m = args[BMM.batch], args[BMM.M]
    i = put_region(out, 0, args[BMM.a], batch, args[BMM.batch_stride_a], m, args[BMM.lda],
                   args[BMM.K] * ib, 0)
    i = _b_region(args, out, i, batch, args[BMM.batch_stride_b])
    return put_region(out, i, args[BMM.c], batch, args[BMM.batch_stride_c], m, args[BMM.ldc],
                      args[BMM.N] * ob, 1)
