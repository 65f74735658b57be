"""Exact strided memory regions: spans, live-buffer lookup, races.

Live-buffer lookup: `BufferIndex` keeps every buffer as one row of a table
sorted by (tile, address); `find_row` / `find_buffer` search one tile's rows.

Shared by the static verifier (simulator/verify.py, verify_scan.py) and the
engine (both are `@njit` callers).  A region is one row of the kernel ABI's
region table (docs/contracts.md §2):
`(addr, outer, outer_stride, rows, ld, row_bytes, is_write)` — the bytes
`addr + o*outer_stride + r*ld + [0, row_bytes)` for o < outer, r < rows.
A transfer endpoint is the region `(addr, 1, 0, 1, 0, bytes, w)`.

Race rule: within one step no byte may have two writers, or a
writer and a reader, that belong to different accessors (vertices or
transfers).  `find_race` works on exact byte intervals, not bounding boxes:
bounding spans are only used to cluster candidates; each cluster that holds a
writer and at least two accessors is expanded into its rows, sorted and swept.
"""

from __future__ import annotations

import copy

import numpy as np

from kernels.abi import PATCH_ARITH, REGION_COLS
from simulator.package import Package
from tilecommon.jit import kjit, kjit_inline
from tilecommon.search import bisect_right

R_ADDR = 0
R_OUTER = 1
R_OSTRIDE = 2
R_ROWS = 3
R_LD = 4
R_ROW_BYTES = 5
R_WRITE = 6
R_LEN = REGION_COLS


@kjit_inline
def patched(mode, base, stride, table_at, i, table_values):  # type: ignore[no-untyped-def]
    """The value a patch gives at loop iteration `i` (docs/contracts.md §3):
    `base + i * stride` in PATCH_ARITH mode, else entry `table_at + i` of the
    package's table values.  The one formula the engine, the verifier's scan
    and the trace evaluate (one exit: it is inlined into parallel loops)."""
    return base + i * stride if mode == PATCH_ARITH else table_values[table_at + i]


@kjit
def span_of(addr, outer, ostride, rows, ld, nb):  # type: ignore[no-untyped-def]
    """`region_span` of the region (addr, outer, ostride, rows, ld, nb, *) given as
    scalars (a call with scalars costs nothing in a hot loop; one with an array
    view costs reference counting)."""
    if outer <= 0 or rows <= 0 or nb <= 0:
        return 0, 0
    lo = addr
    hi = addr + nb
    d = (outer - 1) * ostride
    if d < 0:
        lo += d
    else:
        hi += d
    d = (rows - 1) * ld
    if d < 0:
        lo += d
    else:
        hi += d
    return lo, hi


@kjit
def granule_of(outer, ostride, rows, ld, nb):  # type: ignore[no-untyped-def]
    """`region_granule` of a region given as scalars."""
    g = nb
    if rows > 1:
        g = g | ld
    if outer > 1:
        g = g | ostride
    if g % 4 == 0:
        return 4
    if g % 2 == 0:
        return 2
    return 1


@kjit
def region_span(reg):  # type: ignore[no-untyped-def]
    """(lo, hi) byte bounds of one region row; (0, 0) if it touches no byte."""
    return span_of(reg[R_ADDR], reg[R_OUTER], reg[R_OSTRIDE], reg[R_ROWS], reg[R_LD],
                   reg[R_ROW_BYTES])


@kjit
def region_granule(reg):  # type: ignore[no-untyped-def]
    """Natural alignment of a region: the largest power of two <= 4 dividing its
    row bytes and (when used) its strides.  Word-organised data (fp32, or fp16
    rows of even length) must start on a word; byte data may start anywhere."""
    return granule_of(reg[R_OUTER], reg[R_OSTRIDE], reg[R_ROWS], reg[R_LD], reg[R_ROW_BYTES])


# columns of a buffer table (`verify.BufferIndex.table`): one row per buffer, rows
# of a tile consecutive and sorted by address
B_ADDR = 0
B_END = 1
B_MAXEND = 2  # largest end among the tile's rows up to this one
B_FIRST = 3  # live steps first..last
B_LAST = 4
B_ID = 5  # buffer index in the package
B_LEN = 6


@kjit
def find_row(tile, lo, hi, step, t_ptr, table):  # type: ignore[no-untyped-def]
    """Row of `table` of a buffer of `tile` live at `step` (first <= step <= last)
    that holds [lo, hi), or -1.

    The buffers of a tile are rows t_ptr[tile]:t_ptr[tile+1] of `table`
    (int64 [buffers, B_LEN]) sorted by address; the B_MAXEND column bounds the
    backward scan.  One table instead of one array per column: the rows a
    lookup touches share cache lines, and a jitted caller passes two arrays.
    """
    start, stop = t_ptr[tile], t_ptr[tile + 1]
    k = bisect_right(table[:, B_ADDR], start, stop, lo) - 1  # last row with addr <= lo
    while k >= start and table[k, B_MAXEND] >= hi:
        if table[k, B_END] >= hi and table[k, B_FIRST] <= step and step <= table[k, B_LAST]:
            return k
        k -= 1
    return -1


