"""Building blocks of the kernel cycle models (DESIGN §3, §5).

Every vertex is modelled as a multi-worker vertex (the IPU runs six hardware
worker threads per tile in a round-robin barrel: each issues one instruction
every `workers` cycles, so one worker gets 1/workers of the tile's issue rate).
A vertex splits its rows over the workers; the busiest worker, with
ceil(rows / workers) rows, bounds the vertex:

    cycles = overhead + stream * (CONFLICT_FACTOR if two streams conflict else 1)

`overhead` is the tile's fixed per-vertex cost (desc[D_OVERHEAD]: supervisor
launch of the workers and their sync).  `stream` is the busiest worker's
streaming time, computed by the kernel family from the tile rates
(AMP MACs/cycle by dtype, vector ops/cycle by dtype, LDST_BYTES_PER_CYCLE).

Memory-element conflict: tile SRAM is built from 16 KiB elements
(desc[D_ELEMENT]); one element serves one access per cycle, so two operand
streams of one vertex that live in the same element halve the streaming rate
(Graphcore's guidance to place a vertex's operands in different memory
elements).  Two regions conflict when their spans touch a common element
((address - base) // element_bytes).  A read-modify-write operand, which
`vertex_regions` reports as a read and a write of the same span, is one
stream and does not conflict with itself.
"""

from __future__ import annotations

import math

import numpy as np

from kernels.jit import kjit, kjit_inline
from kernels.tile import D_BASE, D_ELEMENT, D_WORKERS

# One 64-bit load or store issued per cycle per tile (ld64/st64), shared by the workers.
LDST_BYTES_PER_CYCLE = 8
# Streaming slowdown when two operand streams share a memory element.
CONFLICT_FACTOR = 2


# Below this, a float64 quotient of two int64s is exact enough that its floor/ceil
# is the integer floor/ceil (a relative error of 2**-53 cannot cross an integer).
_FLOAT_EXACT = 1 << 52


@kjit
def ceil_div(a, b):  # type: ignore[no-untyped-def]
    """ceil(a / b) for a >= 0, b > 0.  Uses one float64 division (the cycle
    models run once per simulated vertex; int64 division is several times slower)."""
    if a < _FLOAT_EXACT:
        return np.int64(math.ceil(a / b))
    return (a + b - 1) // b


@kjit
def floor_div(a, b):  # type: ignore[no-untyped-def]
    """floor(a / b) for a >= 0, b > 0 (float64 division, see ceil_div)."""
    if a < _FLOAT_EXACT:
        return np.int64(a / b)
    return a // b


@kjit
def round_up(a, grain):  # type: ignore[no-untyped-def]
    """a rounded up to a multiple of grain."""
    return ceil_div(a, grain) * grain


@kjit_inline
def worker_rows(rows, desc):  # type: ignore[no-untyped-def]
    """Rows of the busiest worker when `rows` are split over desc's workers."""
    return ceil_div(rows, desc[D_WORKERS])


@kjit_inline
def worker_cycles(work, rate, desc):  # type: ignore[no-untyped-def]
    """Cycles one worker needs for `work` units at 1/workers of a tile rate."""
    return ceil_div(work * desc[D_WORKERS], rate)


@kjit_inline
def vector_cycles(rows, n, passes, rate, desc):  # type: ignore[no-untyped-def]
    """Busiest worker of a row-wise vector kernel: rows x n elements, `passes`
    vector ops per element, tile vector rate `rate` ops/cycle."""
    return worker_cycles(worker_rows(rows, desc) * n * passes, rate, desc)


@kjit_inline
def _span(regions, i):  # type: ignore[no-untyped-def]
    addr = regions[i, 0]
    last = addr + (regions[i, 1] - 1) * regions[i, 2] + (regions[i, 3] - 1) * regions[i, 4]
    lo = min(addr, last)
    hi = max(addr, last) + regions[i, 5]
    return lo, hi


@kjit
def _element(addr, base, elem):  # type: ignore[no-untyped-def]
    """Memory element holding byte `addr` (-1 below the base)."""
    if addr < base:
        return np.int64(-1)
    return floor_div(addr - base, elem)


@kjit_inline
def _same_span_earlier(regions, i):  # type: ignore[no-untyped-def]
    """True if a region before i (with bytes) has exactly region i's span."""
    lo_i, hi_i = _span(regions, i)
    for j in range(i):
        if regions[j, 5] > 0:
            lo_j, hi_j = _span(regions, j)
            if lo_i == lo_j and hi_i == hi_j:
                return True
    return False


@kjit_inline
def has_conflict(regions, n, desc):  # type: ignore[no-untyped-def]
    """True if two distinct operand spans among regions[:n] share a memory element.

    A region with exactly the span of an earlier one (the two halves of a
    read-modify-write operand) is the same stream and is skipped.  Each span
    becomes a bit mask of the elements it touches, so the test is linear in n;
    tiles with more than 62 elements fall back to comparing every pair."""
    base = desc[D_BASE]
    elem = desc[D_ELEMENT]
    seen = np.int64(0)
    for i in range(n):
        if regions[i, 5] <= 0 or _same_span_earlier(regions, i):
            continue
        lo, hi = _span(regions, i)
        first = _element(lo, base, elem)
        last = _element(hi - 1, base, elem)
        if first < 0 or last > 61:
            return _has_conflict_pairwise(regions, n, base, elem)
        mask = ((np.int64(1) << (last + 1)) - 1) ^ ((np.int64(1) << first) - 1)
        if (mask & seen) != 0:
            return True
        seen |= mask
    return False


@kjit
def _has_conflict_pairwise(regions, n, base, elem):  # type: ignore[no-untyped-def]
    for i in range(n):
        if regions[i, 5] <= 0 or _same_span_earlier(regions, i):
            continue
        lo_i, hi_i = _span(regions, i)
        for j in range(i + 1, n):
            if regions[j, 5] <= 0:
                continue
            lo_j, hi_j = _span(regions, j)
            if lo_i == lo_j and hi_i == hi_j:
                continue
            if ((lo_i - base) // elem <= (hi_j - 1 - base) // elem
                    and (lo_j - base) // elem <= (hi_i - 1 - base) // elem):
                return True
    return False


@kjit_inline
def put_region(out, i, addr, outer, outer_stride, rows, ld, row_bytes, is_write):  # type: ignore[no-untyped-def]
    """Write one vertex_regions row at index i; returns i + 1."""
    out[i, 0] = addr
    out[i, 1] = outer
    out[i, 2] = outer_stride
    out[i, 3] = rows
    out[i, 4] = ld
    out[i, 5] = row_bytes
    out[i, 6] = is_write
    return i + 1
