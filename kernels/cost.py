"""Building blocks of the kernel cycle models.

A vertex costs `call + work` cycles: `call` is the kernel's fixed cost
(supervisor entry, worker start and rendezvous, setup), `work` the busiest
worker's streaming time.  Both come from each kernel family's formula over the
cost constants of the tile descriptor (kernels.tile).  The IPU's six workers
share the tile's pipeline in a round-robin barrel, so `s` issue slots of one
worker cost `s * workers` cycles (`slots`).

Memory-element conflict: tile SRAM is built from elements of
desc[D_ELEMENT_BYTES] bytes; one element serves one access per cycle, so when two
operand streams of one vertex live in the same element the work takes
desc[D_CONFLICT_PERCENT] percent of its time (`conflicted`).  Two regions
conflict when their spans touch a common element ((address - base) //
element_bytes).  A read-modify-write operand, which `vertex_regions` reports as
a read and a write of the same span, is one stream and does not conflict with
itself.
"""
from __future__ import annotations

import math

import numpy as np

from kernels.tile import D_CONFLICT_PERCENT, D_ELEMENT_BYTES, D_MEMORY_BASE, D_WORKERS
from tilecommon.jit import kjit, kjit_inline

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
def slots(n, desc):  # type: ignore[no-untyped-def]
    """Cycles of `n` issue slots of one worker (workers share the barrel)."""
    return n * desc[D_WORKERS]


@kjit_inline
def per_worker(units, desc):  # type: ignore[no-untyped-def]
    """Units of the busiest worker when `units` are split over the workers."""
    return ceil_div(units, desc[D_WORKERS])


@kjit_inline
def conflicted(work, desc):  # type: ignore[no-untyped-def]
    """`work` cycles slowed by a memory-element conflict."""
    return ceil_div(work * desc[D_CONFLICT_PERCENT], 100)


@kjit_inline
def contiguous(rows, ld, row_bytes):  # type: ignore[no-untyped-def]
    """True if `rows` rows of `row_bytes` at stride `ld` are one contiguous run."""
    return rows == 1 or ld == row_bytes


@kjit_inline
def vector_pass(rows, cols, grain, slots_per_chunk, row_cycles, desc):  # type: ignore[no-untyped-def]
    """Work of an elementwise pass over `rows` x `cols` elements split over the
    workers in chunks of `grain` elements per worker: each row takes
    ceil(cols / (workers * grain)) rounds of `slots_per_chunk` slots, and each
    row after the first `row_cycles` more (pointer setup of a new row).
    Callers pass a contiguous block as one row of rows * cols elements."""
    rounds = ceil_div(cols, desc[D_WORKERS] * grain)
    return rows * rounds * slots(slots_per_chunk, desc) + (rows - 1) * row_cycles


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
    base = desc[D_MEMORY_BASE]
    elem = desc[D_ELEMENT_BYTES]
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
