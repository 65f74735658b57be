"""The data side of the Numba engine: executing a compute step's vertices and
copying an exchange step's bytes in the memory image (simulator.engines.numba
runs the loop, costs the steps and checks the regions first).

Both run on the machine's cores when the step is large and race-free: the
step's accessors then touch disjoint bytes, so the order they run in cannot
change a result, and the `written` bitmap (whose words several accessors
share) is updated after them in this thread.  A step with a race, or one run
outside the main thread (simulator.engines.numba.execute), runs in program
order in this thread.  Copies are row-slice loops (vectorized), not byte
loops.
"""

from __future__ import annotations

import numba

from kernels.cost import put_region
from kernels.dispatch import vertex_execute, vertex_regions
from kernels.jit import kjit, kjit_parallel
from simulator.access import bits_first_unset, bits_set, find_race
from simulator.engines.base import C_FAULTS, F_KERNEL, F_RACE, F_UNINIT, F_XFER_RANGE
from simulator.engines.ticks import ticks

# the profile's phases (Outputs.prof) this module charges
P_WRITTEN = 3  # compute: marking written bytes
P_XCHECK = 6  # exchange: ranges, unwritten reads, race
P_KERNEL = 8  # + kernel id: executing that kernel's vertices


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
    to the image row), or -1."""
    for o in range(reg[1]):
        for r in range(reg[3]):
            bad = bits_first_unset(written, row, off + o * reg[2] + r * reg[4], reg[5])
            if bad >= 0:
                return bad
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
def finish_execute(i0, i1, s, loop, it, v_tile, v_kernel, args, skip, image, vr, status, spent,
                   faults, counters, prof):  # type: ignore[no-untyped-def]
    """After `execute_*` of compute step s: a kernel's non-zero status is an
    F_KERNEL fault and its writes stay unmarked; every other vertex's writes
    are marked written.  Charges the kernels' ticks to the profile."""
    t0 = ticks()
    for j in range(i1 - i0):
        if skip[j]:
            continue
        v = i0 + j
        prof[P_KERNEL + v_kernel[v]] += spent[j]
        if status[j] != 0:
            fault(faults, counters, F_KERNEL, s, v_tile[v], 0, loop, it, v, status[j])
            continue
        trow, tb = image.tile_row[v_tile[v]], image.tile_base[v_tile[v]]
        nr = vertex_regions(v_kernel[v], args[j], vr)
        for r in range(nr):
            if vr[r, 6] != 0:
                _mark_written(image.written, trow, vr[r, 0] - tb, vr[r])
    prof[P_WRITTEN] += ticks() - t0


@kjit
def _copy(mem, srow, so, drow, do, nb):  # type: ignore[no-untyped-def]
    """mem[drow, do:do+nb] = mem[srow, so:so+nb] for ranges that do not overlap."""
    src = mem[srow, so:so + nb]
    dst = mem[drow, do:do + nb]
    for b in range(nb):
        dst[b] = src[b]


@kjit_parallel
def copy_parallel(i0, i1, prog, x_src, x_dst, skip, image):  # type: ignore[no-untyped-def]
    """The copies of exchange transfers i0..i1 not skipped, over the cores
    (a race-free step without self-overlapping transfers only)."""
    for j in numba.prange(i1 - i0):
        if skip[j]:
            continue
        x = i0 + j
        st, dt = prog.x_src_tile[x], prog.x_dst_tile[x]
        _copy(image.mem, image.tile_row[st], x_src[j] - image.tile_base[st],
              image.tile_row[dt], x_dst[j] - image.tile_base[dt], prog.x_bytes[x])


