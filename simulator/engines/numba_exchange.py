"""The exchange step of the Numba engine (simulator.engines.numba runs the
loop): its transfers' patched addresses and run-time buffer checks, its
bytes in and out (its cycles are the exchange schedule's window,
simulator.xschedule), the numerics checks of its transfers and their
copies in the memory image.

A large step runs each per-transfer pass on the machine's cores, in chunks
of consecutive transfers (every write goes to the transfer's own entries;
faults are recorded as bits and reported afterwards, in program order):
the patches and buffer checks, with numerics the image checks
(`check_ends`: the image is not written before the copies); the race check
in this thread; then the copies, when the step is race-free (its transfers
then touch disjoint bytes, so their order cannot change a result), as
row-slice loops (vectorized), and their destinations marked written by
classes of tiles (`part_of`: the bitmap words several transfers share are
one core's), a run of transfers filling consecutive bytes at a time.
A step with a race, or one run outside the main thread
(simulator.engines.numba.execute), runs in program order in this thread.
"""

from __future__ import annotations

import numba
import numpy as np

from kernels.abi import PATCH_XFER_SRC
from kernels.cost import put_region
from simulator.access import (
    B_ADDR,
    B_END,
    bits_all_set,
    bits_first_unset,
    bits_set,
    find_race,
    granule_of,
    live_buffer,
    patched,
)
from simulator.engines.base import (
    F_DST_BUFFER,
    F_MISALIGNED,
    F_RACE,
    F_SRC_BUFFER,
    F_UNINIT,
    F_XFER_RANGE,
)
from simulator.engines.numba_data import PARALLEL_CHUNKS, PARTS, fault, part_of
from tilecommon.jit import kjit, kjit_inline, kjit_parallel


@kjit_inline
def check_transfer(s, loop, it, x, st, src, dt, dst, nb, b_ptr, b_table, cached, xrow, xhint,
                    faults, counters, emit):  # type: ignore[no-untyped-def]
    """The run-time invariants of transfer x at step s, source then
    destination: in a live tensor buffer (else F_SRC_BUFFER / F_DST_BUFFER),
    aligned (else F_MISALIGNED).  Returns the bit set of `simulator.engines.numba._check_regions`;
    the access-index row an end was found in goes to `xrow[2x + side]`
    (-1 when none was).  When `cached` (the step ran before, so its rows
    were written), the row found last time is tried first; else
    `xhint[side * tiles + tile]`, the buffer row the last end on that side
    and tile was found in: a tile's transfers mostly read one buffer or
    fill another, so the lookup tries it first."""
    bad = 0
    g = granule_of(1, 0, 1, 0, nb)
    for side in range(2):
        tile = st if side == 0 else dt
        addr = src if side == 0 else dst
        k = 2 * x + side
        j = xrow[k] if cached else -1
        if not (j >= 0 and b_table[j, B_ADDR] <= addr and addr + nb <= b_table[j, B_END]):
            hk = side * (b_ptr.shape[0] - 1) + tile
            j = live_buffer(tile, addr, addr + nb, 1, s, b_ptr, b_table, xhint[hk])
            xrow[k] = j
            if j < 0:
                if emit:
                    fault(faults, counters, F_SRC_BUFFER if side == 0 else F_DST_BUFFER, s,
                          tile, addr, loop, it, x, nb)
                bad |= 1
                continue
            xhint[hk] = j
        if addr & (g - 1) != 0:  # g is 1, 2 or 4
            if emit:
                fault(faults, counters, F_MISALIGNED, s, tile, addr, loop, it, x, g)
            bad |= 2
    return bad


