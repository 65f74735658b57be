"""The verifier's static pass over every access of every step and Repeat iteration.

`scan_accesses` (jitted) walks the COMPUTE and EXCHANGE steps in order.  A
step whose items carry patches is checked once per combination of the
counters of the loops driving them (iteration 0 first); a step without
patches once.  Per step and combination:

- COMPUTE: each vertex operand region (`kernels.dispatch.vertex_regions`) is
  aligned (`access.granule_of`) and inside one live tensor buffer of its tile
  (`access.find_row`), with no more rows than that buffer has bytes; then the
  exact strided race check `access.find_race` over all regions.
- EXCHANGE: every endpoint is one byte interval `[addr, addr + bytes)`.
  Bounds and alignment in transfer order, source before destination.
  Races: destinations are the only writers and each transfer has one, so
  after sorting them by (tile, address) any two overlapping ones race; the
  sorted destinations are then disjoint, and each source is looked up among
  the destinations of its tile and races with any overlapping one of another
  transfer.  A source equal to the previous one that overlapped no destination
  needs no second lookup (multicast).

Buffer lookups go through a per-tile cache of the last buffer found at this
step: two buffers of a tile live at one step never overlap
(`verify._check_buffers`), so a cached buffer holding an access is the one
`find_row` would find.

Later iterations (iteration 0 equals the unpatched package, `verify` checked
that) re-check only what a patch can change: on COMPUTE steps the vertices on
the tiles of patched vertices (a race needs two regions on one tile); on
EXCHANGE steps whose patches all rewrite sources, only the patched sources,
against the destinations sorted in iteration 0 (unchanged); steps with
patched destinations are re-checked whole.  An EXCHANGE step whose patches
rewrite sources driven by one loop is first checked for all its later
iterations at once (`_sources_always_hold`: each patched source's values
aligned, the hull of its reads inside one live buffer and clear of other
transfers' destinations; on batch-2 siglip-so400m-map 27 layers that
replaced 4.5 M re-checked reads, more than the package has transfers), and
iteration by iteration only when that fails, to name the first failure.

The result is exactly the race rule of simulator/access.py (no byte with two writers, or a
writer and a reader, of different vertices/transfers within a step).
"""

from __future__ import annotations

import numpy as np

from kernels.abi import MAX_REGIONS, N_ARGS, PATCH_ARITH, PATCH_XFER_DST, PATCH_XFER_SRC
from kernels.dispatch import vertex_check, vertex_regions
from simulator.access import (
    B_ADDR,
    B_END,
    R_LEN,
    find_race,
    find_row,
    granule_of,
    patched,
    span_of,
    tile_order_into,
)
from tilecommon.jit import kjit
from tilecommon.search import bisect_left

# `_overlapping_write` when no other transfer's destination overlaps a read
NO_OVERLAP, OWN_OVERLAP = -1, -2

# error codes of `scan_accesses`
E_REGION = 1  # vertex operand region not inside one live buffer
E_SRC = 2  # transfer source not inside one live buffer
E_DST = 3  # transfer destination not inside one live buffer
E_RACE = 4  # two writers / writer + reader within a step
E_KERNEL = 5  # kernel without a region description
E_ALIGN_V = 6  # vertex operand misaligned
E_ALIGN_X = 7  # transfer endpoint misaligned
E_ROWS = 8  # a region with more rows than bytes up to the tile's last buffer end
E_ARGS = 9  # the kernel's argument check failed (err[8]: the kernels.status code)

# columns of the patch table `scan_accesses` takes (int64 [patches, PT_LEN])
PT_TARGET = 0
PT_INDEX = 1
PT_ARG = 2
PT_LOOP = 3
PT_MODE = 4
PT_BASE = 5
PT_STRIDE = 6
PT_TABLE = 7  # first entry in table_values
PT_LEN = 8

# rows of the exchange scratch `scan_accesses` takes (int64 [XS_LEN, transfers of
# the biggest EXCHANGE step])
XS_SRC = 0  # patched source addresses
XS_DST = 1  # patched destination addresses
XS_LO = 2  # destinations sorted by (tile, address): start
XS_HI = 3  # ... end
XS_ORDER = 4  # ... transfer (offset in the step)
XS_TMP = 5
XS_LEN = 6
# rows of the tile scratch (int64 [TS_LEN, tiles + 2])
TS_LO = 0  # per-tile cache of the last live buffer found: [lo, hi)
TS_HI = 1
TS_PTR = 2  # destinations of tile t: sorted rows TS_PTR[t]..TS_PTR[t+1]
TS_START = 3
TS_MARK = 4  # tiles of the patched vertices of a step, marked with a stamp
TS_LEN = 5
# the compute scratch: regions (int64 [8 × vertices of the biggest COMPUTE step,
# access.R_LEN]) and per region (int64 [VS_LEN, same]) its tile and its vertex
VS_TILE = 0
VS_OWNER = 1
VS_LEN = 2