@kjit
def exchange_checks(i0, i1, s, loop, it, prog, x_src, x_dst, skip, image, xrow, rstamp, rend,
                    rflag, serial, exact, regs, r_tile, r_owner, race, faults, counters,
                    prof):  # type: ignore[no-untyped-def]
    """The numerics checks of exchange step s (transfers at patched addresses
    x_src / x_dst): each end inside its tile's image window (else
    F_XFER_RANGE, and the transfer is skipped), sources written before
    (F_UNINIT), no race (F_RACE).  Returns (race found, number of
    transfers whose own source and destination overlap).

    The race check works on the buffer rows the ends were found in
    (`xrow[2x]` source, `xrow[2x + 1]` destination, rows of the access
    index; live tensor buffers of a tile never overlap unless `exact`, which
    the caller sets when some do): a step is proven race-free when no source
    lies in a buffer some destination of the step lies in, and within each
    destination buffer the destinations come in increasing address order
    without overlap (`rend[row]`: the end of the last one, valid while
    `rstamp[row] == serial`, a number no other step execution uses).
    A buffer where either fails is flagged (`rflag[row] = serial`), and the
    transfer ends in flagged buffers are sorted and swept exactly by
    `find_race`: a race needs a destination and a second end in its buffer,
    so no other end can take part in one."""
    x_src_tile, x_dst_tile, x_bytes = prog.x_src_tile, prog.x_dst_tile, prog.x_bytes
    written, tile_row = image.written, image.tile_row
    tile_base, tile_size = image.tile_base, image.tile_size
    t0 = ticks()
    n_self = 0
    clash = exact
    for x in range(i0, i1):
        j = x - i0
        nb = x_bytes[x]
        st, dt = x_src_tile[x], x_dst_tile[x]
        sa, da = x_src[j], x_dst[j]
        srow, drow = tile_row[st], tile_row[dt]
        sb, db = tile_base[st], tile_base[dt]
        if skip[j]:  # an endpoint outside every live buffer (_check_transfer)
            continue
        if srow < 0 or sa < sb or sa + nb > sb + tile_size[st]:
            fault(faults, counters, F_XFER_RANGE, s, st, sa, loop, it, x, nb)
            skip[j] = True
        if drow < 0 or da < db or da + nb > db + tile_size[dt]:
            fault(faults, counters, F_XFER_RANGE, s, dt, da, loop, it, x, nb)
            skip[j] = True
        if skip[j]:
            continue
        if srow == drow and sa - sb < da - db + nb and da - db < sa - sb + nb:
            n_self += 1
        k = xrow[2 * x + 1]
        if rstamp[k] != serial:
            rstamp[k] = serial
            rend[k] = da + nb
        else:
            if da < rend[k]:
                rflag[k] = serial
                clash = True
            rend[k] = max(rend[k], da + nb)
        bad = bits_first_unset(written, srow, sa - sb, nb)
        if bad >= 0:
            fault(faults, counters, F_UNINIT, s, st, bad + sb, loop, it, x, 0)
    for x in range(i0, i1):
        k = xrow[2 * x]
        if not skip[x - i0] and rstamp[k] == serial:
            rflag[k] = serial  # a source in a destination buffer (or its own)
            clash = True
    raced = False
    if clash:  # the exact check, over the ends in flagged buffers (all if `exact`)
        nreg = 0
        for x in range(i0, i1):
            j = x - i0
            if skip[j]:
                continue
            for side in range(2):
                if not exact and rflag[xrow[2 * x + side]] != serial:
                    continue
                r_tile[nreg] = x_src_tile[x] if side == 0 else x_dst_tile[x]
                r_owner[nreg] = x  # vertices never share a step with transfers
                nreg = put_region(regs, nreg, x_src[j] if side == 0 else x_dst[j], 1, 0, 1, 0,
                                  x_bytes[x], side)
        raced = find_race(regs, r_tile, r_owner, nreg, race)
    if raced:
        fault(faults, counters, F_RACE, s, r_tile[race[1]], race[2], loop, it,
              r_owner[race[1]], r_owner[race[0]])
    prof[P_XCHECK] += ticks() - t0
    return raced, n_self


@kjit
def copy_serial(i0, i1, prog, x_src, x_dst, skip, image, stage, staged):  # type: ignore[no-untyped-def]
    """The copies of exchange transfers i0..i1 not skipped, in this thread.
    Every copy reads the pre-step state: in a race-free step copying each
    transfer directly gives exactly that, in any order; a `staged` step (one
    with a race) gathers every source into `stage` first, then writes.  A
    transfer whose own source and destination overlap goes through `stage`."""
    x_src_tile, x_dst_tile, x_bytes = prog.x_src_tile, prog.x_dst_tile, prog.x_bytes
    mem, tile_row, tile_base = image.mem, image.tile_row, image.tile_base
    if staged:
        off = 0
        for x in range(i0, i1):
            j = x - i0
            if not skip[j]:
                nb = x_bytes[x]
                so = x_src[j] - tile_base[x_src_tile[x]]
                stage[off:off + nb] = mem[tile_row[x_src_tile[x]], so:so + nb]
                off += nb
    off = 0
    for x in range(i0, i1):
        j = x - i0
        if skip[j]:
            continue
        nb = x_bytes[x]
        srow, so = tile_row[x_src_tile[x]], x_src[j] - tile_base[x_src_tile[x]]
        drow, do = tile_row[x_dst_tile[x]], x_dst[j] - tile_base[x_dst_tile[x]]
        if staged:
            mem[drow, do:do + nb] = stage[off:off + nb]
            off += nb
        elif srow == drow and so < do + nb and do < so + nb:
            stage[:nb] = mem[srow, so:so + nb]
            mem[drow, do:do + nb] = stage[:nb]
        else:
            _copy(mem, srow, so, drow, do, nb)


@kjit
def mark_copied(i0, i1, prog, x_dst, skip, image):  # type: ignore[no-untyped-def]
    """Mark the destinations of the exchange transfers not skipped written."""
    for x in range(i0, i1):
        j = x - i0
        if not skip[j]:
            t = prog.x_dst_tile[x]
            bits_set(image.written, image.tile_row[t], x_dst[j] - image.tile_base[t],
                     prog.x_bytes[x])
