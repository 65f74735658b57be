"""The verifier's static pass over every access of every step and Repeat iteration.

`scan_accesses` (jitted) walks the COMPUTE and EXCHANGE steps in order.  A
step whose items carry patches is checked once per combination of the
counters of the loops driving them (iteration 0 first); a step without
patches once.  Per step and combination:

- COMPUTE: each vertex operand region (`kernels.dispatch.vertex_regions`) is
  aligned (`access.region_granule`) and inside one live tensor buffer of its
  tile (`access.find_buffer`), with no more rows than that buffer has bytes;
  then the exact strided race check `access.find_race` over all regions.
- EXCHANGE: every endpoint is one byte interval `[addr, addr + bytes)`.
  Bounds and alignment in transfer order, source before destination; an
  endpoint inside the buffer found for the previous endpoint of the same side
  on the same tile needs no lookup (two buffers of a tile live at one step
  never overlap, `verify._check_buffers`, so the containing buffer is unique).
  Races: destinations are the only writers and each transfer has one, so
  after sorting them by (tile, address) any two overlapping ones race; the
  sorted destinations are then disjoint, and each source is looked up among
  the destinations of its tile and races with any overlapping one of another
  transfer.  A source equal to the previous one that overlapped no destination
  needs no second lookup (multicast).

The result is exactly the rule of DESIGN §5 (no byte with two writers, or a
writer and a reader, of different vertices/transfers within a step).
"""

from __future__ import annotations

import numpy as np

from kernels.dispatch import vertex_regions
from simulator.access import (
    R_LEN,
    find_buffer,
    find_race,
    region_granule,
    region_span,
    tile_order,
)
from simulator.jit import sjit

# error codes of `scan_accesses`
E_REGION = 1  # vertex operand region not inside one live buffer
E_SRC = 2  # transfer source not inside one live buffer
E_DST = 3  # transfer destination not inside one live buffer
E_RACE = 4  # two writers / writer + reader within a step
E_KERNEL = 5  # kernel without a region description
E_ALIGN_V = 6  # vertex operand misaligned
E_ALIGN_X = 7  # transfer endpoint misaligned
E_ROWS = 8  # a region with more rows than bytes up to the tile's last buffer end


@sjit
def _patched_value(p, i, p_mode, p_base, p_stride, p_table, table_values):  # type: ignore[no-untyped-def]
    if p_mode[p] == 0:
        return p_base[p] + i * p_stride[p]
    return table_values[p_table[p] + i]


@sjit
def _interval_granule(nb):  # type: ignore[no-untyped-def]
    """`region_granule` of the one-row region of nb bytes."""
    if nb % 4 == 0:
        return 4
    if nb % 2 == 0:
        return 2
    return 1


@sjit
def _exchange_bounds(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes, c_lo, c_hi,
                     t_ptr, b_order, b_addr, b_end, b_first, b_last, b_maxend,
                     err):  # type: ignore[no-untyped-def]
    """Alignment and buffer of the n endpoint pairs (src[k], dst[k]) of transfers
    i0 + k at step s, in transfer order.  Returns 0 or an E_* code (err filled).

    c_lo/c_hi[tile] cache [addr, end) of the last buffer found on the tile at
    this step (empty when reset): two buffers of a tile live at one step never
    overlap (`verify._check_buffers`), so a cached buffer holding the endpoint
    is the one `find_buffer` would find.  The check is written out here, not
    called: a call with array arguments in this loop costs more than the
    lookup it saves (reference counting)."""
    for k in range(n):
        it = i0 + k
        nb = x_bytes[it]
        g = _interval_granule(nb)
        for side in range(2):
            tile = x_src_tile[it] if side == 0 else x_dst_tile[it]
            addr = src[k] if side == 0 else dst[k]
            if addr % g != 0:
                err[1], err[2], err[3], err[4], err[8] = s, tile, addr, it, g
                return E_ALIGN_X
            if addr >= c_lo[tile] and addr + nb <= c_hi[tile]:
                continue
            j = find_buffer(tile, addr, addr + nb, s, t_ptr, b_order, b_addr, b_end, b_first,
                            b_last, b_maxend)
            if j < 0:
                err[1], err[2], err[3], err[4], err[8] = s, tile, addr, it, nb
                return E_SRC + side
            c_lo[tile], c_hi[tile] = b_addr[j], b_end[j]
    return 0


