"""The compute side of the Numba engine's numerics: executing a compute step's
vertices in the memory image and marking what they wrote
(simulator.engines.numba runs the loop, costs the steps and checks the
regions first; simulator.engines.numba_exchange moves the exchange's bytes),
and the fault table both record into.

A large race-free step executes on the machine's cores: its vertices then
touch disjoint bytes, so the order they run in cannot change a result, and
the `written` bitmap (whose words several vertices share) is updated after
them, over the cores by classes of tiles (`part_of`: no two classes share a
bitmap row).  A step with a race, or one run outside the main thread
(simulator.engines.numba.execute), runs in program order in this thread.
"""

from __future__ import annotations

import numba
import numpy as np

from kernels.abi import MAX_REGIONS
from kernels.dispatch import vertex_execute, vertex_regions
from simulator.access import R_LEN, bits_all_set, bits_first_unset, bits_set, region_span
from simulator.engines.base import C_FAULTS, F_KERNEL
from simulator.engines.ticks import ticks
from tilecommon.jit import kjit, kjit_inline, kjit_parallel

# the profile's phases (Outputs.prof) this module charges
P_WRITTEN = 3  # compute: marking written bytes
P_XCHECK = 6  # exchange: ranges, unwritten reads, race (charged by the loop)
P_KERNEL = 8  # + kernel id: executing that kernel's vertices
PARTS = 4  # tile classes of a parallel marking pass (`part_of`)
# chunks of a step's items in a parallel pass, each with its own scratch: a
# constant, since asking Numba for its thread count would make it uncacheable
PARALLEL_CHUNKS = 64


@kjit
def fault(faults, counters, code, step, tile, addr, loop, it, item, detail):  # type: ignore[no-untyped-def]
    """Record one fault row (simulator.engines.base FAULT_COLS); count all."""
    n = counters[C_FAULTS]
    if n < faults.shape[0]:
        faults[n, 0] = code
        faults[n, 1] = step
        faults[n, 2] = tile
        faults[n, 3] = addr
        faults[n, 4] = loop
        faults[n, 5] = it
        faults[n, 6] = item
        faults[n, 7] = detail
    counters[C_FAULTS] = n + 1


@kjit
def first_unwritten(written, row, off, reg):  # type: ignore[no-untyped-def]
    """Offset of the first never-written byte of region `reg` (offsets relative
    to the image row), or -1.  A row is tested word at a time first
    (`bits_all_set`); only a row with a gap is searched bit by bit."""
    for o in range(reg[1]):
        for r in range(reg[3]):
            a = off + o * reg[2] + r * reg[4]
            if not bits_all_set(written, row, a, reg[5]):
                return bits_first_unset(written, row, a, reg[5])
    return -1


@kjit
def _mark_written(written, row, off, reg):  # type: ignore[no-untyped-def]
    for o in range(reg[1]):
        for r in range(reg[3]):
            bits_set(written, row, off + o * reg[2] + r * reg[4], reg[5])


@kjit_parallel
def execute_parallel(i0, i1, v_tile, v_kernel, args, skip, image, status, spent):  # type: ignore[no-untyped-def]
    """`execute_serial` over the cores (a race-free step only)."""
    for j in numba.prange(i1 - i0):
        if not skip[j]:
            status[j], spent[j] = _execute_one(i0 + j, v_tile, v_kernel, args[j], image)


@kjit
def execute_serial(i0, i1, v_tile, v_kernel, args, skip, image, status, spent):  # type: ignore[no-untyped-def]
    """vertex_execute of the vertices i0..i1 of a step not skipped (args[j]:
    vertex i0 + j's patched arguments), in order; kernel status and ticks
    per vertex into status / spent."""
    for j in range(i1 - i0):
        if not skip[j]:
            status[j], spent[j] = _execute_one(i0 + j, v_tile, v_kernel, args[j], image)


@kjit
def _execute_one(v, v_tile, v_kernel, row, image):  # type: ignore[no-untyped-def]
    t = v_tile[v]
    t0 = ticks()
    st = vertex_execute(v_kernel[v], image.mem[image.tile_row[t]], image.tile_base[t], row)
    return st, ticks() - t0


@kjit
def part_of(tile):  # type: ignore[no-untyped-def]
    """The class (of PARTS) of a tile's bitmap row in a parallel marking pass:
    blocks of 8 tiles in turn, so each core gets tiles from all over the chip."""
    return (tile >> 3) & (PARTS - 1)