@kjit
def _patched_value(p, i, pt, table_values):  # type: ignore[no-untyped-def]
    return patched(pt[p, PT_MODE], pt[p, PT_BASE], pt[p, PT_STRIDE], pt[p, PT_TABLE], i,
                   table_values)


@kjit
def _exchange_bounds(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes, c_lo, c_hi,
                     t_ptr, table, err):  # type: ignore[no-untyped-def]
    """Alignment and buffer of the n endpoint pairs (src[k], dst[k]) of transfers
    i0 + k at step s, in transfer order.  Returns 0 or an E_* code (err filled).

    c_lo/c_hi[tile]: [addr, end) of the last buffer found on the tile at this
    step (empty when reset).  The cache check is written out in each loop, not
    called: a call passing arrays costs more than the lookup it saves."""
    for k in range(n):
        it = i0 + k
        nb = x_bytes[it]
        g = granule_of(1, 0, 1, 0, nb)
        for side in range(2):
            tile = x_src_tile[it] if side == 0 else x_dst_tile[it]
            addr = src[k] if side == 0 else dst[k]
            if addr % g != 0:
                err[1], err[2], err[3], err[4], err[8] = s, tile, addr, it, g
                return E_ALIGN_X
            if addr >= c_lo[tile] and addr + nb <= c_hi[tile]:
                continue
            j = find_row(tile, addr, addr + nb, s, t_ptr, table)
            if j < 0:
                err[1], err[2], err[3], err[4], err[8] = s, tile, addr, it, nb
                return E_SRC + side
            c_lo[tile], c_hi[tile] = table[j, B_ADDR], table[j, B_END]
    return 0


@kjit
def _name_pair(k, lo, w, w_lo, base, err):  # type: ignore[no-untyped-def]
    """err[4] (item) and err[7] (other) for a race between the source of transfer
    k (from lo) and the destination of transfer w (from w_lo), both offsets in
    the step: the endpoint starting later (source first on a tie, as listed
    in the step) is the item, as `access.find_race` names them."""
    if (w_lo, 2 * w + 1) < (lo, 2 * k):
        err[4], err[7] = base + k, base + w
    else:
        err[4], err[7] = base + w, base + k


@kjit
def _exchange_races(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes, n_v, xs, ts,
                    err):  # type: ignore[no-untyped-def]
    """Race check of the n transfers i0 + k (endpoints src[k] -> dst[k]) of step s.
    Returns 0 or E_RACE with err[1:4] = step, tile, address, err[4] the
    transfer's accessor id (n_v + transfer) and err[7] the other one's."""
    if n < 2:
        return 0
    d_tile = x_dst_tile[i0:i0 + n]
    order, w_lo, w_hi, w_ptr = xs[XS_ORDER], xs[XS_LO], xs[XS_HI], ts[TS_PTR]
    tile_order_into(d_tile, dst, n, order, xs[XS_TMP], ts[TS_START])
    w_ptr[:] = 0
    for q in range(n):
        k = order[q]
        w_lo[q] = dst[k]
        w_hi[q] = dst[k] + x_bytes[i0 + k]
        w_ptr[d_tile[k] + 1] += 1
        if q > 0 and d_tile[order[q - 1]] == d_tile[k] and w_lo[q] < w_hi[q - 1]:
            # sorted by start: disjoint so far, so the previous one ends last
            err[1], err[2], err[3] = s, d_tile[k], w_lo[q]
            err[4], err[7] = n_v + i0 + k, n_v + i0 + order[q - 1]
            return E_RACE
    for t in range(w_ptr.shape[0] - 1):
        w_ptr[t + 1] += w_ptr[t]
    last_tile, last_lo, last_hi = np.int64(-1), np.int64(0), np.int64(0)
    for k in range(n):
        tile = x_src_tile[i0 + k]
        lo = src[k]
        hi = lo + x_bytes[i0 + k]
        if tile == last_tile and lo == last_lo and hi == last_hi:
            continue
        q = _overlapping_write(tile, lo, hi, k, w_lo, w_hi, order, w_ptr)
        if q >= 0:
            err[1], err[2], err[3] = s, tile, max(lo, w_lo[q])
            _name_pair(k, lo, order[q], w_lo[q], i0 + n_v, err)
            return E_RACE
        if q == NO_OVERLAP:
            last_tile, last_lo, last_hi = tile, lo, hi
        else:
            last_tile = -1
    return 0


