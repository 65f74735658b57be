"""AMP matrix multiply: MATMUL (id 1) and BATCH_MATMUL (id 2), contracts §2.

Numerics (the reference's rounding points): operands fp8 e4m3fn or fp16 are
decoded exactly to float32, multiplied with a float32 BLAS gemm (fp32
accumulation; the order of the K sum is BLAS's), the fp32 result is scaled by
2**scale_exp (exact), the fp16 bias is added in fp32, in accumulate mode the
old fp32 C is added (C_old + result), and the sum is rounded once to out_dtype.

Cycle model (multi-worker vertex, see kernels.cost): the rows of C (batch * M
for BATCH_MATMUL) are split over the workers; the busiest worker runs the AMP
at 1/workers of the tile rate (128 fp8 / 64 fp16 MACs per cycle per tile on
the C600's IPU21 tiles).  The AMP consumes K in chunks of AMP_K_GRAIN (32 fp8
or 16 fp16 elements = 256 bits, the width of one AMP weight-load) and N in
chunks of AMP_N_GRAIN = 8 output columns, so a partial chunk costs a full one:

    mac  = ceil(rows_w * roundup(K, kg) * roundup(N, 8) * workers / amp_rate)
    io   = ceil(rows_w * (K*in_bytes + N*out_bytes*(2 if accumulate else 1))
                * workers / LDST_BYTES_PER_CYCLE)
    stream = max(mac, io)      (operand loads overlap the AMP pipeline)

B is held in the AMP's weight registers and re-reads of it are hidden, which is
what makes large blocks approach the peak; the `io` term makes low-K or
wide-output blocks store bound.
"""

from __future__ import annotations

import math

import numpy as np

from kernels.blocks import read_block, read_row, write_block
from kernels.cost import LDST_BYTES_PER_CYCLE as LDST
from kernels.cost import put_region, round_up, worker_cycles, worker_rows
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, dtype_bytes
from kernels.ids import FLAG_ACCUMULATE, FLAG_TRANS_B
from kernels.jit import kjit, kjit_inline
from kernels.status import BAD_DTYPE, BAD_FLAGS, BAD_SHAPE, BAD_STRIDE, OK
from kernels.tile import D_AMP_FP8, D_AMP_FP16

AMP_K_GRAIN_FP8 = 32
AMP_K_GRAIN_FP16 = 16
AMP_N_GRAIN = 8


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
def matmul_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """MATMUL numeric body; returns a kernels.status code."""
    m, k, n = args[6], args[7], args[8]
    in_dt, out_dt, flags = args[9], args[10], args[11]
    st = _check(args[1], args[3], args[5], m, k, n, in_dt, out_dt, flags,
                FLAG_TRANS_B | FLAG_ACCUMULATE)
    if st != OK:
        return st
    r = _gemm(mem, args[0] - base, args[1], args[2] - base, args[3], m, k, n, in_dt,
              (flags & FLAG_TRANS_B) != 0)
    if args[12] != 0:
        s = np.float32(math.ldexp(1.0, int(args[12])))
        for i in range(m):
            for j in range(n):
                r[i, j] = r[i, j] * s
    if args[13] != 0:
        bias = np.empty(n, dtype=np.float32)
        read_row(mem, args[13] - base, n, DT_FP16, bias)
        for i in range(m):
            for j in range(n):
                r[i, j] = r[i, j] + bias[j]
    c_off = args[4] - base
    if (flags & FLAG_ACCUMULATE) != 0:
        old = np.empty((m, n), dtype=np.float32)
        read_block(mem, c_off, m, n, args[5], DT_FP32, old)
        for i in range(m):
            for j in range(n):
                r[i, j] = old[i, j] + r[i, j]
    write_block(mem, c_off, m, n, args[5], out_dt, r)
    return OK