@kjit
def _mark_vertex(j, v, v_tile, v_kernel, args, image, vr):  # type: ignore[no-untyped-def]
    trow, tb = image.tile_row[v_tile[v]], image.tile_base[v_tile[v]]
    nr = vertex_regions(v_kernel[v], args[j], vr)
    for r in range(nr):
        if vr[r, 6] != 0:
            _mark_written(image.written, trow, vr[r, 0] - tb, vr[r])


@kjit_parallel
def mark_parallel(i0, i1, v_tile, v_kernel, args, skip, status, image):  # type: ignore[no-untyped-def]
    """Mark the writes of the vertices that ran clean, over the cores: part p
    takes the vertices on tiles of class p, whose bitmap rows no other part
    touches (`part_of`)."""
    for p in numba.prange(PARTS):
        vr = np.zeros((MAX_REGIONS, R_LEN), dtype=np.int64)
        for j in range(i1 - i0):
            v = i0 + j
            if not skip[j] and status[j] == 0 and part_of(v_tile[v]) == p:
                _mark_vertex(j, v, v_tile, v_kernel, args, image, vr)


@kjit
def finish_execute(i0, i1, s, loop, it, v_tile, v_kernel, args, skip, image, vr, status, spent,
                   faults, counters, prof, parallel):  # type: ignore[no-untyped-def]
    """After `execute_*` of compute step s: a kernel's non-zero status is an
    F_KERNEL fault and its writes stay unmarked; every other vertex's writes
    are marked written (unless `parallel`: the caller then runs
    `mark_parallel`).  Charges the kernels' ticks to the profile."""
    t0 = ticks()
    for j in range(i1 - i0):
        if skip[j]:
            continue
        v = i0 + j
        prof[P_KERNEL + v_kernel[v]] += spent[j]
        if status[j] != 0:
            fault(faults, counters, F_KERNEL, s, v_tile[v], 0, loop, it, v, status[j])
        elif not parallel:
            _mark_vertex(j, v, v_tile, v_kernel, args, image, vr)
    prof[P_WRITTEN] += ticks() - t0


@kjit_inline
def _regions_of(j, v, v_tile, v_kernel, args, image, regs, vnr):  # type: ignore[no-untyped-def]
    """Vertex v's (position j of its step) regions into regs[8j:8j + 8] and
    their number into vnr[j]; returns 1 when one of them lies outside the
    tile's image window or reads a byte never written, else 0."""
    t = v_tile[v]
    trow, tb, size = image.tile_row[t], image.tile_base[t], image.tile_size[t]
    nr = max(vertex_regions(v_kernel[v], args[j], regs[8 * j:8 * j + 8]), 0)
    vnr[j] = nr
    for r in range(nr):
        reg = regs[8 * j + r]
        lo, hi = region_span(reg)
        if hi <= lo:
            continue
        if trow < 0 or lo < tb or hi > tb + size:
            return 1
        if reg[6] == 0 and first_unwritten(image.written, trow, reg[0] - tb, reg) >= 0:
            return 1
    return 0


@kjit_parallel
def regions_parallel(i0, i1, v_tile, v_kernel, args, skip, image, regs, vnr, vbad):  # type: ignore[no-untyped-def]
    """`regions_serial` over the cores."""
    for j in numba.prange(i1 - i0):
        vnr[j] = 0
        vbad[j] = 0 if skip[j] else _regions_of(j, i0 + j, v_tile, v_kernel, args, image, regs,
                                                 vnr)


@kjit
def regions_serial(i0, i1, v_tile, v_kernel, args, skip, image, regs, vnr, vbad):  # type: ignore[no-untyped-def]
    """The numerics checks of a compute step's vertices (i0..i1, args[j]
    patched, skip[j] those that must not run), without reporting: vertex
    j's regions in regs[8j:8j + 8] (vnr[j] of them) and vbad[j] = 1 when
    one is out of the image window or reads unwritten bytes; the engine
    reports those vertices' faults in order (simulator.engines.numba)."""
    for j in range(i1 - i0):
        vnr[j] = 0
        vbad[j] = 0 if skip[j] else _regions_of(j, i0 + j, v_tile, v_kernel, args, image, regs,
                                                 vnr)
