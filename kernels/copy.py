"""Data movement: COPY (id 10) and TRANSPOSE (id 11).

COPY moves `rows` rows of `row_bytes` bytes from src (stride lds) to dst
(stride ldd), row by row in increasing order (a move within one row behaves
like memmove).  TRANSPOSE writes dst[N, M] = src[M, N]ᵀ for elements of
`elem_bytes` bytes (1, 2 or 4); it reads the whole block before writing, so
dst may alias src.  Bytes are moved unchanged: no rounding.

Cycle models: COPY moves `copy_bytes_per_cycle` bytes per cycle on the tile
(the six workers share the load/store unit) plus `copy_row` per further
non-contiguous row: cycles = copy_call + rows * ceil(row_bytes / bpc) +
(rows - 1) * copy_row (a contiguous block is one row).  TRANSPOSE takes the
source rows in groups of `transpose_rows` (shared by the workers) and the
columns in pairs: cycles = transpose_call + ceil(M / transpose_rows) *
(transpose_group + transpose_pair * ceil(N / 2)).
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ARGS
from kernels.cost import ceil_div, contiguous, put_region
from kernels.status import BAD_SHAPE, OK
from kernels.tile import (
    D_COPY_BYTES_PER_CYCLE,
    D_COPY_CALL,
    D_COPY_ROW,
    D_TRANSPOSE_CALL,
    D_TRANSPOSE_GROUP,
    D_TRANSPOSE_PAIR,
    D_TRANSPOSE_ROWS,
)
from tilecommon.jit import kjit, kjit_inline

# argument slots (kernels.abi)
CP = ARGS.COPY
TR = ARGS.TRANSPOSE


@kjit
def copy_check(args):  # type: ignore[no-untyped-def]
    """COPY argument check (kernels.status code)."""
    return BAD_SHAPE if args[CP.rows] < 1 or args[CP.row_bytes] < 1 else OK


@kjit
def copy_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """COPY numeric body; returns a kernels.status code."""
    rows, nb = args[CP.rows], args[CP.row_bytes]
    if copy_check(args) != OK:
        return BAD_SHAPE
    src = args[CP.src] - base
    dst = args[CP.dst] - base
    for r in range(rows):
        s = src + r * args[CP.lds]
        d = dst + r * args[CP.ldd]
        mem[d:d + nb] = mem[s:s + nb].copy()
    return OK


@kjit
def _transpose_words(words, m, n, mem, dst, ldd, eb):  # type: ignore[no-untyped-def]
    """dst row j (m elements) = column j of the dense [m, n] element array `words`."""
    for j in range(n):
        d = dst + j * ldd
        out = mem[d:d + m * eb].view(words.dtype)
        for i in range(m):
            out[i] = words[i * n + j]


@kjit
def transpose_check(args):  # type: ignore[no-untyped-def]
    """TRANSPOSE argument check (kernels.status code)."""
    m, n, eb = args[TR.M], args[TR.N], args[TR.elem_bytes]
    return BAD_SHAPE if m < 1 or n < 1 or not (eb == 1 or eb == 2 or eb == 4) else OK


@kjit
def transpose_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """TRANSPOSE numeric body; returns a kernels.status code."""
    m, n, eb = args[TR.M], args[TR.N], args[TR.elem_bytes]
    if transpose_check(args) != OK:
        return BAD_SHAPE
    src = args[TR.src] - base
    row = n * eb
    block = np.empty(m * row, dtype=np.uint8)  # whole source first: dst may alias src
    for i in range(m):
        s = src + i * args[TR.lds]
        block[i * row:(i + 1) * row] = mem[s:s + row]
    dst = args[TR.dst] - base
    if eb == 1:
        _transpose_words(block, m, n, mem, dst, args[TR.ldd], eb)
    elif eb == 2:
        _transpose_words(block.view(np.uint16), m, n, mem, dst, args[TR.ldd], eb)
    else:
        _transpose_words(block.view(np.uint32), m, n, mem, dst, args[TR.ldd], eb)
    return OK


@kjit_inline
def copy_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a COPY vertex (module docstring)."""
    rows, nb = max(args[CP.rows], 1), max(args[CP.row_bytes], 1)
    if contiguous(rows, args[CP.lds], nb) and contiguous(rows, args[CP.ldd], nb):
        rows, nb = 1, rows * nb
    work = rows * ceil_div(nb, desc[D_COPY_BYTES_PER_CYCLE]) + (rows - 1) * desc[D_COPY_ROW]
    return desc[D_COPY_CALL], work


@kjit_inline
def transpose_cost(args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles of a TRANSPOSE vertex (module docstring)."""
    m, n = max(args[TR.M], 1), max(args[TR.N], 1)
    groups = ceil_div(m, desc[D_TRANSPOSE_ROWS])
    return desc[D_TRANSPOSE_CALL], groups * (desc[D_TRANSPOSE_GROUP]
                                             + desc[D_TRANSPOSE_PAIR] * ceil_div(n, 2))


@kjit_inline
def copy_regions(args, out):  # type: ignore[no-untyped-def]
    """COPY regions: src read; dst written."""
    rows, nb = args[CP.rows], args[CP.row_bytes]
    i = put_region(out, 0, args[CP.src], 1, 0, rows, args[CP.lds], nb, 0)
    return put_region(out, i, args[CP.dst], 1, 0, rows, args[CP.ldd], nb, 1)


@kjit_inline
def transpose_regions(args, out):  # type: ignore[no-untyped-def]
    """TRANSPOSE regions: src [M, N] read; dst [N, M] written."""
    eb = args[TR.elem_bytes]
    i = put_region(out, 0, args[TR.src], 1, 0, args[TR.M], args[TR.lds], args[TR.N] * eb, 0)
    return put_region(out, i, args[TR.dst], 1, 0, args[TR.N], args[TR.ldd], args[TR.M] * eb, 1)
