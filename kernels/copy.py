"""Data movement: COPY (id 10) and TRANSPOSE (id 11).

COPY moves `rows` rows of `row_bytes` bytes from src (stride lds) to dst
(stride ldd), row by row in increasing order (a move within one row behaves
like memmove).  TRANSPOSE writes dst[N, M] = src[M, N]ᵀ for elements of
`elem_bytes` bytes (1, 2 or 4); it reads the whole block before writing, so
dst may alias src.  Bytes are moved unchanged: no rounding.

Cycle model (kernels.cost): COPY splits its rows over the workers; a worker
moves 8 bytes per load/store pair (ld64/st64) at 1/workers of
LDST_BYTES_PER_CYCLE, rows padded to whole 8-byte words.  TRANSPOSE splits the
N output rows over the workers and moves TRANSPOSE_ELEMS_PER_CYCLE elements
per cycle per tile (one element-granular load and store each).
"""

from __future__ import annotations

import numpy as np

from kernels.cost import LDST_BYTES_PER_CYCLE, put_region, round_up, worker_cycles, worker_rows
from kernels.jit import kjit, kjit_inline
from kernels.status import BAD_SHAPE, OK

TRANSPOSE_ELEMS_PER_CYCLE = 1


@kjit
def copy_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """COPY numeric body; returns a kernels.status code."""
    rows, nb = args[4], args[5]
    if rows < 1 or nb < 1:
        return BAD_SHAPE
    src = args[0] - base
    dst = args[2] - base
    for r in range(rows):
        s = src + r * args[1]
        d = dst + r * args[3]
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
def transpose_execute(mem, base, args):  # type: ignore[no-untyped-def]
    """TRANSPOSE numeric body; returns a kernels.status code."""
    m, n, eb = args[4], args[5], args[6]
    if m < 1 or n < 1 or not (eb == 1 or eb == 2 or eb == 4):
        return BAD_SHAPE
    src = args[0] - base
    row = n * eb
    block = np.empty(m * row, dtype=np.uint8)  # whole source first: dst may alias src
    for i in range(m):
        s = src + i * args[1]
        block[i * row:(i + 1) * row] = mem[s:s + row]
    dst = args[2] - base
    if eb == 1:
        _transpose_words(block, m, n, mem, dst, args[3], eb)
    elif eb == 2:
        _transpose_words(block.view(np.uint16), m, n, mem, dst, args[3], eb)
    else:
        _transpose_words(block.view(np.uint32), m, n, mem, dst, args[3], eb)
    return OK


@kjit_inline
def copy_stream(args, desc):  # type: ignore[no-untyped-def]
    rw = worker_rows(max(args[4], 1), desc)
    return worker_cycles(rw * round_up(max(args[5], 1), 8), LDST_BYTES_PER_CYCLE, desc)


@kjit_inline
def transpose_stream(args, desc):  # type: ignore[no-untyped-def]
    rw = worker_rows(max(args[5], 1), desc)
    return worker_cycles(rw * max(args[4], 1), TRANSPOSE_ELEMS_PER_CYCLE, desc)


@kjit_inline
def copy_regions(args, out):  # type: ignore[no-untyped-def]
    """COPY regions: src read; dst written."""
    i = put_region(out, 0, args[0], 1, 0, args[4], args[1], args[5], 0)
    return put_region(out, i, args[2], 1, 0, args[4], args[3], args[5], 1)


@kjit_inline
def transpose_regions(args, out):  # type: ignore[no-untyped-def]
    """TRANSPOSE regions: src [M, N] read; dst [N, M] written."""
    eb = args[6]
    i = put_region(out, 0, args[0], 1, 0, args[4], args[1], args[5] * eb, 0)
    return put_region(out, i, args[2], 1, 0, args[5], args[3], args[4] * eb, 1)