@kjit
def batch_matmul_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """BATCH_MATMUL numeric body; returns a kernels.status code."""
    m, k, n = args[6], args[7], args[8]
    in_dt, out_dt, flags, batch = args[9], args[10], args[11], args[12]
    st = _check(args[1], args[3], args[5], m, k, n, in_dt, out_dt, flags, FLAG_TRANS_B)
    if st != OK:
        return st
    if batch < 1:
        return BAD_SHAPE
    for t in range(batch):
        r = _gemm(mem, args[0] - base + t * args[13], args[1], args[2] - base + t * args[14],
                  args[3], m, k, n, in_dt, (flags & FLAG_TRANS_B) != 0)
        write_block(mem, args[4] - base + t * args[15], m, n, args[5], out_dt, r)
    return OK


@kjit_inline
def _stream(rows, k, n, in_dt, out_dt, accumulate, desc):  # type: ignore[no-untyped-def]
    if in_dt == DT_FP8:
        rate = desc[D_AMP_FP8]
        kg = AMP_K_GRAIN_FP8
    else:
        rate = desc[D_AMP_FP16]
        kg = AMP_K_GRAIN_FP16
    rw = worker_rows(rows, desc)
    mac = worker_cycles(rw * round_up(k, kg) * round_up(n, AMP_N_GRAIN), rate, desc)
    out_passes = 2 if accumulate else 1
    io_bytes = rw * (k * dtype_bytes(in_dt) + n * dtype_bytes(out_dt) * out_passes)
    return max(mac, worker_cycles(io_bytes, LDST, desc))


@kjit_inline
def matmul_stream(args, desc):  # type: ignore[no-untyped-def]
    """Busiest-worker streaming cycles of a MATMUL vertex (no overhead/conflict)."""
    return _stream(max(args[6], 1), max(args[7], 1), max(args[8], 1), args[9], args[10],
                   (args[11] & FLAG_ACCUMULATE) != 0, desc)


@kjit_inline
def batch_matmul_stream(args, desc):  # type: ignore[no-untyped-def]
    """Busiest-worker streaming cycles of a BATCH_MATMUL vertex (rows = batch * M)."""
    return _stream(max(args[6], 1) * max(args[12], 1), max(args[7], 1), max(args[8], 1),
                   args[9], args[10], False, desc)


@kjit_inline
def _b_region(args, out, i, outer, outer_stride):  # type: ignore[no-untyped-def]
    ib = dtype_bytes(args[9])
    if (args[11] & FLAG_TRANS_B) != 0:
        return put_region(out, i, args[2], outer, outer_stride, args[8], args[3], args[7] * ib, 0)
    return put_region(out, i, args[2], outer, outer_stride, args[7], args[3], args[8] * ib, 0)


@kjit_inline
def matmul_regions(args, out):  # type: ignore[no-untyped-def]
    """Regions of a MATMUL vertex: A, B, (bias), (C read if accumulate), C write."""
    ib = dtype_bytes(args[9])
    ob = dtype_bytes(args[10])
    i = put_region(out, 0, args[0], 1, 0, args[6], args[1], args[7] * ib, 0)
    i = _b_region(args, out, i, 1, 0)
    if args[13] != 0:
        i = put_region(out, i, args[13], 1, 0, 1, 0, args[8] * 2, 0)
    if (args[11] & FLAG_ACCUMULATE) != 0:
        i = put_region(out, i, args[4], 1, 0, args[6], args[5], args[8] * ob, 0)
    return put_region(out, i, args[4], 1, 0, args[6], args[5], args[8] * ob, 1)


@kjit_inline
def batch_matmul_regions(args, out):  # type: ignore[no-untyped-def]
    """Regions of a BATCH_MATMUL vertex: A, B, C, each `batch` blocks apart."""
    ib = dtype_bytes(args[9])
    ob = dtype_bytes(args[10])
    i = put_region(out, 0, args[0], args[12], args[13], args[6], args[1], args[7] * ib, 0)
    i = _b_region(args, out, i, args[12], args[14])
    return put_region(out, i, args[4], args[12], args[15], args[6], args[5], args[8] * ob, 1)