@sjit
def _exchange_races(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes, n_tiles, n_v,
                    err):  # type: ignore[no-untyped-def]
    """Race check of the n transfers i0 + k (endpoints src[k] -> dst[k]) of step s.
    Returns 0 or E_RACE with err[1:4] = step, tile, address, err[4] the
    transfer's accessor id (n_v + transfer) and err[7] the other one's."""
    if n < 2:
        return 0
    d_tile = x_dst_tile[i0:i0 + n]
    order = tile_order(d_tile, dst, n)
    w_lo = np.empty(n, dtype=np.int64)
    w_hi = np.empty(n, dtype=np.int64)
    w_ptr = np.zeros(n_tiles + 1, dtype=np.int64)
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
    for t in range(n_tiles):
        w_ptr[t + 1] += w_ptr[t]
    last_tile, last_lo, last_hi = np.int64(-1), np.int64(0), np.int64(0)
    for k in range(n):
        tile = x_src_tile[i0 + k]
        lo = src[k]
        hi = lo + x_bytes[i0 + k]
        if tile == last_tile and lo == last_lo and hi == last_hi:
            continue
        # last destination of the tile starting before hi; earlier ones end earlier
        a, b = w_ptr[tile], w_ptr[tile + 1]
        while a < b:
            m = (a + b) // 2
            if w_lo[m] < hi:
                a = m + 1
            else:
                b = m
        q = a - 1
        clean = True
        while q >= w_ptr[tile] and w_hi[q] > lo:
            clean = False
            if order[q] != k:
                err[1], err[2], err[3] = s, tile, max(lo, w_lo[q])
                err[4], err[7] = n_v + i0 + k, n_v + i0 + order[q]
                return E_RACE
            q -= 1
        if clean:
            last_tile, last_lo, last_hi = tile, lo, hi
        else:
            last_tile = -1
    return 0


@sjit
def _compute_step(s, i0, i1, ptr, lst, ctr, v_tile, v_kernel, v_args, p_arg, p_loop, p_mode,
                  p_base, p_stride, p_table, table_values, c_lo, c_hi,
                  t_ptr, b_order, b_addr, b_end, b_first, b_last, b_maxend,
                  regs, tiles, owner, err):  # type: ignore[no-untyped-def]
    """Regions, bounds and races of vertices i0..i1 at step s under loop counters
    ctr.  Returns 0 or an E_* code (err filled)."""
    vr = np.zeros((8, R_LEN), dtype=np.int64)
    args = np.zeros(16, dtype=np.int64)
    race = np.zeros(3, dtype=np.int64)
    n = 0
    for it in range(i0, i1):
        for j in range(16):
            args[j] = v_args[it, j]
        for q in range(ptr[it], ptr[it + 1]):
            p = lst[q]
            args[p_arg[p]] = _patched_value(p, ctr[p_loop[p]], p_mode, p_base, p_stride,
                                            p_table, table_values)
        nr = vertex_regions(v_kernel[it], args, vr)
        tile = v_tile[it]
        err[1], err[2], err[4] = s, tile, it
        if nr < 0:
            return E_KERNEL
        for r in range(nr):
            lo, hi = region_span(vr[r])
            if hi <= lo:
                continue
            g = region_granule(vr[r])
            if vr[r, 0] % g != 0:
                err[3], err[8] = vr[r, 0], g
                return E_ALIGN_V
            if lo < c_lo[tile] or hi > c_hi[tile]:
                bf = find_buffer(tile, lo, hi, s, t_ptr, b_order, b_addr, b_end,
                                 b_first, b_last, b_maxend)
                if bf < 0:
                    err[3], err[8] = lo, hi - lo
                    return E_REGION
                c_lo[tile], c_hi[tile] = b_addr[bf], b_end[bf]
            if vr[r, 1] * vr[r, 3] > c_hi[tile] - c_lo[tile]:
                err[3], err[8] = lo, vr[r, 1] * vr[r, 3]
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