@kjit
def _overlapping_write(tile, lo, hi, k, w_lo, w_hi, order,
                       w_ptr):  # type: ignore[no-untyped-def]
    """The destinations written on `tile` (sorted by start, disjoint; rows
    w_ptr[tile]..w_ptr[tile+1]) against the read [lo, hi) of transfer k: the
    row of one written by another transfer (a race), else OWN_OVERLAP when
    only k's own destination overlaps, else NO_OVERLAP.  The last destination
    starting before hi is found by bisection; earlier ones end earlier."""
    q = bisect_left(w_lo, w_ptr[tile], w_ptr[tile + 1], hi) - 1
    found = NO_OVERLAP
    while q >= w_ptr[tile] and w_hi[q] > lo:
        if order[q] != k:
            return q
        found = OWN_OVERLAP
        q -= 1
    return found


@kjit
def _exchange_sources(s, i0, q0, q1, lst, pt, src, x_src_tile, x_bytes, n_v, c_lo, c_hi, t_ptr,
                      table, xs, ts, err):  # type: ignore[no-untyped-def]
    """A later iteration of an EXCHANGE step whose patches all rewrite sources:
    the destinations and the sorted index `_exchange_races` built for them in
    iteration 0 (still in xs/ts) are unchanged, so only the patched sources
    lst[q0:q1] (sorted by transfer) need their alignment, buffer and races
    checked.  Returns 0 or an E_* code (err filled)."""
    w_lo, w_hi, order, w_ptr = xs[XS_LO], xs[XS_HI], xs[XS_ORDER], ts[TS_PTR]
    for q in range(q0, q1):
        it = pt[lst[q], PT_INDEX]
        k = it - i0
        tile, lo, nb = x_src_tile[it], src[k], x_bytes[it]
        hi = lo + nb
        g = granule_of(1, 0, 1, 0, nb)
        if lo % g != 0:
            err[1], err[2], err[3], err[4], err[8] = s, tile, lo, it, g
            return E_ALIGN_X
        if lo < c_lo[tile] or hi > c_hi[tile]:
            j = find_row(tile, lo, hi, s, t_ptr, table)
            if j < 0:
                err[1], err[2], err[3], err[4], err[8] = s, tile, lo, it, nb
                return E_SRC
            c_lo[tile], c_hi[tile] = table[j, B_ADDR], table[j, B_END]
    for q in range(q0, q1):
        it = pt[lst[q], PT_INDEX]
        k = it - i0
        tile, lo = x_src_tile[it], src[k]
        r = _overlapping_write(tile, lo, lo + x_bytes[it], k, w_lo, w_hi, order, w_ptr)
        if r >= 0:
            err[1], err[2], err[3] = s, tile, max(lo, w_lo[r])
            _name_pair(k, lo, order[r], w_lo[r], i0 + n_v, err)
            return E_RACE
    return 0


@kjit
def _sources_always_hold(s, i0, q0, q1, lst, pt, table_values, step_trips, x_src_tile,
                         x_bytes, c_lo, c_hi, t_ptr, table, xs, ts):  # type: ignore[no-untyped-def]
    """True when every patched source lst[q0:q1] of EXCHANGE step s (sources
    only patched, the destination index of iteration 0 in xs/ts) holds in
    every iteration of its loop: each value aligned, and the hull of its
    reads over the iterations inside one buffer live at s and overlapping no
    other transfer's destination.  Each iteration's read lies in the hull,
    so this is the per-iteration check at once; False (check iteration by
    iteration, to name the first failure) when a hull test fails or a
    transfer has two patched sources."""
    w_lo, w_hi, order, w_ptr = xs[XS_LO], xs[XS_HI], xs[XS_ORDER], ts[TS_PTR]
    last = -1
    for q in range(q0, q1):
        p = lst[q]
        it = pt[p, PT_INDEX]
        if it == last:
            return False
        last = it
        tile, nb = x_src_tile[it], x_bytes[it]
        g = granule_of(1, 0, 1, 0, nb)
        trips = step_trips[pt[p, PT_LOOP]]
        lo = hi = _patched_value(p, 0, pt, table_values)
        if pt[p, PT_MODE] == PATCH_ARITH:
            end = _patched_value(p, trips - 1, pt, table_values)
            if lo % g != 0 or pt[p, PT_STRIDE] % g != 0:
                return False
            lo, hi = min(lo, end), max(lo, end)
        else:
            for i in range(trips):
                v = _patched_value(p, i, pt, table_values)
                if v % g != 0:
                    return False
                lo, hi = min(lo, v), max(hi, v)
        hi += nb
        if lo < c_lo[tile] or hi > c_hi[tile]:
            j = find_row(tile, lo, hi, s, t_ptr, table)
            if j < 0:
                return False
            c_lo[tile], c_hi[tile] = table[j, B_ADDR], table[j, B_END]
        if _overlapping_write(tile, lo, hi, it - i0, w_lo, w_hi, order, w_ptr) >= 0:
            return False
    return True


