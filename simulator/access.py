"""Exact strided memory regions: spans, live-buffer lookup, races, the static scan.

Shared by the static verifier and the engine (both are `@njit` callers);
`scan_accesses` is the verifier's jitted pass over every step and iteration.  A
region is one row of the kernel ABI's region table (docs/contracts.md §2):
`(addr, outer, outer_stride, rows, ld, row_bytes, is_write)` — the bytes
`addr + o*outer_stride + r*ld + [0, row_bytes)` for o < outer, r < rows.
A transfer endpoint is the region `(addr, 1, 0, 1, 0, bytes, w)`.

Race rule (DESIGN §5): within one step no byte may have two writers, or a
writer and a reader, that belong to different accessors (vertices or
transfers).  `find_race` works on exact byte intervals, not bounding boxes:
bounding spans are only used to cluster candidates; each cluster that holds a
writer and at least two accessors is expanded into its rows, sorted and swept.
"""

from __future__ import annotations

import numpy as np

from kernels.dispatch import vertex_regions
from simulator.jit import sjit

R_ADDR = 0
R_OUTER = 1
R_OSTRIDE = 2
R_ROWS = 3
R_LD = 4
R_ROW_BYTES = 5
R_WRITE = 6
R_LEN = 7

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
def region_span(reg):  # type: ignore[no-untyped-def]
    """(lo, hi) byte bounds of one region row; (0, 0) if it touches no byte."""
    outer, rows, nb = reg[R_OUTER], reg[R_ROWS], reg[R_ROW_BYTES]
    if outer <= 0 or rows <= 0 or nb <= 0:
        return 0, 0
    lo = reg[R_ADDR]
    hi = reg[R_ADDR] + nb
    d = (outer - 1) * reg[R_OSTRIDE]
    if d < 0:
        lo += d
    else:
        hi += d
    d = (rows - 1) * reg[R_LD]
    if d < 0:
        lo += d
    else:
        hi += d
    return lo, hi


@sjit
def region_granule(reg):  # type: ignore[no-untyped-def]
    """Natural alignment of a region: the largest power of two <= 4 dividing its
    row bytes and (when used) its strides.  Word-organised data (fp32, or fp16
    rows of even length) must start on a word; byte data may start anywhere."""
    g = reg[R_ROW_BYTES]
    if reg[R_ROWS] > 1:
        g = g | reg[R_LD]
    if reg[R_OUTER] > 1:
        g = g | reg[R_OSTRIDE]
    if g % 4 == 0:
        return 4
    if g % 2 == 0:
        return 2
    return 1


@sjit
def find_buffer(tile, lo, hi, step, t_ptr, b_order, b_addr, b_end, b_first, b_last,
                b_maxend):  # type: ignore[no-untyped-def]
    """Index of a buffer of `tile` live at `step` (first <= step <= last) that holds
    [lo, hi), or -1.

    Buffers of a tile are `b_order[t_ptr[tile]:t_ptr[tile+1]]` sorted by
    address; `b_maxend[k]` is the largest end among sorted positions
    t_ptr[tile]..k, which bounds the backward scan.
    """
    start, stop = t_ptr[tile], t_ptr[tile + 1]
    # last position with addr <= lo
    a, b = start, stop
    while a < b:
        m = (a + b) // 2
        if b_addr[b_order[m]] <= lo:
            a = m + 1
        else:
            b = m
    k = a - 1
    while k >= start and b_maxend[k] >= hi:
        j = b_order[k]
        if b_end[j] >= hi and b_first[j] <= step and step <= b_last[j]:
            return j
        k -= 1
    return -1


@sjit
def _top2_other(hi1, own1, hi2, owner):  # type: ignore[no-untyped-def]
    """Largest end among intervals whose owner differs from `owner`."""
    if own1 != owner:
        return hi1
    return hi2