@kjit_inline
def xfer_one(x, j, s, loop, it, prog, ctr, x_src, x_dst, xflag, cached, xrow, xhint, xok,
              faults, counters, checks, emit):  # type: ignore[no-untyped-def]
    """Transfer x of a step (its j-th): patched addresses into x_src[j] /
    x_dst[j], the bits of `check_transfer` into xflag[j] (faults recorded
    only when `emit`).  A transfer checked clean without patches is not
    checked again (xok)."""
    src, dst = prog.x_src_addr[x], prog.x_dst_addr[x]
    for q in range(prog.xp_ptr[x], prog.xp_ptr[x + 1]):
        p = prog.xp_list[q]
        val = patch_value(p, ctr, prog)
        if prog.p_target[p] == PATCH_XFER_SRC:
            src = val
        else:
            dst = val
    x_src[j] = src
    x_dst[j] = dst
    xflag[j] = 0
    if checks and not xok[x]:
        xbad = check_transfer(s, loop, it, x, prog.x_src_tile[x], src, prog.x_dst_tile[x], dst,
                               prog.x_bytes[x], prog.b_ptr, prog.b_table, cached, xrow, xhint,
                               faults, counters, emit)
        xflag[j] = xbad
        if xbad == 0 and prog.xp_ptr[x] == prog.xp_ptr[x + 1]:
            xok[x] = True


# chunks of a parallel exchange pass: a row of per-tile bytes in each
# (`xhist`), so few; the thread pool hands each core consecutive chunks
X_CHUNKS = 8
C_FLAGGED, C_ENDS, C_SELF = 0, 1, 2  # xcnt columns