@kjit
def _compute_step(s, i0, i1, q0, q1, lst, pt, table_values, ctr, v_tile, v_kernel, v_args,
                  c_lo, c_hi, t_ptr, table, regs, vs, mark, stamp,
                  err):  # type: ignore[no-untyped-def]
    """Regions, bounds and races of vertices i0..i1 at step s under loop counters
    ctr; their patches are lst[q0:q1], sorted by vertex.  With stamp >= 0 only
    the vertices on tiles t with mark[t] == stamp (the tiles of the patched
    vertices, in a later iteration: every other tile's regions, bounds and
    races are those of iteration 0).  Returns 0 or an E_* code (err filled)."""
    vr = np.zeros((MAX_REGIONS, R_LEN), dtype=np.int64)
    args = np.zeros(N_ARGS, dtype=np.int64)
    race = np.zeros(3, dtype=np.int64)
    tiles, owner = vs[VS_TILE], vs[VS_OWNER]
    n = 0
    q = q0
    for it in range(i0, i1):
        if stamp >= 0 and mark[v_tile[it]] != stamp:
            continue
        for j in range(N_ARGS):
            args[j] = v_args[it, j]
        while q < q1 and pt[lst[q], PT_INDEX] == it:
            p = lst[q]
            args[pt[p, PT_ARG]] = _patched_value(p, ctr[pt[p, PT_LOOP]], pt, table_values)
            q += 1
        tile = v_tile[it]
        err[1], err[2], err[4] = s, tile, it
        st = vertex_check(v_kernel[it], args)
        if st != 0:
            err[8] = st
            return E_ARGS
        nr = vertex_regions(v_kernel[it], args, vr)
        if nr < 0:
            return E_KERNEL
        for r in range(nr):
            addr, outer, ostride, rows, ld, nb = (vr[r, 0], vr[r, 1], vr[r, 2], vr[r, 3],
                                                  vr[r, 4], vr[r, 5])
            lo, hi = span_of(addr, outer, ostride, rows, ld, nb)
            if hi <= lo:
                continue
            g = granule_of(outer, ostride, rows, ld, nb)
            if addr % g != 0:
                err[3], err[8] = addr, g
                return E_ALIGN_V
            if lo < c_lo[tile] or hi > c_hi[tile]:
                bf = find_row(tile, lo, hi, s, t_ptr, table)
                if bf < 0:
                    err[3], err[8] = lo, hi - lo
                    return E_REGION
                c_lo[tile], c_hi[tile] = table[bf, B_ADDR], table[bf, B_END]
            if outer * rows > c_hi[tile] - c_lo[tile]:
                err[3], err[8] = lo, outer * rows
                return E_ROWS  # more rows than its buffer has bytes: garbage
            for j in range(R_LEN):
                regs[n, j] = vr[r, j]
            tiles[n] = tile
            owner[n] = it
            n += 1
    if find_race(regs, tiles, owner, n, race):
        err[1], err[2], err[3] = s, tiles[race[1]], race[2]
        err[4], err[7] = owner[race[1]], owner[race[0]]
        return E_RACE
    return 0