@sjit
def _exact_race(regs, owner, idx, out):  # type: ignore[no-untyped-def]
    """Expand the regions `idx` into byte intervals and sweep.  On a race fill
    out = (first accessor pos, second accessor pos, address) and return True."""
    n_int = 0
    for k in range(idx.shape[0]):
        r = regs[idx[k]]
        n_int += r[R_OUTER] * r[R_ROWS]
    lo = np.empty(n_int, dtype=np.int64)
    hi = np.empty(n_int, dtype=np.int64)
    src = np.empty(n_int, dtype=np.int64)
    n = 0
    for k in range(idx.shape[0]):
        r = regs[idx[k]]
        for o in range(r[R_OUTER]):
            for q in range(r[R_ROWS]):
                a = r[R_ADDR] + o * r[R_OSTRIDE] + q * r[R_LD]
                lo[n] = a
                hi[n] = a + r[R_ROW_BYTES]
                src[n] = idx[k]
                n += 1
    order = np.argsort(lo, kind="mergesort")
    big = np.int64(-1) << np.int64(62)
    # top two ends with distinct owners, separately for writers and readers
    wh1, wo1, wh2 = big, np.int64(-1), big
    wi1 = np.int64(-1)
    wi2 = np.int64(-1)
    rh1, ro1, rh2 = big, np.int64(-1), big
    ri1 = np.int64(-1)
    ri2 = np.int64(-1)
    for t in range(n):
        j = order[t]
        p = src[j]
        ow = owner[p]
        x = lo[j]
        is_w = regs[p, R_WRITE] != 0
        hw = _top2_other(wh1, wo1, wh2, ow)
        if hw > x:
            out[0] = wi1 if wo1 != ow else wi2
            out[1] = p
            out[2] = x
            return True
        if is_w:
            hr = _top2_other(rh1, ro1, rh2, ow)
            if hr > x:
                out[0] = ri1 if ro1 != ow else ri2
                out[1] = p
                out[2] = x
                return True
        h = hi[j]
        if is_w:
            if ow == wo1:
                if h > wh1:
                    wh1 = h
                    wi1 = p
            elif h > wh1:
                wh2, wi2 = wh1, wi1
                wh1, wo1, wi1 = h, ow, p
            elif h > wh2:
                wh2, wi2 = h, p
        else:
            if ow == ro1:
                if h > rh1:
                    rh1 = h
                    ri1 = p
            elif h > rh1:
                rh2, ri2 = rh1, ri1
                rh1, ro1, ri1 = h, ow, p
            elif h > rh2:
                rh2, ri2 = h, p
    return False


@sjit
def tile_order(tiles, keys, n):  # type: ignore[no-untyped-def]
    """Permutation of range(n) sorting by (tiles, keys): a counting sort by tile
    (linear), then each tile's few entries by key.  Several times faster than
    numba's argsort of combined keys for the ~1e5 entries of a big step."""
    t_max = 0
    for k in range(n):
        if tiles[k] > t_max:
            t_max = tiles[k]
    start = np.zeros(t_max + 2, dtype=np.int64)
    for k in range(n):
        start[tiles[k] + 1] += 1
    for t in range(t_max + 1):
        start[t + 1] += start[t]
    fill = start[:-1].copy()
    order = np.empty(n, dtype=np.int64)
    for k in range(n):
        order[fill[tiles[k]]] = k
        fill[tiles[k]] += 1
    for t in range(t_max + 1):
        a, b = start[t], start[t + 1]
        if b - a <= 1:
            continue
        if b - a <= 32:  # insertion sort: stable, no allocation
            for i in range(a + 1, b):
                cur = order[i]
                j = i - 1
                while j >= a and keys[order[j]] > keys[cur]:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = cur
        else:
            seg = order[a:b].copy()
            sub = np.empty(b - a, dtype=np.int64)
            for i in range(b - a):
                sub[i] = keys[seg[i]]
            perm = np.argsort(sub, kind="mergesort")
            for i in range(b - a):
                order[a + i] = seg[perm[i]]
    return order


@sjit
def find_race(regs, tiles, owner, n, out):  # type: ignore[no-untyped-def]
    """Race check of the first `n` regions (`regs[n, 7]`, on `tiles[n]`, belonging
    to accessor `owner[n]`).  Returns True and fills out = (pos a, pos b, address)
    with positions into `regs` of two conflicting regions, else False."""
    if n < 2:
        return False
    los = np.empty(n, dtype=np.int64)
    his = np.empty(n, dtype=np.int64)
    for k in range(n):
        lo, hi = region_span(regs[k])
        los[k] = lo
        his[k] = hi
    order = tile_order(tiles, los, n)
    c0 = 0
    while c0 < n:
        first = order[c0]
        tile = tiles[first]
        end = his[first]
        has_w = regs[first, R_WRITE] != 0
        multi = False
        c1 = c0 + 1
        while c1 < n:
            j = order[c1]
            if tiles[j] != tile or los[j] >= end:
                break
            if his[j] > end:
                end = his[j]
            if regs[j, R_WRITE] != 0:
                has_w = True
            if owner[j] != owner[first]:
                multi = True
            c1 += 1
        if has_w and multi:
            if _exact_race(regs, owner, order[c0:c1].copy(), out):
                return True
        c0 = c1
    return False


