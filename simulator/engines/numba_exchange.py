"""The exchange step of the Numba engine (simulator.engines.numba runs the
loop): its transfers' patched addresses and run-time buffer checks, its
cycles (simulator.timing), the numerics checks of its transfers and their
copies in the memory image.

With numerics, a large step's cycles and its checks are independent (the
cycles read only the transfers' sizes and tiles, the checks only the image
and the transfers' addresses), so `cycles_and_checks` runs them on the two
cores at once.  Copies run on all cores when the step is race-free (its
transfers then touch disjoint bytes, so their order cannot change a result)
and as row-slice loops (vectorized), not byte loops; each core copies the
transfers into its own class of tiles and marks them written, as no other
core touches those tiles' bitmap rows (whose words several transfers share).
A step with a race, or one run outside the main thread
(simulator.engines.numba.execute), runs in program order in this thread.
"""

from __future__ import annotations

import numba
import numpy as np

from kernels.abi import PATCH_ARITH, PATCH_XFER_SRC
from kernels.cost import put_region
from kernels.jit import kjit, kjit_inline, kjit_parallel
from simulator.access import (
    B_ADDR,
    B_END,
    bits_first_unset,
    bits_set,
    find_race,
    granule_of,
    live_buffer,
    tile_order,
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
from simulator.engines.ticks import ticks
from simulator.timing import DV_IN_BW, DV_OUT_BW, DV_RECV, DV_SEND, DV_SEND_MAX, DV_SYNC

P_XCHECK = 6  # the profile's phase (Outputs.prof) of exchange_checks


@kjit_inline
def check_transfer(s, loop, it, x, st, src, dt, dst, nb, b_ptr, b_table, xbuf, xrow, xhint,
                    faults, counters, emit):  # type: ignore[no-untyped-def]
    """The run-time invariants of transfer x at step s, source then
    destination: in a live tensor buffer (else F_SRC_BUFFER / F_DST_BUFFER),
    aligned (else F_MISALIGNED).  Returns the bit set of `simulator.engines.numba._check_regions`;
    the access-index row an end was found in goes to `xrow[2x + side]`.
    `xhint[side]` is the buffer row the previous transfer's end on that side
    was found in: consecutive transfers mostly read one buffer and fill
    another, so the lookup tries it first when it is a row of the same tile."""
    bad = 0
    g = granule_of(1, 0, 1, 0, nb)
    for side in range(2):
        tile = st if side == 0 else dt
        addr = src if side == 0 else dst
        k = 4 * x + 2 * side  # the bounds of the buffer found last time (as _check_regions does)
        if not (xbuf[k] <= addr and addr + nb <= xbuf[k + 1]):
            h = xhint[side]
            if not (b_ptr[tile] <= h and h < b_ptr[tile + 1]):
                h = -1
            j = live_buffer(tile, addr, addr + nb, 1, s, b_ptr, b_table, h)
            if j < 0:
                if emit:
                    fault(faults, counters, F_SRC_BUFFER if side == 0 else F_DST_BUFFER, s,
                          tile, addr, loop, it, x, nb)
                bad |= 1
                continue
            xbuf[k], xbuf[k + 1] = b_table[j, B_ADDR], b_table[j, B_END]
            xrow[2 * x + side] = j
            xhint[side] = j
        if addr & (g - 1) != 0:  # g is 1, 2 or 4
            if emit:
                fault(faults, counters, F_MISALIGNED, s, tile, addr, loop, it, x, g)
            bad |= 2
    return bad


@kjit_inline
def xfer_one(x, j, s, loop, it, prog, ctr, x_src, x_dst, xflag, xbuf, xrow, xhint, xok,
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
                               prog.x_bytes[x], prog.b_ptr, prog.b_table, xbuf, xrow, xhint,
                               faults, counters, emit)
        xflag[j] = xbad
        if xbad == 0 and prog.xp_ptr[x] == prog.xp_ptr[x + 1]:
            xok[x] = True


@kjit_parallel
def xfer_pass_parallel(i0, i1, s, loop, it, prog, ctr, x_src, x_dst, xflag, xbuf, xrow, xok,
                        faults, counters, checks):  # type: ignore[no-untyped-def]
    """`xfer_one` for transfers i0..i1 over the cores, recording no fault
    (every write goes to the transfer's own entries; the caller reports the
    flagged ones)."""
    n = i1 - i0
    chunks = min(n, PARALLEL_CHUNKS)
    for ch in numba.prange(chunks):
        xhint = np.full(2, -1, dtype=np.int64)
        for x in range(i0 + ch * n // chunks, i0 + (ch + 1) * n // chunks):
            xfer_one(x, x - i0, s, loop, it, prog, ctr, x_src, x_dst, xflag, xbuf, xrow, xhint,
                      xok, faults, counters, checks, False)


@kjit_inline
def patch_value(p, ctr, prog):  # type: ignore[no-untyped-def]
    """The value of patch `p` at the loop counters `ctr`."""
    i = ctr[prog.p_loop[p]]
    if prog.p_mode[p] == PATCH_ARITH:
        return prog.p_base[p] + i * prog.p_stride[p]
    return prog.table_values[prog.p_table[p] + i]


@kjit_parallel
def cycles_and_checks(i0, i1, s, loop, it, prog, x_src, x_dst, skip, image, xrow, rstamp,
                      rend, rflag, serial, exact, regs, r_tile, r_owner, race, faults, counters,
                      prof, keys, ktile, acc, acc2, n_in, n_out, mark, touched, n_touched,
                      bytes_out, xout, devv, res):  # type: ignore[no-untyped-def]
    """`exchange_cycles` on one core while `exchange_checks` runs on the
    other: res = (cycles, race found, transfers overlapping themselves)."""
    for task in numba.prange(2):
        if task == 0:
            res[0] = exchange_cycles(i0, i1, keys, ktile, prog.x_bytes, acc, acc2, n_in, n_out,
                                     mark, touched, n_touched, bytes_out, xout, devv)
        else:
            raced, n_self = exchange_checks(i0, i1, s, loop, it, prog, x_src, x_dst, skip,
                                            image, xrow, rstamp, rend, rflag, serial, exact,
                                            regs, r_tile, r_owner, race, faults, counters, prof)
            res[1] = raced
            res[2] = n_self


@kjit
def exchange_cycles(i0, i1, keys, ktile, x_bytes, acc, acc2, n_in, n_out, mark, touched,
                     n_touched, bytes_out, xout, devv):  # type: ignore[no-untyped-def]
    """Cycles of one exchange step (simulator.timing) from the bytes in and
    receives already in `acc` / `n_in`; counts bytes out and send instructions
    once per distinct (src tile, src addr, bytes) and records in `xout` which
    transfers counted; resets the per-tile scratch."""
    n = i1 - i0
    order = tile_order(ktile, keys, n)
    for j in range(n):
        x = i0 + order[j]
        dup = False
        k = j - 1
        while (k >= 0 and keys[order[k]] == keys[order[j]]
               and ktile[order[k]] == ktile[order[j]]):
            if x_bytes[i0 + order[k]] == x_bytes[x]:
                dup = True
                break
            k -= 1
        xout[x] = not dup
        if dup:
            continue
        t = ktile[order[j]]
        if not mark[t]:
            mark[t] = True
            touched[n_touched] = t
            n_touched += 1
        acc2[t] += x_bytes[x]
        n_out[t] += (x_bytes[x] + devv[DV_SEND_MAX] - 1) // devv[DV_SEND_MAX]
        bytes_out[t] += x_bytes[x]
    step_c = np.int64(0)
    for k in range(n_touched):
        t = touched[k]
        c_in = max((acc[t] + devv[DV_IN_BW] - 1) // devv[DV_IN_BW], n_in[t] * devv[DV_RECV])
        c_out = max((acc2[t] + devv[DV_OUT_BW] - 1) // devv[DV_OUT_BW], n_out[t] * devv[DV_SEND])
        step_c = max(step_c, c_in, c_out)
        acc[t] = 0
        acc2[t] = 0
        n_in[t] = 0
        n_out[t] = 0
        mark[t] = False
    return step_c + devv[DV_SYNC]


@kjit
def keep_exchange_row(i0, i1, r, x_src_tile, x_dst_tile, x_bytes, xflag, xout, agg_in,
                      agg_out):  # type: ignore[no-untyped-def]
    """Row r of `agg_in` / `agg_out`: the per-tile bytes in and out (each
    multicast once: `xout`) of transfers i0..i1, if none of them was flagged
    by its checks (`xflag`, by position in the step); False (no row) else."""
    for x in range(i0, i1):
        if xflag[x - i0] != 0:
            return False
    for x in range(i0, i1):
        agg_in[r, x_dst_tile[x]] += x_bytes[x]
        if xout[x]:
            agg_out[r, x_src_tile[x]] += x_bytes[x]
    return True


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
def _copy(mem, srow, so, drow, do, nb):  # type: ignore[no-untyped-def]
    """mem[drow, do:do+nb] = mem[srow, so:so+nb] for ranges that do not overlap."""
    src = mem[srow, so:so + nb]
    dst = mem[drow, do:do + nb]
    for b in range(nb):
        dst[b] = src[b]


@kjit_parallel
def copy_parallel(i0, i1, prog, x_src, x_dst, skip, image):  # type: ignore[no-untyped-def]
    """The copies of exchange transfers i0..i1 not skipped, with their
    destinations marked written, over the cores (a race-free step without
    self-overlapping transfers only): part p takes the transfers into tiles
    of class p, whose bitmap rows no other part touches
    (simulator.engines.numba_data.part_of)."""
    for p in numba.prange(PARTS):
        for j in range(i1 - i0):
            x = i0 + j
            dt = prog.x_dst_tile[x]
            if skip[j] or part_of(dt) != p:
                continue
            st = prog.x_src_tile[x]
            do = x_dst[j] - image.tile_base[dt]
            _copy(image.mem, image.tile_row[st], x_src[j] - image.tile_base[st],
                  image.tile_row[dt], do, prog.x_bytes[x])
            bits_set(image.written, image.tile_row[dt], do, prog.x_bytes[x])


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