@kjit
def scan_accesses(step_kind, step_vtx, step_xfer, step_trips, v_tile, v_kernel, v_args,
                  x_src_tile, x_src_addr, x_dst_tile, x_dst_addr, x_bytes,
                  pv_list, pv_step, px_list, px_step, pt, table_values, t_ptr, table,
                  xs, ts, regs, vs, err):  # type: ignore[no-untyped-def]
    """Check every access of every step for every combination of the counters of
    the loops that drive its patches.  Returns 0 or an E_* code with
    err[1:9] = step, tile, addr, item, loop, iteration, other item, bytes/granule.

    Patches: `pt` (int64 [patches, PT_LEN]); pv_list / px_list the ids of the
    vertex / transfer patches sorted by item, those of step s at positions
    pv_step[s]:pv_step[s+1] (px_step).  Buffers: `access.find_row`'s t_ptr and
    table (tensor buffers only).  Scratch, contents ignored: xs (int64
    [XS_LEN, >= transfers of any step]), ts (int64 [TS_LEN, tiles + 2]), regs
    (int64 [>= 8 × vertices of any step, R_LEN]) and vs (int64 [VS_LEN, as many])."""
    n_steps = step_kind.shape[0]
    ctr = np.zeros(n_steps, dtype=np.int64)
    loops = np.zeros(32, dtype=np.int64)
    c_lo, c_hi, mark = ts[TS_LO], ts[TS_HI], ts[TS_MARK]
    mark[:] = -1
    marks = 0
    src, dst = xs[XS_SRC], xs[XS_DST]
    n_v = v_tile.shape[0]
    for s in range(n_steps):
        k = step_kind[s]
        if k != 0 and k != 1:
            continue
        i0 = step_vtx[s] if k == 0 else step_xfer[s]
        i1 = step_vtx[s + 1] if k == 0 else step_xfer[s + 1]
        lst = pv_list if k == 0 else px_list
        q0 = pv_step[s] if k == 0 else px_step[s]
        q1 = pv_step[s + 1] if k == 0 else px_step[s + 1]
        n_loops = 0  # distinct loops driving the step's patches, first seen first
        dst_patched = False
        for q in range(q0, q1):
            dst_patched = dst_patched or pt[lst[q], PT_TARGET] == PATCH_XFER_DST
            lp = pt[lst[q], PT_LOOP]
            seen = False
            for z in range(n_loops):
                seen = seen or loops[z] == lp
            if not seen:
                loops[n_loops] = lp
                n_loops += 1
        combos = 1
        for z in range(n_loops):
            combos *= step_trips[loops[z]]
        for c in range(combos):
            rem = c
            for z in range(n_loops):
                ctr[loops[z]] = rem % step_trips[loops[z]]
                rem //= step_trips[loops[z]]
            err[5] = loops[0] if n_loops > 0 else -1
            err[6] = ctr[loops[0]] if n_loops > 0 else 0
            c_lo[:] = 0
            c_hi[:] = 0
            if k == 0:
                stamp = -1
                if c > 0:
                    marks += 1
                    stamp = marks
                    for q in range(q0, q1):
                        mark[v_tile[pt[lst[q], PT_INDEX]]] = stamp
                code = _compute_step(s, i0, i1, q0, q1, lst, pt, table_values, ctr, v_tile,
                                     v_kernel, v_args, c_lo, c_hi, t_ptr, table, regs, vs,
                                     mark, stamp, err)
                if code != 0:
                    return code
                continue
            n = i1 - i0
            for q in range(n):
                src[q] = x_src_addr[i0 + q]
                dst[q] = x_dst_addr[i0 + q]
            for q in range(q0, q1):
                p = lst[q]
                val = _patched_value(p, ctr[pt[p, PT_LOOP]], pt, table_values)
                if pt[p, PT_TARGET] == PATCH_XFER_SRC:
                    src[pt[p, PT_INDEX] - i0] = val
                else:
                    dst[pt[p, PT_INDEX] - i0] = val
            if c > 0 and not dst_patched and n >= 2:  # n >= 2: the index was built
                code = _exchange_sources(s, i0, q0, q1, lst, pt, src, x_src_tile, x_bytes, n_v,
                                         c_lo, c_hi, t_ptr, table, xs, ts, err)
                if code != 0:
                    return code
                continue
            code = _exchange_bounds(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes,
                                    c_lo, c_hi, t_ptr, table, err)
            if code == 0:
                code = _exchange_races(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes,
                                       n_v, xs, ts, err)
            if code != 0:
                return code
            if combos > 1 and not dst_patched and n >= 2 and n_loops == 1:
                c_lo[:] = 0
                c_hi[:] = 0
                if _sources_always_hold(s, i0, q0, q1, lst, pt, table_values, step_trips,
                                        x_src_tile, x_bytes, c_lo, c_hi, t_ptr, table, xs, ts):
                    break  # every later iteration holds too
    return 0