@sjit
def _patched_value(p, i, p_mode, p_base, p_stride, p_table, table_values):  # type: ignore[no-untyped-def]
    if p_mode[p] == 0:
        return p_base[p] + i * p_stride[p]
    return table_values[p_table[p] + i]


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
    max_items = 1
    for s in range(n_steps):
        nv = (step_vtx[s + 1] - step_vtx[s]) * 8
        nx = (step_xfer[s + 1] - step_xfer[s]) * 2
        max_items = max(max_items, nv, nx)
    regs = np.zeros((max_items, R_LEN), dtype=np.int64)
    tiles = np.zeros(max_items, dtype=np.int64)
    owner = np.zeros(max_items, dtype=np.int64)
    vr = np.zeros((8, R_LEN), dtype=np.int64)
    args = np.zeros(16, dtype=np.int64)
    ctr = np.zeros(n_steps, dtype=np.int64)
    loops = np.zeros(32, dtype=np.int64)
    race = np.zeros(3, dtype=np.int64)
    n_v = v_tile.shape[0]
    for s in range(n_steps):
        k = step_kind[s]
        if k != 0 and k != 1:
            continue
        i0 = step_vtx[s] if k == 0 else step_xfer[s]
        i1 = step_vtx[s + 1] if k == 0 else step_xfer[s + 1]
        ptr = vp_ptr if k == 0 else xp_ptr
        lst = vp_list if k == 0 else xp_list
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
            n = 0
            for it in range(i0, i1):
                if k == 0:
                    for j in range(16):
                        args[j] = v_args[it, j]
                    for q in range(ptr[it], ptr[it + 1]):
                        p = lst[q]
                        args[p_arg[p]] = _patched_value(p, ctr[p_loop[p]], p_mode, p_base,
                                                        p_stride, p_table, table_values)
                    nr = vertex_regions(v_kernel[it], args, vr)
                    tile = v_tile[it]
                    err[1], err[2], err[4] = s, tile, it
                    if nr < 0:
                        return 5
                    for r in range(nr):
                        lo, hi = region_span(vr[r])
                        if hi <= lo:
                            continue
                        g = region_granule(vr[r])
                        if vr[r, 0] % g != 0:
                            err[3], err[8] = vr[r, 0], g
                            return 6
                        bf = find_buffer(tile, lo, hi, s, t_ptr, b_order, b_addr, b_end,
                                         b_first, b_last, b_maxend)
                        if bf < 0:
                            err[3], err[8] = lo, hi - lo
                            return 1
                        if vr[r, 1] * vr[r, 3] > b_end[bf] - b_addr[bf]:
                            err[3], err[8] = lo, vr[r, 1] * vr[r, 3]
                            return E_ROWS  # more rows than its buffer has bytes: garbage
                        for j in range(R_LEN):
                            regs[n, j] = vr[r, j]
                        tiles[n] = tile
                        owner[n] = it
                        n += 1
                else:
                    src, dst = x_src_addr[it], x_dst_addr[it]
                    for q in range(ptr[it], ptr[it + 1]):
                        p = lst[q]
                        val = _patched_value(p, ctr[p_loop[p]], p_mode, p_base, p_stride,
                                             p_table, table_values)
                        if p_target[p] == 1:
                            src = val
                        else:
                            dst = val
                    nb = x_bytes[it]
                    for side in range(2):
                        tile = x_src_tile[it] if side == 0 else x_dst_tile[it]
                        addr = src if side == 0 else dst
                        regs[n, 0] = addr
                        regs[n, 1] = 1
                        regs[n, 2] = 0
                        regs[n, 3] = 1
                        regs[n, 4] = 0
                        regs[n, 5] = nb
                        regs[n, 6] = side
                        err[1], err[2], err[3], err[4], err[8] = s, tile, addr, it, nb
                        g = region_granule(regs[n])
                        if addr % g != 0:
                            err[8] = g
                            return 7
                        if find_buffer(tile, addr, addr + nb, s, t_ptr, b_order, b_addr, b_end,
                                       b_first, b_last, b_maxend) < 0:
                            return 2 + side
                        tiles[n] = tile
                        owner[n] = n_v + it
                        n += 1
            if find_race(regs, tiles, owner, n, race):
                err[1], err[2], err[3] = s, tiles[race[1]], race[2]
                err[4], err[7] = owner[race[1]], owner[race[0]]
                return 4
    return 0