@sjit
def _step_loops(i0, i1, ptr, lst, p_loop, loops):  # type: ignore[no-untyped-def]
    """Distinct loops driving the patches of items i0..i1, in first-seen order,
    into loops[:n]; returns n."""
    n_loops = 0
    for it in range(i0, i1):
        for q in range(ptr[it], ptr[it + 1]):
            lp = p_loop[lst[q]]
            seen = False
            for z in range(n_loops):
                if loops[z] == lp:
                    seen = True
            if not seen:
                loops[n_loops] = lp
                n_loops += 1
    return n_loops


@sjit
def scan_accesses(step_kind, step_vtx, step_xfer, step_trips, v_tile, v_kernel, v_args,
                  x_src_tile, x_src_addr, x_dst_tile, x_dst_addr, x_bytes,
                  vp_ptr, vp_list, xp_ptr, xp_list,
                  p_target, p_arg, p_loop, p_mode, p_base, p_stride, p_table, table_values,
                  t_ptr, b_order, b_addr, b_end, b_first, b_last, b_maxend,
                  err):  # type: ignore[no-untyped-def]
    """Check every access of every step for every combination of the counters of
    the loops that drive its patches.  Returns 0 or an E_* code with
    err[1:9] = step, tile, addr, item, loop, iteration, other item, bytes/granule."""
    n_steps = step_kind.shape[0]
    n_tiles = t_ptr.shape[0] - 1
    max_v, max_x = 1, 1
    for s in range(n_steps):
        max_v = max(max_v, (step_vtx[s + 1] - step_vtx[s]) * 8)
        max_x = max(max_x, step_xfer[s + 1] - step_xfer[s])
    regs = np.zeros((max_v, R_LEN), dtype=np.int64)
    tiles = np.zeros(max_v, dtype=np.int64)
    owner = np.zeros(max_v, dtype=np.int64)
    src = np.zeros(max_x, dtype=np.int64)
    dst = np.zeros(max_x, dtype=np.int64)
    ctr = np.zeros(n_steps, dtype=np.int64)
    loops = np.zeros(32, dtype=np.int64)
    c_lo = np.zeros(n_tiles, dtype=np.int64)
    c_hi = np.zeros(n_tiles, dtype=np.int64)
    n_v = v_tile.shape[0]
    for s in range(n_steps):
        k = step_kind[s]
        if k != 0 and k != 1:
            continue
        i0 = step_vtx[s] if k == 0 else step_xfer[s]
        i1 = step_vtx[s + 1] if k == 0 else step_xfer[s + 1]
        ptr = vp_ptr if k == 0 else xp_ptr
        lst = vp_list if k == 0 else xp_list
        n_loops = _step_loops(i0, i1, ptr, lst, p_loop, loops)
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
                code = _compute_step(s, i0, i1, ptr, lst, ctr, v_tile, v_kernel, v_args,
                                     p_arg, p_loop, p_mode, p_base, p_stride, p_table,
                                     table_values, c_lo, c_hi, t_ptr, b_order, b_addr,
                                     b_end, b_first, b_last, b_maxend, regs, tiles, owner,
                                     err)
                if code != 0:
                    return code
                continue
            n = i1 - i0
            for q in range(n):
                src[q] = x_src_addr[i0 + q]
                dst[q] = x_dst_addr[i0 + q]
            for it in range(i0, i1):
                for q in range(ptr[it], ptr[it + 1]):
                    p = lst[q]
                    val = _patched_value(p, ctr[p_loop[p]], p_mode, p_base, p_stride,
                                         p_table, table_values)
                    if p_target[p] == 1:
                        src[it - i0] = val
                    else:
                        dst[it - i0] = val
            code = _exchange_bounds(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes,
                                    c_lo, c_hi, t_ptr, b_order, b_addr, b_end, b_first,
                                    b_last, b_maxend, err)
            if code == 0:
                code = _exchange_races(s, i0, n, src, dst, x_src_tile, x_dst_tile, x_bytes,
                                       n_tiles, n_v, err)
            if code != 0:
                return code
    return 0

