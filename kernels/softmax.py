"""SOFTMAX (id 8): row softmax of x*scale, fp32 inside, max-subtracted.

Numerics = kernels.formulas.softmax: z = x*scale (fp32; scale arrives as the
bits of a float32 in arg 6), e = f32(exp(f64(z - max z))) with the exp of
kernels.transcend, s = f32(sum(e)) with a float64 row sum (independent of
the summation order, kernels.formulas; four interleaved partial sums here),
y = e / s in fp32, rounded once to dtype_y.

Cycle model (the IPU21 softmax's two measured paths, and the two back to back;
the kernel takes the cheapest):

- whole rows: each worker takes whole rows, rounds of `workers` rows; a row
  costs `softmax_row` slots plus `softmax_panel` slots per panel of
  `softmax_panel_keys` keys (max scan, exp, sum, scale):
      softmax_call + ceil(M / w) * w * (softmax_row + softmax_panel * ceil(N / keys))
- split rows: `softmax_split_rows` rows at a time, each shared by
  w / split_rows workers that take a slice of its keys and combine partial
  maxima and sums:
      softmax_split_call + ceil(M / split_rows) * w * (softmax_split_panel
      * ceil(N / (keys * w / split_rows)) + softmax_split_row)
      + ceil(M / w) * softmax_split_round
- mixed: the whole-rows path over the block's full rounds of `workers`
  rows, then the split-rows path over the rest: the two measured calls back
  to back, each with its call cost (8 rows on 6 workers: 6 whole rows in one
  round, 2 split, instead of a second whole round for 2 rows or 8 split):
      softmax_call + whole(first floor(M / w) * w rows)
      + softmax_split_call + split(the other M mod w rows)

Arg 9 `path` picks one (PATH_WHOLE 1, PATH_SPLIT 2, PATH_MIXED 3; 0, the
default, the cheapest); the numerics do not depend on it (the row sum is
order-free).

Masks (args 10-15; packages saved before them hold zeros: no mask, not
causal).  Row i of the block is row r = row0 + i of the whole softmax.
- `mask` (non-zero: an fp16 [mask_rows, N] additive mask, row stride `ldm`):
  row r adds mask row (r // mask_rep) % mask_rows to x*scale, one fp32 add
  (a key-padding mask [B, Tk] has mask_rep = heads·Tq; a [Tq, Tk] mask 1);
- `causal` = Tq (non-zero): row r is query q = r mod Tq and sees the first
  q + 1 + (N - Tq) keys; max, exp and sum run over those alone and the rest
  of the row is written 0 — the masked triangle's work is skipped.
Cost: each row's panels are counted over its valid keys, the rounds of
`workers` rows (whole) or `split_rows` rows (split) waiting for their
longest row; a mask adds one vector pass to the four of a panel (max, exp,
sum, scale: SOFTMAX_PASSES), so a masked panel costs 5/4 of one; writing the
zeros of the skipped keys costs one pass (1/4 panel) per skipped panel.
Not measured: the masked and causal paths borrow the measured softmax's
constants.
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ARGS
from kernels.blocks import read_row, write_row
from kernels.cost import ceil_div, put_region, slots
from kernels.dtypes import DT_FP16, DT_FP32, dtype_bytes, u32_as_f32
from kernels.status import BAD_DTYPE, BAD_FLAGS, BAD_SHAPE, OK
from kernels.tile import (
    D_SOFTMAX_CALL,
    D_SOFTMAX_PANEL,
    D_SOFTMAX_PANEL_KEYS,
    D_SOFTMAX_ROW,
    D_SOFTMAX_SPLIT_CALL,
    D_SOFTMAX_SPLIT_PANEL,
    D_SOFTMAX_SPLIT_ROUND,
    D_SOFTMAX_SPLIT_ROW,
    D_SOFTMAX_SPLIT_ROWS,
    D_WORKERS,
)
from kernels.transcend import exp_nonpos
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
SM = ARGS.SOFTMAX

PATH_AUTO = 0
PATH_WHOLE = 1
PATH_SPLIT = 2
PATH_MIXED = 3
SOFTMAX_PASSES = 4  # vector passes over a panel of keys: max, exp, sum, scale


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
def softmax_check(args):  # type: ignore[no-untyped-def]
    """SOFTMAX argument check (kernels.status code)."""
    if args[SM.M] < 1 or args[SM.N] < 1:
        return BAD_SHAPE
    dx, dy = args[SM.dtype_x], args[SM.dtype_y]
    if dx < 0 or dx > DT_FP32 or dy < 0 or dy > DT_FP32:
        return BAD_DTYPE
    if args[SM.path] < PATH_AUTO or args[SM.path] > PATH_MIXED:
        return BAD_FLAGS
    if args[SM.row0] < 0 or args[SM.causal] < 0 or args[SM.causal] > args[SM.N]:
        return BAD_SHAPE
    if args[SM.mask] != 0 and (args[SM.mask_rep] < 1 or args[SM.mask_rows] < 1):
        return BAD_SHAPE
    return OK


@kjit_inline
def valid_keys(r, n, causal):  # type: ignore[no-untyped-def]
    """Keys row r of the whole softmax sees: all n, or with `causal` = Tq the
    first (r mod Tq) + 1 + (n - Tq)."""
    return n if causal == 0 else min(n, r % causal + 1 + n - causal)


@kjit
def softmax_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """SOFTMAX numeric body; returns a kernels.status code."""
    m, n = args[SM.M], args[SM.N]
    st = softmax_check(args)
    if st != OK:
        return st
    scale = u32_as_f32(args[SM.scale])
    row0, causal, masked = args[SM.row0], args[SM.causal], args[SM.mask] != 0
    x = np.empty(n, dtype=np.float32)
    mk = np.empty(n, dtype=np.float32)
    for i in range(m):
        r = row0 + i
        v = valid_keys(r, n, causal)
        read_row(mem, args[SM.x] - base + i * args[SM.ldx], n, args[SM.dtype_x], x)
        for j in range(n):
            x[j] = x[j] * scale
        if masked:
            mrow = (r // args[SM.mask_rep]) % args[SM.mask_rows]
            read_row(mem, args[SM.mask] - base + mrow * args[SM.ldm], n, DT_FP16, mk)
            for j in range(n):
                x[j] = x[j] + mk[j]
        mx = x[0]
        for j in range(1, v):
            if x[j] > mx:
                mx = x[j]
        for j in range(v):  # independent per element: vectorizes
            x[j] = np.float32(exp_nonpos(np.float64(x[j] - mx)))
        s = np.float32(_sum64(x, v))
        for j in range(v):
            x[j] = x[j] / s
        for j in range(v, n):
            x[j] = np.float32(0.0)
        write_row(mem, args[SM.y] - base + i * args[SM.ldy], n, args[SM.dtype_y], x)
    return OK


@kjit_inline
def _panels(v, n, masked, keys):  # type: ignore[no-untyped-def]
    """Panel work of one row in quarter panels (SOFTMAX_PASSES per panel):
    its valid keys' panels (a fifth pass with a mask) plus one pass per
    skipped panel (the zeros)."""
    full = ceil_div(v, keys) * (SOFTMAX_PASSES + (1 if masked else 0))
    return full + (ceil_div(n, keys) - ceil_div(v, keys))


@kjit_inline
def _geometry(args, desc):  # type: ignore[no-untyped-def]
    """(keys N, workers, panel keys, masked, causal Tq, row0) of a SOFTMAX call."""
    return (max(args[SM.N], 1), desc[D_WORKERS], desc[D_SOFTMAX_PANEL_KEYS],
            args[SM.mask] != 0, args[SM.causal], args[SM.row0])


@kjit_inline
def _whole_work(args, desc, lo, hi):  # type: ignore[no-untyped-def]
    """Work cycles of rows [lo, hi) of the block on the whole-rows path."""
    n, w, keys, masked, causal, row0 = _geometry(args, desc)
    m = hi - lo
    if m <= 0:
        return 0
    if causal <= 0 and not masked:
        return ceil_div(m, w) * slots(desc[D_SOFTMAX_ROW] + desc[D_SOFTMAX_PANEL]
                                      * ceil_div(n, keys), desc)
    whole = 0  # rounds wait for their longest row; quarter panels per pass
    for r0 in range(lo, hi, w):
        worst = 0
        for i in range(r0, min(hi, r0 + w)):
            worst = max(worst, _panels(valid_keys(row0 + i, n, causal), n, masked, keys))
        whole += slots(desc[D_SOFTMAX_ROW] + ceil_div(desc[D_SOFTMAX_PANEL] * worst,
                                                      SOFTMAX_PASSES), desc)
    return whole


@kjit_inline
def _split_work(args, desc, lo, hi):  # type: ignore[no-untyped-def]
    """Work cycles of rows [lo, hi) of the block on the split-rows path."""
    n, w, keys, masked, causal, row0 = _geometry(args, desc)
    m = hi - lo
    if m <= 0:
        return 0
    sr = min(desc[D_SOFTMAX_SPLIT_ROWS], w)
    per_row_workers = max(w // sr, 1)
    if causal <= 0 and not masked:
        split_panels = ceil_div(m, sr) * desc[D_SOFTMAX_SPLIT_PANEL] * ceil_div(
            n, keys * per_row_workers)
    else:
        split_panels = 0
        for r0 in range(lo, hi, sr):
            worst = 0
            for i in range(r0, min(hi, r0 + sr)):
                v = valid_keys(row0 + i, n, causal)
                worst = max(worst, _panels(ceil_div(v, per_row_workers),
                                           ceil_div(n, per_row_workers), masked, keys))
            split_panels += ceil_div(desc[D_SOFTMAX_SPLIT_PANEL] * worst, SOFTMAX_PASSES)
    return (slots(split_panels + ceil_div(m, sr) * desc[D_SOFTMAX_SPLIT_ROW], desc)
            + ceil_div(m, w) * desc[D_SOFTMAX_SPLIT_ROUND])


@kjit_inline
def softmax_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a SOFTMAX vertex: the path `path` names, or
    the cheapest of the three (module docstring)."""
    m, w = max(args[SM.M], 1), desc[D_WORKERS]
    path = args[SM.path]
    c_whole, c_split = desc[D_SOFTMAX_CALL], desc[D_SOFTMAX_SPLIT_CALL]
    mw = m // w * w  # the mixed path's rows in full whole-row rounds
    if path == PATH_WHOLE or (path == PATH_MIXED and mw in (0, m)):
        return c_whole, _whole_work(args, desc, 0, m)
    if path == PATH_SPLIT:
        return c_split, _split_work(args, desc, 0, m)
    if path == PATH_MIXED:
        return c_whole + c_split, _whole_work(args, desc, 0, mw) + _split_work(args, desc, mw, m)
    whole = _whole_work(args, desc, 0, m)
    split = _split_work(args, desc, 0, m)
    best_call, best = c_whole, whole
    if c_split + split < best_call + best:
        best_call, best = c_split, split
    if 0 < mw < m:
        mixed = _whole_work(args, desc, 0, mw) + _split_work(args, desc, mw, m)
        if c_whole + c_split + mixed < best_call + best:
            best_call, best = c_whole + c_split, mixed
    return best_call, best


@kjit_inline
def softmax_regions(args, out):  # type: ignore[no-untyped-def]
    """SOFTMAX regions: x (and the whole mask) read; y written."""
    m, n = args[SM.M], args[SM.N]
    bx, by = dtype_bytes(args[SM.dtype_x]), dtype_bytes(args[SM.dtype_y])
    i = put_region(out, 0, args[SM.x], 1, 0, m, args[SM.ldx], n * bx, 0)
    if args[SM.mask] != 0:
        i = put_region(out, i, args[SM.mask], 1, 0, max(args[SM.mask_rows], 1), args[SM.ldm],
                       n * 2, 0)
    return put_region(out, i, args[SM.y], 1, 0, m, args[SM.ldy], n * by, 1)