@kjit_inline
def live_buffer(tile, lo, hi, rows, step, t_ptr, table, hint):  # type: ignore[no-untyped-def]
    """The access rule every engine applies at run time (and the verifier
    statically): the row of `table` of the tensor buffer of `tile`, live at
    `step`, that holds [lo, hi) and has at least `rows` bytes (a region with
    more rows than its buffer has bytes is garbage), or -1.  `hint` is a row
    to try first (the one found for the same access before), -1 for none."""
    j = hint
    if not (j >= 0 and table[j, B_ADDR] <= lo and hi <= table[j, B_END]
            and table[j, B_FIRST] <= step and step <= table[j, B_LAST]):
        j = find_row(tile, lo, hi, step, t_ptr, table)
    if j >= 0 and rows > table[j, B_END] - table[j, B_ADDR]:
        return -1
    return j


@kjit
def find_buffer(tile, lo, hi, step, t_ptr, table):  # type: ignore[no-untyped-def]
    """Index of a buffer of `tile` live at `step` that holds [lo, hi), or -1
    (`find_row`'s row, as the package's buffer index)."""
    k = find_row(tile, lo, hi, step, t_ptr, table)
    return table[k, B_ID] if k >= 0 else -1


@kjit
def find_buffers(tiles, los, his, steps, t_ptr, table, out):  # type: ignore[no-untyped-def]
    """`find_buffer` for each k: out[k] = a buffer of tiles[k] live at steps[k]
    holding [los[k], his[k]), or -1."""
    for k in range(tiles.shape[0]):
        out[k] = find_buffer(tiles[k], los[k], his[k], steps[k], t_ptr, table)


