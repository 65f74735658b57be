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

from kernels.jit import kjit
from kernels.tile import D_BASE, D_ELEMENT, D_WORKERS

# One 64-bit load or store issued per cycle per tile (ld64/st64), shared by the workers.
LDST_BYTES_PER_CYCLE = 8
# Streaming slowdown when two operand streams share a memory element.
CONFLICT_FACTOR = 2


@kjit
def ceil_div(a, b):  # type: ignore[no-untyped-def]
    """ceil(a / b) for a >= 0, b > 0."""
    return (a + b - 1) // b


@kjit
def round_up(a, grain):  # type: ignore[no-untyped-def]
    """a rounded up to a multiple of grain."""
    return ceil_div(a, grain) * grain


@kjit
def worker_rows(rows, desc):  # type: ignore[no-untyped-def]
    """Rows of the busiest worker when `rows` are split over desc's workers."""
    return ceil_div(rows, desc[D_WORKERS])


@kjit
def worker_cycles(work, rate, desc):  # type: ignore[no-untyped-def]
    """Cycles one worker needs for `work` units at 1/workers of a tile rate."""
    return ceil_div(work * desc[D_WORKERS], rate)


@kjit
def vector_cycles(rows, n, passes, rate, desc):  # type: ignore[no-untyped-def]
    """Busiest worker of a row-wise vector kernel: rows x n elements, `passes`
    vector ops per element, tile vector rate `rate` ops/cycle."""
    return worker_cycles(worker_rows(rows, desc) * n * passes, rate, desc)


@kjit
def _span(regions, i):  # type: ignore[no-untyped-def]
    addr = regions[i, 0]
    last = addr + (regions[i, 1] - 1) * regions[i, 2] + (regions[i, 3] - 1) * regions[i, 4]
    lo = min(addr, last)
    hi = max(addr, last) + regions[i, 5]
    return lo, hi


@kjit
def has_conflict(regions, n, desc):  # type: ignore[no-untyped-def]
    """True if two distinct operand spans among regions[:n] share a memory element."""
    base = desc[D_BASE]
    elem = desc[D_ELEMENT]
    for i in range(n):
        if regions[i, 5] <= 0:
            continue
        lo_i, hi_i = _span(regions, i)
        for j in range(i + 1, n):
            if regions[j, 5] <= 0:
                continue
            lo_j, hi_j = _span(regions, j)
            if lo_i == lo_j and hi_i == hi_j:
                continue  # read and write of one read-modify-write operand
            first_i = (lo_i - base) // elem
            last_i = (hi_i - 1 - base) // elem
            first_j = (lo_j - base) // elem
            last_j = (hi_j - 1 - base) // elem
            if first_i <= last_j and first_j <= last_i:
                return True
    return False


@kjit
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