@kjit_parallel
def xfer_pass_parallel(i0, i1, s, loop, it, prog, ctr, x_src, x_dst, xflag, cached, xrow, xok,
                        faults, counters, checks, image, skip, xbits, xhist, xcnt, rsrc,
                        serial):  # type: ignore[no-untyped-def]
    """With numerics: `xfer_one` for transfers i0..i1 over the cores in
    `x_chunks(n)` chunks, recording no fault (every write goes to the
    transfer's own entries or its chunk's; the caller reports the flagged
    ones), each transfer's `check_ends` into xbits[j] (the image is not
    written until the step's copies, so they may run here), and per chunk
    ch: bytes in per destination tile (`xhist[ch]`), how many transfers were
    flagged, how many have faulty ends and how many overlap themselves
    (`xcnt[ch]`);
    the row of each source not skipped is stamped (`rsrc[row] = serial`:
    exchange_ends; cores may stamp a row at once, with the same value)."""
    n = i1 - i0
    chunks = x_chunks(n)
    for ch in numba.prange(chunks):
        xhint = np.full(2 * (prog.b_ptr.shape[0] - 1), -1, dtype=np.int64)
        h = xhist[ch]
        h[:] = 0
        flagged, bad_ends, n_self = 0, 0, 0
        for x in range(i0 + ch * n // chunks, i0 + (ch + 1) * n // chunks):
            j = x - i0
            xfer_one(x, j, s, loop, it, prog, ctr, x_src, x_dst, xflag, cached, xrow, xhint,
                      xok, faults, counters, checks, False)
            skip[j] = (xflag[j] & 1) != 0
            xbits[j] = check_ends(x, j, prog, x_src, x_dst, skip, image)
            bad_ends += (xbits[j] & (E_SRC_RANGE | E_DST_RANGE | E_UNINIT)) != 0
            if not skip[j]:
                rsrc[xrow[2 * x]] = serial
                n_self += (xbits[j] & E_SELF) != 0
            h[prog.x_dst_tile[x]] += prog.x_bytes[x]
            flagged += xflag[j] != 0
        xcnt[ch, C_FLAGGED] = flagged
        xcnt[ch, C_ENDS] = bad_ends
        xcnt[ch, C_SELF] = n_self


@kjit
def report_flagged(i0, i1, s, loop, it, prog, x_src, x_dst, xflag, xrow, xhint, faults,
                   counters):  # type: ignore[no-untyped-def]
    """The faults of the transfers `xfer_pass_parallel` flagged, in program
    order (`check_transfer` again, recording them)."""
    for x in range(i0, i1):
        j = x - i0
        if xflag[j] != 0:
            check_transfer(s, loop, it, x, prog.x_src_tile[x], x_src[j], prog.x_dst_tile[x],
                           x_dst[j], prog.x_bytes[x], prog.b_ptr, prog.b_table, False, xrow,
                           xhint, faults, counters, True)


@kjit_inline
def x_chunks(n):  # type: ignore[no-untyped-def]
    """Chunks of a parallel exchange pass over n transfers (chunk ch: the
    step's transfers ch * n // chunks up to (ch + 1) * n // chunks)."""
    return max(min(n, X_CHUNKS), 1)


@kjit
def bytes_in_hist(xhist, chunks, bytes_in):  # type: ignore[no-untyped-def]
    """Add each tile's bytes in from the per-chunk counts of
    `xfer_pass_parallel` to `bytes_in`."""
    for t in range(bytes_in.shape[0]):
        for ch in range(chunks):
            bytes_in[t] += xhist[ch, t]


@kjit_inline
def patch_value(p, ctr, prog):  # type: ignore[no-untyped-def]
    """The value of patch `p` at the loop counters `ctr`."""
    return patched(prog.p_mode[p], prog.p_base[p], prog.p_stride[p], prog.p_table[p],
                   ctr[prog.p_loop[p]], prog.table_values)


@kjit
def keep_exchange_row(i0, i1, r, prog, agg_out, agg_sb, agg_rb):  # type: ignore[no-untyped-def]
    """Row r of `agg_out` / `agg_sb` / `agg_rb`: the per-tile bytes out (each
    send of the schedule once: `x_lead`) and lane and port cycles of
    transfers i0..i1."""
    for x in range(i0, i1):
        st = prog.x_src_tile[x]
        if prog.x_lead[x]:
            agg_out[r, st] += prog.x_bytes[x]
        agg_sb[r, st] += prog.x_lane[x]
        agg_rb[r, prog.x_dst_tile[x]] += prog.x_port[x]


@kjit
def keep_bytes_in(i0, i1, r, prog, xflag, agg_in):  # type: ignore[no-untyped-def]
    """Row r of `agg_in`: the per-tile bytes in of transfers i0..i1, if none
    of them was flagged by its checks (`xflag`, by position in the step);
    False (no row) else."""
    for x in range(i0, i1):
        if xflag[x - i0] != 0:
            return False
    for x in range(i0, i1):
        agg_in[r, prog.x_dst_tile[x]] += prog.x_bytes[x]
    return True


# bits of `check_ends`
E_SRC_RANGE, E_DST_RANGE, E_UNINIT, E_SELF = 1, 2, 4, 8


@kjit_inline
def check_ends(x, j, prog, x_src, x_dst, skip, image):  # type: ignore[no-untyped-def]
    """The image checks of transfer x (the j-th of its step, at patched
    addresses x_src[j] / x_dst[j]), unless skipped: each end inside its
    tile's image window (E_SRC_RANGE / E_DST_RANGE: the transfer is then
    skipped), else its source written before (E_UNINIT) and whether its
    own source and destination overlap (E_SELF).  One exit: it is inlined
    into a parallel loop."""
    bits = 0
    if not skip[j]:  # else an endpoint outside every live buffer (check_transfer)
        nb = prog.x_bytes[x]
        st, dt = prog.x_src_tile[x], prog.x_dst_tile[x]
        sa, da = x_src[j], x_dst[j]
        srow, drow = image.tile_row[st], image.tile_row[dt]
        sb, db = image.tile_base[st], image.tile_base[dt]
        if srow < 0 or sa < sb or sa + nb > sb + image.tile_size[st]:
            bits |= E_SRC_RANGE
        if drow < 0 or da < db or da + nb > db + image.tile_size[dt]:
            bits |= E_DST_RANGE
        if bits != 0:
            skip[j] = True
        else:
            if srow == drow and sa - sb < da - db + nb and da - db < sa - sb + nb:
                bits |= E_SELF
            if not bits_all_set(image.written, srow, sa - sb, nb):
                bits |= E_UNINIT
    return bits


@kjit
def ends_serial(i0, i1, prog, x_src, x_dst, skip, image, xbits):  # type: ignore[no-untyped-def]
    """`check_ends` of transfers i0..i1 in this thread, into xbits[j]."""
    for j in range(i1 - i0):
        xbits[j] = check_ends(i0 + j, j, prog, x_src, x_dst, skip, image)


@kjit
def exchange_ends(i0, i1, s, loop, it, prog, x_src, x_dst, skip, image, xrow, xbits, rsrc,
                  serial, faults, counters, sourced):  # type: ignore[no-untyped-def]
    """The numerics checks of exchange step s (transfers at patched addresses
    x_src / x_dst) once `check_ends` put its bits in `xbits`: the faults of
    those bits, in transfer order (F_XFER_RANGE, F_UNINIT), and the first
    part of the race
    proof: the row of every source not skipped is stamped (`rsrc[row] =
    serial`, a number no other step execution uses), unless the parallel
    pass did (`sourced`).  Returns the number of transfers whose own source
    and destination overlap.

    The race proof works on the buffer rows the ends were found in
    (`xrow[2x]` source, `xrow[2x + 1]` destination, rows of the access
    index; live tensor buffers of a tile never overlap unless the package
    has some that do, and then every step takes `exchange_race`): a step is
    race-free when no source lies in a buffer some destination of the step
    lies in, and within each destination buffer the destinations come in
    increasing address order without overlap (`race_rows`).  A buffer
    where either fails is flagged, and `exchange_race` sweeps the ends in
    flagged buffers exactly."""
    x_src_tile, x_bytes = prog.x_src_tile, prog.x_bytes
    n_self = 0
    for x in range(i0, i1):
        j = x - i0
        bits = xbits[j]
        if bits & (E_SRC_RANGE | E_DST_RANGE | E_UNINIT) != 0:
            st, dt, nb = x_src_tile[x], prog.x_dst_tile[x], x_bytes[x]
            if bits & E_SRC_RANGE:
                fault(faults, counters, F_XFER_RANGE, s, st, x_src[j], loop, it, x, nb)
            if bits & E_DST_RANGE:
                fault(faults, counters, F_XFER_RANGE, s, dt, x_dst[j], loop, it, x, nb)
            if bits & E_UNINIT:
                sb = image.tile_base[st]
                bad = bits_first_unset(image.written, image.tile_row[st], x_src[j] - sb, nb)
                fault(faults, counters, F_UNINIT, s, st, bad + sb, loop, it, x, 0)
        if not skip[j]:
            n_self += (bits & E_SELF) != 0
            if not sourced:
                rsrc[xrow[2 * x]] = serial
    return n_self


@kjit
def exchange_race(i0, i1, s, loop, it, prog, x_src, x_dst, skip, xrow, rflag, serial, exact,
                  regs, r_tile, r_owner, race, faults, counters):  # type: ignore[no-untyped-def]
    """The exact race check of exchange step s over the transfer ends in
    buffers `race_rows` flagged (`rflag[row] == serial`; every end if
    `exact`): sorted and swept by `find_race` (a race needs a destination
    and a second end in its buffer, so no other end can take part in one).
    Records F_RACE and returns True if there is one."""
    nreg = 0
    for x in range(i0, i1):
        j = x - i0
        if skip[j]:
            continue
        for side in range(2):
            if not exact and rflag[xrow[2 * x + side]] != serial:
                continue
            r_tile[nreg] = prog.x_src_tile[x] if side == 0 else prog.x_dst_tile[x]
            r_owner[nreg] = x  # vertices never share a step with transfers
            nreg = put_region(regs, nreg, x_src[j] if side == 0 else x_dst[j], 1, 0, 1, 0,
                              prog.x_bytes[x], side)
    raced = find_race(regs, r_tile, r_owner, nreg, race)
    if raced:
        fault(faults, counters, F_RACE, s, r_tile[race[1]], race[2], loop, it,
              r_owner[race[1]], r_owner[race[0]])
    return raced


RACE_PARTS = 2  # classes of tiles of a parallel `race_rows` pass (one scan each)
MARK_PARTS = 2  # groups of `part_of` classes of copy_parallel's marking (one scan each)


@kjit_parallel
def race_rows_parallel(i0, i1, prog, x_dst, skip, xrow, rstamp, rend, rsrc, rflag, serial,
                       per):  # type: ignore[no-untyped-def]
    """`race_rows` over the cores, each the destination tiles of its class
    (a row is one tile's); `per`: RACE_PARTS scratch entries."""
    for p in numba.prange(RACE_PARTS):
        per[p] = race_rows(i0, i1, prog, x_dst, skip, xrow, rstamp, rend, rsrc, rflag, serial,
                           p, RACE_PARTS)
    return per[:RACE_PARTS].any()


@kjit
def race_rows_serial(i0, i1, prog, x_dst, skip, xrow, rstamp, rend, rsrc, rflag,
                     serial):  # type: ignore[no-untyped-def]
    """`race_rows` of every destination tile, in this thread."""
    return race_rows(i0, i1, prog, x_dst, skip, xrow, rstamp, rend, rsrc, rflag, serial, 0, 1)


@kjit_inline
def race_rows(i0, i1, prog, x_dst, skip, xrow, rstamp, rend, rsrc, rflag, serial, p,
              parts):  # type: ignore[no-untyped-def]
    """The destination side of the race proof (`exchange_ends`) for the
    transfers not skipped into tiles of class p of `parts` (tile % parts),
    in program order: a destination row holding a source (`rsrc`) or
    reached below the end of the row's last destination (`rend`, valid
    while `rstamp[row] == serial`) is flagged; returns whether one was.
    One exit: it is inlined into a parallel loop."""
    clash = False
    for x in range(i0, i1):
        j = x - i0
        if skip[j] or (parts > 1 and prog.x_dst_tile[x] % parts != p):
            continue
        k = xrow[2 * x + 1]
        if rsrc[k] == serial:  # a destination in a source's buffer (or its own)
            rflag[k] = serial
            clash = True
        end = x_dst[j] + prog.x_bytes[x]
        if rstamp[k] != serial:
            rstamp[k] = serial
            rend[k] = end
        else:
            if x_dst[j] < rend[k]:
                rflag[k] = serial
                clash = True
            rend[k] = max(rend[k], end)
    return clash


@kjit_inline
def _copy(mem, srow, so, drow, do, nb):  # type: ignore[no-untyped-def]
    """mem[drow, do:do+nb] = mem[srow, so:so+nb] for ranges that do not overlap
    (inlined: a call per transfer cost a fifth of the copies' time)."""
    src = mem[srow, so:so + nb]
    dst = mem[drow, do:do + nb]
    for b in range(nb):
        dst[b] = src[b]


@kjit_parallel
def copy_parallel(i0, i1, prog, x_src, x_dst, skip, image):  # type: ignore[no-untyped-def]
    """The copies of exchange transfers i0..i1 not skipped, over the cores in
    chunks of consecutive transfers (a race-free step without
    self-overlapping transfers only: its copies touch disjoint bytes), then
    their destinations marked written, each core the tiles of its class
    (`part_of`: bitmap words several transfers share are one core's)."""
    n = i1 - i0
    chunks = min(n, PARALLEL_CHUNKS)
    mem = image.mem
    for ch in numba.prange(chunks):
        for j in range(ch * n // chunks, (ch + 1) * n // chunks):
            if skip[j]:
                continue
            x = i0 + j
            st, dt = prog.x_src_tile[x], prog.x_dst_tile[x]
            _copy(mem, image.tile_row[st], x_src[j] - image.tile_base[st], image.tile_row[dt],
                  x_dst[j] - image.tile_base[dt], prog.x_bytes[x])
    for p in numba.prange(MARK_PARTS):  # a scan of the step per core
        mark_runs(i0, i1, prog, x_dst, skip, image, p, MARK_PARTS)


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
    mark_runs(i0, i1, prog, x_dst, skip, image, 0, 1)


@kjit_inline
def mark_runs(i0, i1, prog, x_dst, skip, image, p, parts):  # type: ignore[no-untyped-def]
    """Mark written the destinations of the transfers i0..i1 not skipped into
    tiles of class p of `parts` (`part_of` classes grouped in `parts`, which
    divides PARTS; all tiles when parts is 1), a
    run of transfers filling consecutive bytes of one tile at a time (a row
    split over sources lands that way: fewer partial bitmap words)."""
    rt, ra, re = np.int64(-1), np.int64(0), np.int64(0)
    for x in range(i0, i1):
        j = x - i0
        t = prog.x_dst_tile[x]
        if skip[j] or (parts > 1 and part_of(t) * parts // PARTS != p):
            continue
        if t == rt and x_dst[j] == re:
            re += prog.x_bytes[x]
            continue
        if rt >= 0:
            bits_set(image.written, image.tile_row[rt], ra - image.tile_base[rt], re - ra)
        rt, ra, re = t, x_dst[j], x_dst[j] + prog.x_bytes[x]
    if rt >= 0:
        bits_set(image.written, image.tile_row[rt], ra - image.tile_base[rt], re - ra)