class BufferIndex:
    """Buffers of each tile sorted by address, for `access.find_buffer`.

    `order` (sorted position -> buffer), `ptr` (tile -> first position, CSR)
    and `table` (int64 [buffers, access.B_LEN], one row per sorted position:
    addr, end, running max end within the tile, first, last, buffer id);
    `first`/`last` are the live ranges the table holds."""

    def __init__(self, pkg: Package, first: np.ndarray, last: np.ndarray) -> None:
        a = pkg.arrays
        tile, addr = a["buf_tile"], a["buf_addr"]
        lo = int(addr.min()) if addr.size else 0
        span = int(addr.max()) - lo + 1 if addr.size else 1
        if span * (pkg.tiles + 1) < 2**62:  # one int64 key: a stable argsort beats lexsort
            self.order = np.argsort(tile * span + (addr - lo), kind="stable").astype(np.int64)
        else:
            self.order = np.lexsort((addr, tile)).astype(np.int64)
        self.ptr = np.searchsorted(tile[self.order], np.arange(pkg.tiles + 1)).astype(np.int64)
        self.addr = addr
        self.end = addr + a["buf_bytes"]
        self.table = np.empty((self.order.size, B_LEN), dtype=np.int64)
        self.table[:, B_ADDR] = addr[self.order]
        self.table[:, B_END] = self.end[self.order]
        self.table[:, B_ID] = self.order
        _prefix_maxend(self.ptr, self.table)
        self._set_live(first, last)

    def _set_live(self, first: np.ndarray, last: np.ndarray) -> None:
        self.first, self.last = first, last
        self.table[:, B_FIRST] = first[self.order]
        self.table[:, B_LAST] = last[self.order]

    def live(self, first: np.ndarray, last: np.ndarray) -> BufferIndex:
        """The same index with other live ranges (the address order is shared)."""
        other = copy.copy(self)
        other.table = self.table.copy()
        other._set_live(first, last)
        return other

    def args(self) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, table): the arguments `access.find_buffer` takes after the step."""
        return self.ptr, self.table


@kjit
def _prefix_maxend(ptr, table):  # type: ignore[no-untyped-def]
    for t in range(ptr.shape[0] - 1):
        m = np.int64(-1)
        for k in range(ptr[t], ptr[t + 1]):
            if table[k, B_END] > m:
                m = table[k, B_END]
            table[k, B_MAXEND] = m


@kjit
def _top2_other(hi1, own1, hi2, owner):  # type: ignore[no-untyped-def]
    """Largest end among intervals whose owner differs from `owner`."""
    if own1 != owner:
        return hi1
    return hi2


@kjit
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


@kjit
def _merge_runs(order, a, b, keys, tmp):  # type: ignore[no-untyped-def]
    """Stable sort of order[a:b] by keys[order]: natural merge sort (one pass
    per halving of the ascending runs; an already sorted segment costs one scan)."""
    while True:
        groups = 0
        i = a
        while i < b:
            j = i + 1
            while j < b and keys[order[j - 1]] <= keys[order[j]]:
                j += 1
            if i == a and j == b:
                return  # one ascending run: sorted
            k = j
            if k < b:
                k += 1
                while k < b and keys[order[k - 1]] <= keys[order[k]]:
                    k += 1
            p, q, o = i, j, i  # merge runs [i, j) and [j, k) into tmp[i:k]
            while p < j and q < k:
                if keys[order[q]] < keys[order[p]]:
                    tmp[o] = order[q]
                    q += 1
                else:
                    tmp[o] = order[p]
                    p += 1
                o += 1
            while p < j:
                tmp[o] = order[p]
                p += 1
                o += 1
            while q < k:
                tmp[o] = order[q]
                q += 1
                o += 1
            groups += 1
            i = k
        for i in range(a, b):
            order[i] = tmp[i]
        if groups == 1:
            return


@kjit
def tile_order_into(tiles, keys, n, order, tmp, start):  # type: ignore[no-untyped-def]
    """Fill order[:n] with the permutation of range(n) sorting stably by (tiles,
    keys): a counting sort by tile (linear), then each tile's entries by key
    (insertion sort for a few, else a natural merge sort: planner output is
    mostly sorted already).  Scratch: tmp[:n], start[:max tile + 2].  Several
    times faster than numba's argsort of combined keys for the ~1e5 entries of
    a big step."""
    t_max = 0
    for k in range(n):
        if tiles[k] > t_max:
            t_max = tiles[k]
    for t in range(t_max + 2):
        start[t] = 0
    for k in range(n):
        start[tiles[k] + 1] += 1
    for t in range(t_max + 1):
        start[t + 1] += start[t]
    for k in range(n):  # afterwards start[t] is where tile t ends
        order[start[tiles[k]]] = k
        start[tiles[k]] += 1
    a = 0
    for t in range(t_max + 1):
        b = start[t]
        sort_segment(order, a, b, keys, tmp)
        a = b


@kjit_inline
def sort_segment(order, a, b, keys, tmp):  # type: ignore[no-untyped-def]
    """Stable sort of order[a:b] by keys[order]: insertion sort for a few
    entries (no allocation), else `_merge_runs` (scratch tmp[a:b])."""
    if b - a <= 32:
        for i in range(a + 1, b):
            cur = order[i]
            j = i - 1
            while j >= a and keys[order[j]] > keys[cur]:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = cur
    else:
        _merge_runs(order, a, b, keys, tmp)


@kjit
def tile_order(tiles, keys, n):  # type: ignore[no-untyped-def]
    """`tile_order_into` with fresh arrays; returns the permutation."""
    order = np.empty(n, dtype=np.int64)
    t_max = 0
    for k in range(n):
        if tiles[k] > t_max:
            t_max = tiles[k]
    tile_order_into(tiles, keys, n, order, np.empty(n, dtype=np.int64),
                    np.empty(t_max + 2, dtype=np.int64))
    return order


@kjit
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


# ---- written-byte bitmaps (one bit per image byte; simulator.engines.base) ----

ALL_BITS = np.uint64(0xFFFFFFFFFFFFFFFF)


@kjit_inline
def _word_mask(lo, hi):  # type: ignore[no-untyped-def]
    """uint64 with bits lo..hi (inclusive, 0 <= lo <= hi <= 63) set (one
    exit: it is inlined)."""
    width = hi - lo + 1
    m = ALL_BITS
    if width < 64:
        m = ((np.uint64(1) << np.uint64(width)) - np.uint64(1)) << np.uint64(lo)
    return m


@kjit
def bits_set(bits, row, a, n):  # type: ignore[no-untyped-def]
    """Mark bytes [a, a + n) of image row `row` as written."""
    if n <= 0:
        return
    e = a + n - 1
    wa, wb = a >> 6, e >> 6
    if wa == wb:
        bits[row, wa] |= _word_mask(a & 63, e & 63)
        return
    bits[row, wa] |= _word_mask(a & 63, 63)
    for k in range(wa + 1, wb):
        bits[row, k] = ALL_BITS
    bits[row, wb] |= _word_mask(0, e & 63)


@kjit_inline
def bits_all_set(bits, row, a, n):  # type: ignore[no-untyped-def]
    """Whether every byte in [a, a + n) of row `row` was written
    (`bits_first_unset(...) < 0`, word at a time, for the hot checks).  One
    exit: it is inlined into parallel loops."""
    ok = True
    if n > 0:
        e = a + n - 1
        wa, wb = a >> 6, e >> 6
        if wa == wb:
            m = _word_mask(a & 63, e & 63)
            ok = (bits[row, wa] & m) == m
        else:
            m = _word_mask(a & 63, 63)
            ok = (bits[row, wa] & m) == m
            k = wa + 1
            while ok and k < wb:
                ok = bits[row, k] == ALL_BITS
                k += 1
            m = _word_mask(0, e & 63)
            ok = ok and (bits[row, wb] & m) == m
    return ok


@kjit
def bits_first_unset(bits, row, a, n):  # type: ignore[no-untyped-def]
    """Offset of the first unwritten byte in [a, a + n) of row `row`, or -1."""
    if n <= 0:
        return -1
    e = a + n - 1
    for k in range(a >> 6, (e >> 6) + 1):
        lo = a & 63 if k == a >> 6 else 0
        hi = e & 63 if k == e >> 6 else 63
        m = _word_mask(lo, hi)
        if (bits[row, k] & m) != m:
            for b in range(lo, hi + 1):
                if (bits[row, k] >> np.uint64(b)) & np.uint64(1) == np.uint64(0):
                    return k * 64 + b
    return -1
