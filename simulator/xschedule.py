"""The exchange schedule: a static, cycle-exact program for every exchange step.

On the C600 an exchange phase is a statically scheduled program.  The fabric
facts it obeys are the device's (`fabric`): a tile transmits on its own
lane at `exchange_out_bytes_per_cycle` and receives on one port at
`exchange_in_bytes_per_cycle`, listening to one sender at a time; a send
instruction carries at most `send_max_bytes` and costs the sender
`send_cycles` to issue; each transfer costs its receiver `receive_cycles`
of control; a word sent by tile a arrives at tile b `arrival_latency_cycles
+ arrival_latency_row_cycles x |row(a) - row(b)|` cycles after it leaves,
tile t sitting on physical row `t // tiles_per_row`.  A multicast is one
transmission that all its receivers hear in the same cycles, each after its
own latency.

**The schedule in a package** (docs/contracts.md §3, arrays):
- `x_send` [X]: the send a transfer is heard from, named by its first
  transfer (the leader, `x_send[l] == l`).  The transfers of one send share
  source tile, source address, bytes and source patch (so the same words in
  every iteration of a Repeat), and no two of them land on one tile.
- pieces [Q] (`q_send`, `q_offset`, `q_bytes`, `q_start`), CSR by step in
  `step_piece` [S+1]: piece q transmits bytes [q_offset, q_offset + q_bytes)
  of send q_send from cycle q_start of the step's transfer window.  The
  pieces of a send cover its bytes exactly once.
- `step_xcycles` [S]: the length of each exchange step's transfer window
  (0 for other steps).

**Bookings.**  Piece q of b bytes and k = ceil(b / send_max_bytes)
instructions holds its sender's lane over [start, start + max(ceil(b /
out_bw), k x send_cycles)): the payload streams while the instructions
issue, and the next piece of that lane can only start after both.  Each
receiver r of the send holds its port over [start + lat, start + lat +
ceil(b / in_bw)), and for the first piece of a transfer (q_offset = 0) at
least `receive_cycles` long (the receive's control and pointer).  A valid
schedule books no lane and no port twice at once, covers every send, and
ends every booking by `step_xcycles`.  The step then costs `sync_cycles +
exchange_setup_cycles + step_xcycles` in both engines.

Every booking sum on one tile is at least that tile's endpoint bound term
(`simulator.timing.endpoint_bound`: a sum of ceilings is at least the
ceiling of the sum, and a split send issues at least as many instructions),
so a valid schedule is never shorter than the bound; it is longer by the
latency of its last arrival and by the gaps where a sender waits for a busy
receiver.

**The scheduler** (`schedule`, jitted, deterministic): per step, sends are
booked widest first (members x bytes: a multicast needs every member's port
at once, so the wide ones go while the ports are empty; ties round-robin
over their source tiles, the k-th send of every tile before any tile's
(k+1)-th), each at the earliest cycle at which its lane and every receiver's
port (shifted by that receiver's latency) are free for it, gaps left by
earlier sends included (each lane and port keeps its bookings as sorted,
merged intervals).  The order decides how close a step comes to its bound,
so each step is booked in the orders of `_TRIES` and the shortest kept (the
first of equals; an order stops as soon as it reaches the shortest so far,
and a step of more than `_ONE_TRY` transfers gets the first order alone):
the program order above, and four rotations (`_rotations`): by
source ((receiver - source) mod tiles: a K-split's all-to-all of partial
sums as a sequence of permutations) and by receiver group (groups fed by
the same sources take them in different turns: a matmul's A blocks).  On
the siglip-so400m-map 1-layer package's steps the windows add up to 1.08x
the endpoint bounds (program order alone: 1.18x; round-robin without the
width rule 1.25x; appending at the end of each lane and port, no gaps
reused, 4.7x); the last arrival's latency (52 to 234 cycles) is most of
what remains.  A send is booked whole (its
instructions back to back, one piece), except that with `piece` > 0 a step
is also booked with every unicast send longer than `piece` bytes cut into
pieces of `piece` bytes, each booked at its own earliest cycle (so a piece
fills a gap its whole send does not fit), and the cut booking is kept when
it ends the step sooner.  Each piece is one more send row on its sender and
one more receive row on its receiver (simulator.footprint counts the
schedule's rows), so the planner schedules where the tables are sized,
before allocation (planner.lowering.link's reserve, pieces of 4 send
instructions).  Multicasts stay whole: cutting one costs a receive row on
every member and a booking of every member's port per piece, for little
(on siglip-so400m-map 1 layer, unicasts gave 5.9 k of the 6.6 k cycles
instruction-sized cutting of every send saved, in a fifth of the time).

**The check** (`violations`, used by `simulator.verify` and, per step, by
the Numba engine; the SimPy engine re-derives it from its own events): the
first violation of a step in the order (kind, tile, cycle, item), kinds
V_COVER (a send's bytes not covered exactly once: tile = source, cycle = the
first byte offset wrong, item = the send), V_LANE (tile = the sender, cycle
= the later piece's start, item = that piece), V_PORT (tile = the receiver,
cycle = the later arrival, item = its piece), V_LATE (a booking ends after
the window: tile, cycle = its end, item = the piece).  "Later" is in
(start, piece) order.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from kernels.abi import PATCH_XFER_SRC
from tilecommon.jit import kjit
from tilecommon.search import bisect_left, bisect_right

if TYPE_CHECKING:
    from simulator.device import Device
    from simulator.package import Package

SCHEDULE_ARRAYS = ("x_send", "step_piece", "step_xcycles", "q_send", "q_offset", "q_bytes",
                   "q_start")

# fabric vector layout
FB_OUT_BW, FB_IN_BW, FB_SEND_MAX, FB_SEND, FB_RECV, FB_LAT, FB_LAT_ROW, FB_ROW = range(8)
# violation kinds, in the order a step reports them
V_NONE, V_COVER, V_LANE, V_PORT, V_LATE = range(5)
V_NAMES = {V_COVER: "send bytes not covered exactly once by its pieces",
           V_LANE: "send lane double-booked", V_PORT: "receive port double-booked",
           V_LATE: "booking ends after the step's transfer window"}


def fabric(dev: Device) -> np.ndarray:
    """int64 [8]: the fabric facts of `dev` the schedule obeys (FB_* indices)."""
    c = dev.costs
    return np.array([c.exchange_out_bytes_per_cycle, c.exchange_in_bytes_per_cycle,
                     c.send_max_bytes, c.send_cycles, c.receive_cycles,
                     c.arrival_latency_cycles, c.arrival_latency_row_cycles, c.tiles_per_row],
                    dtype=np.int64)


@kjit
def latency(fab, a, b):  # type: ignore[no-untyped-def]
    """Cycles from a word leaving tile a to its arrival on tile b."""
    return fab[FB_LAT] + fab[FB_LAT_ROW] * abs(a // fab[FB_ROW] - b // fab[FB_ROW])


@kjit
def lane_cycles(fab, nbytes):  # type: ignore[no-untyped-def]
    """Cycles a piece of `nbytes` holds its sender's lane."""
    words = (nbytes + fab[FB_OUT_BW] - 1) // fab[FB_OUT_BW]
    instr = (nbytes + fab[FB_SEND_MAX] - 1) // fab[FB_SEND_MAX]
    return max(words, instr * fab[FB_SEND])


@kjit
def port_cycles(fab, nbytes, first):  # type: ignore[no-untyped-def]
    """Cycles a piece of `nbytes` holds a receiver's port (`first`: the
    transfer's first piece, which also carries its receive control)."""
    c = (nbytes + fab[FB_IN_BW] - 1) // fab[FB_IN_BW]
    return max(c, fab[FB_RECV]) if first else c


# ---- grouping transfers into sends ----------------------------------------------------


@kjit
def _slot(a, b, c, mask):  # type: ignore[no-untyped-def]
    """A hash of three int64 values, masked to a table slot (int64 arithmetic
    wraps)."""
    h = a * np.int64(-7046029254386353131) + b * np.int64(-4658895280553007687) + \
        c * np.int64(-7723592293110705685)
    h ^= h >> 31
    h *= np.int64(-4265267296055464877)
    h ^= h >> 29
    return h & mask


@kjit
def _leaders_step(i0, i1, src_tile, src_addr, sig, dst_tile, tiles, sources, lead):  # type: ignore[no-untyped-def]
    """`send_leaders` of one step's transfers [i0, i1) into `lead`: transfers
    with equal (source tile, address, signature) form a group (numbered in
    program order through a hash table); a counting sort lays each group
    out in program order; each group is then split by repeated destination
    tiles.  O(n): two mergesorts of the step took 0.39 s on the 27-layer
    siglip-so400m-map's 3.5 M transfers."""
    n = i1 - i0
    cap = 1
    while cap < 2 * n:
        cap *= 2
    mask = np.int64(cap - 1)
    table = np.full(cap, -1, dtype=np.int32)  # slot -> group
    first = np.empty(n, dtype=np.int64)  # group -> its first transfer
    grp = np.empty(n, dtype=np.int64)
    ng = 0
    for x in range(i0, i1):
        h = _slot(src_tile[x], src_addr[x], sig[x], mask)
        while True:
            g = table[h]
            if g < 0:
                table[h] = ng
                first[ng] = x
                grp[x - i0] = ng
                ng += 1
                break
            f = first[g]
            if src_tile[f] == src_tile[x] and src_addr[f] == src_addr[x] and sig[f] == sig[x]:
                grp[x - i0] = g
                break
            h = (h + 1) & mask
    if sources:
        for x in range(i0, i1):
            lead[x] = first[grp[x - i0]]
        return
    gptr = np.zeros(ng + 1, dtype=np.int64)
    for k in range(n):
        gptr[grp[k] + 1] += 1
    for g in range(ng):
        gptr[g + 1] += gptr[g]
    fill = gptr[:ng].copy()
    perm = np.empty(n, dtype=np.int64)
    for k in range(n):
        perm[fill[grp[k]]] = k + i0
        fill[grp[k]] += 1
    seen = np.zeros(tiles, dtype=np.int64)
    sub = np.empty(n, dtype=np.int64)
    for g in range(ng):
        r0, r1 = gptr[g], gptr[g + 1]
        if r1 - r0 == 1:
            lead[perm[r0]] = perm[r0]
            continue
        nsub = 0
        for j in range(r0, r1):
            x = perm[j]
            o = seen[dst_tile[x]]
            seen[dst_tile[x]] += 1
            if o == nsub:
                sub[nsub] = x
                nsub += 1
            lead[x] = sub[o]
        for j in range(r0, r1):
            seen[dst_tile[perm[j]]] = 0


@kjit
def _leaders(xptr, src_tile, src_addr, sig, dst_tile, tiles, sources):  # type: ignore[no-untyped-def]
    """`_leaders_step` of every step.  (Serial: one step holds most of
    siglip-so400m-map's transfers, and a parallel function may not be
    entered from the optimizer's worker threads.)"""
    lead = np.arange(src_tile.shape[0])
    for s in range(xptr.shape[0] - 1):
        if xptr[s + 1] - xptr[s] > 1:
            _leaders_step(xptr[s], xptr[s + 1], src_tile, src_addr, sig, dst_tile, tiles,
                          sources, lead)
    return lead


def send_leaders(xptr: np.ndarray, src_tile: np.ndarray, dst_tile: np.ndarray,
                 nbytes: np.ndarray, src_addr: np.ndarray, patch: np.ndarray, tiles: int,
                 sources: bool = False) -> np.ndarray:
    """int64 [X]: the leader of each transfer's send (transfers laid out by
    the CSR `xptr` over steps).  Transfers of one step with equal source
    tile, `src_addr` (the source's identity: an address, or a buffer and
    offset), bytes and `patch` (an id of the source's patch, 0 for none) are
    one send, except that a second transfer to a tile already in the send
    starts a send of its own (a tile hears a transmission once); a send's
    leader is its first transfer.  With `sources`: instead, a number of each
    transfer's source, equal for the transfers that may share a send."""
    i64 = np.int64
    sig = nbytes.astype(i64) + (patch.astype(i64) << 40)
    return _leaders(xptr.astype(i64, copy=False), src_tile.astype(i64, copy=False),
                    src_addr.astype(i64, copy=False), sig, dst_tile.astype(i64, copy=False),
                    i64(tiles), sources)


def source_patches(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """int64 [X]: an id of each transfer's source patch (mode, stride and
    table address; the table's index while the tables have no address yet),
    0 for an unpatched source."""
    n = arrays["x_src_tile"].shape[0]
    out = np.zeros(n, dtype=np.int64)
    if "p_target" not in arrays:  # a program being assembled, no patches yet
        return out
    src = np.flatnonzero(arrays["p_target"] == PATCH_XFER_SRC)
    if src.size:
        i = arrays["p_index"][src]
        ok = (i >= 0) & (i < n)
        i, src = i[ok], src[ok]
        # a table patch is its table's copy on the tile; before the tables are
        # placed (a package being assembled), the table itself
        table = arrays["p_table_addr"] if "p_table_addr" in arrays else arrays["p_table"]
        keys = (table[src], arrays["p_stride"][src], arrays["p_mode"][src])
        order = np.lexsort(keys)
        new = np.zeros(order.size, dtype=bool)  # a row unlike the one before it
        new[:1] = True
        for k in keys:
            new[1:] |= k[order][1:] != k[order][:-1]
        ids = np.empty(order.size, dtype=np.int64)
        ids[order] = np.cumsum(new)
        out[i] = ids
    return out


def package_leaders(arrays: dict[str, np.ndarray], tiles: int,
                    sources: bool = False) -> np.ndarray:
    """`send_leaders` of a package's transfers: a source is its address and
    its patch."""
    return send_leaders(arrays["step_xfer"], arrays["x_src_tile"], arrays["x_dst_tile"],
                        arrays["x_bytes"], arrays["x_src_addr"], source_patches(arrays), tiles,
                        sources)


# ---- the scheduler --------------------------------------------------------------------


@kjit
def _members(leader, i0, i1):  # type: ignore[no-untyped-def]
    """The step's sends: leaders (program order) and their members, CSR."""
    n = i1 - i0
    order = np.argsort(leader[i0:i1], kind="mergesort")
    lead = np.empty(n, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    mem = np.empty(n, dtype=np.int64)
    g = -1
    for k in range(n):
        x = i0 + order[k]
        if g < 0 or leader[x] != lead[g]:
            g += 1
            lead[g] = leader[x]
            ptr[g] = k
        mem[k] = x
    ptr[g + 1] = n
    return lead[:g + 1], ptr[:g + 2], mem


@kjit
def _fit(b0, b1, lo, hi, t, d):  # type: ignore[no-untyped-def]
    """The earliest start >= t of a [start, start + d) clear of the sorted,
    disjoint bookings b0[lo:hi], b1[lo:hi]."""
    # from the first booking that ends after t (ends rise with starts)
    for k in range(bisect_right(b1, lo, hi, t), hi):
        if t + d <= b0[k]:
            return t
        t = max(t, b1[k])
    return t


@kjit
def _book(b0, b1, lo, n, t0, t1):  # type: ignore[no-untyped-def]
    """Insert [t0, t1) into the sorted bookings b0/b1[lo:lo+n] (merged with a
    neighbour it touches); returns the new count."""
    a = bisect_left(b0, lo, lo + n, t0)
    if a > lo and b1[a - 1] == t0:  # extends the booking before
        b1[a - 1] = t1
        if a < lo + n and b0[a] == t1:  # ... up to the next: merge the two
            b1[a - 1] = b1[a]
            for k in range(a, lo + n - 1):
                b0[k] = b0[k + 1]
                b1[k] = b1[k + 1]
            return n - 1
        return n
    if a < lo + n and b0[a] == t1:  # extends the booking after
        b0[a] = t0
        return n
    for k in range(lo + n, a, -1):
        b0[k] = b0[k - 1]
        b1[k] = b1[k - 1]
    b0[a] = t0
    b1[a] = t1
    return n + 1


@kjit
def _run_units(ug, uoff, ub, uorder, lead, ptr, mem, src_tile, dst_tile, fab, tiles,
               start, limit):  # type: ignore[no-untyped-def]
    """Book the units in `uorder`, each at the earliest cycle at which its
    lane and every receiver's port are free for it (gaps left by earlier
    units are used); their starts into `start`; returns the horizon, or
    as soon as it reaches `limit` (an order that cannot beat the shortest
    so far) a value >= `limit` with `start` incomplete.
    Bookings are kept per tile as sorted, merged intervals: lanes in
    rows [0, tiles), ports in [tiles, 2 tiles)."""
    n_units = ug.shape[0]
    cap = np.zeros(2 * tiles + 1, dtype=np.int64)
    for u in range(n_units):
        g = ug[u]
        cap[src_tile[lead[g]] + 1] += 1
        for m in range(ptr[g], ptr[g + 1]):
            cap[tiles + dst_tile[mem[m]] + 1] += 1
    for k in range(2 * tiles):
        cap[k + 1] += cap[k]
    b0 = np.empty(cap[2 * tiles], dtype=np.int64)
    b1 = np.empty(cap[2 * tiles], dtype=np.int64)
    cnt = np.zeros(2 * tiles, dtype=np.int64)
    horizon = np.int64(0)
    for k in range(n_units):
        u = uorder[k]
        g = ug[u]
        st = src_tile[lead[g]]
        lane = lane_cycles(fab, ub[u])
        t = np.int64(0)
        while True:
            t = _fit(b0, b1, cap[st], cap[st] + cnt[st], t, lane)
            moved = False
            for m in range(ptr[g], ptr[g + 1]):
                d = dst_tile[mem[m]]
                lat = latency(fab, st, d)
                r = tiles + d
                a = _fit(b0, b1, cap[r], cap[r] + cnt[r], t + lat,
                         port_cycles(fab, ub[u], uoff[u] == 0))
                if a > t + lat:
                    t = a - lat
                    moved = True
                    break
            if not moved:
                break
        start[u] = t
        cnt[st] = _book(b0, b1, cap[st], cnt[st], t, t + lane)
        horizon = max(horizon, t + lane)
        for m in range(ptr[g], ptr[g + 1]):
            d = dst_tile[mem[m]]
            a = t + latency(fab, st, d)
            e = a + port_cycles(fab, ub[u], uoff[u] == 0)
            r = tiles + d
            cnt[r] = _book(b0, b1, cap[r], cnt[r], a, e)
            horizon = max(horizon, e)
        if horizon >= limit:
            return horizon
    return horizon


@kjit
def _units(lead, ptr, mem, nbytes, src_tile, tiles):  # type: ignore[no-untyped-def]
    """One unit per send (its bytes whole, from offset 0) and the order the
    units are booked in (module docstring)."""
    n = lead.shape[0]
    ug = np.arange(n)
    uoff = np.zeros(n, dtype=np.int64)
    ub = np.empty(n, dtype=np.int64)
    utile = np.empty(n, dtype=np.int64)
    for g in range(n):
        ub[g] = nbytes[lead[g]]
        utile[g] = src_tile[lead[g]]
    # rank of each unit among its tile's units (program order), then the
    # round-robin order (rank, tile)
    by_tile = np.argsort(utile, kind="mergesort")
    rank = np.empty(n, dtype=np.int64)
    for k in range(n):
        u = by_tile[k]
        rank[u] = 0 if k == 0 or utile[by_tile[k - 1]] != utile[u] else rank[by_tile[k - 1]] + 1
    # largest first: members x bytes (a multicast books every member's port
    # at once, so the wide ones go while ports are empty), then round-robin
    area = np.empty(n, dtype=np.int64)
    for k in range(n):
        area[k] = (ptr[ug[k] + 1] - ptr[ug[k]]) * ub[k]
    rr = rank * tiles + utile
    uorder = np.argsort(-area * (rr.max() + 1) + rr, kind="mergesort")
    return ug, uoff, ub, uorder


@kjit
def _rotations(lead, ptr, mem, ub, src_tile, dst_tile, tiles):  # type: ignore[no-untyped-def]
    """Four more booking orders of `_units`' units (module docstring).
    Rotation by source: sends by (first receiver - source) mod tiles, then
    source, so an all-to-all among a run of tiles (a K-split's partial sums)
    books as a sequence of permutations, round r each tile sending to the
    one r after it, where program order sends every tile to the group's
    first receiver at once: [0] multicasts widest area first (as `_units`),
    then every unicast so; [1] every send by its member count (most first),
    then so.  Rotation by receiver group (its lowest member): each group's
    sends by source, started at an offset of the group's id, so groups fed
    by the same sources (the 24 K-blocks of one row block of a matmul's A)
    take them in different turns instead of all asking the first source
    first: [2] widest area first, then rank (offset +id), [3] most members
    first, then rank (offset -id)."""
    n = lead.shape[0]
    out = np.empty((4, n), dtype=np.int64)
    st = np.empty(n, dtype=np.int64)
    gid = np.empty(n, dtype=np.int64)
    area = np.empty(n, dtype=np.int64)
    k = np.empty(n, dtype=np.int64)
    for g in range(n):
        st[g] = src_tile[lead[g]]
        m = ptr[g + 1] - ptr[g]
        area[g] = m * ub[g]
        lo = dst_tile[mem[ptr[g]]]
        for x in range(ptr[g] + 1, ptr[g + 1]):
            lo = min(lo, dst_tile[mem[x]])
        gid[g] = lo
    tail = (dst_tile[mem[ptr[:-1]]] - st) % tiles * tiles + st
    for g in range(n):
        k[g] = (-area[g] if ptr[g + 1] - ptr[g] > 1 else 0) * tiles * tiles + tail[g]
    out[0] = np.argsort(k, kind="mergesort")
    for g in range(n):
        k[g] = -(ptr[g + 1] - ptr[g]) * tiles * tiles + tail[g]
    out[1] = np.argsort(k, kind="mergesort")
    # each unit's place among its group's units (by source, then program
    # order) and the group's size
    by_group = np.argsort(gid * tiles + st, kind="mergesort")
    pos = np.empty(n, dtype=np.int64)
    size = np.empty(n, dtype=np.int64)
    i = 0
    while i < n:
        j = i
        while j < n and gid[by_group[j]] == gid[by_group[i]]:
            pos[by_group[j]] = j - i
            j += 1
        for x in range(i, j):
            size[by_group[x]] = j - i
        i = j
    for o in range(2):
        sign = 1 if o == 0 else -1
        for g in range(n):
            rank = (pos[g] + sign * gid[g]) % size[g]
            wide = area[g] if o == 0 else ptr[g + 1] - ptr[g]
            k[g] = (-wide * n + rank) * tiles + st[g]
        out[2 + o] = np.argsort(k, kind="mergesort")
    return out


@kjit
def _cut_units(ug, uoff, ub, uorder, ptr, piece):  # type: ignore[no-untyped-def]
    """The units of `_units` with every unicast send longer than `piece`
    bytes cut into pieces of `piece` bytes (the last one shorter), booked in
    the same order, a send's pieces in offset order."""
    n = 0
    for u in range(ug.shape[0]):
        n += (ub[u] + piece - 1) // piece if ptr[ug[u] + 1] - ptr[ug[u]] == 1 else 1
    cg = np.empty(n, dtype=np.int64)
    coff = np.empty(n, dtype=np.int64)
    cb = np.empty(n, dtype=np.int64)
    k = 0
    for j in range(uorder.shape[0]):
        u = uorder[j]
        if ptr[ug[u] + 1] - ptr[ug[u]] > 1 or ub[u] <= piece:
            cg[k] = ug[u]
            coff[k] = uoff[u]
            cb[k] = ub[u]
            k += 1
            continue
        for o in range(0, ub[u], piece):
            cg[k] = ug[u]
            coff[k] = o
            cb[k] = min(piece, ub[u] - o)
            k += 1
    return cg, coff, cb, np.arange(n)


# (order, cut) the scheduler tries per step: order 0 is the program order
# (`_units`), 1-4 the rotations of `_rotations`; cut = with long unicasts cut
# into pieces (only when the step is scheduled with `piece` > 0)
_TRIES = ((2, False), (3, False), (4, False), (0, False), (0, True), (1, True))
# a step of more transfers than this gets the first try alone (a batch-2
# attention step of 2.4 M transfers costs about 0.3 s per try)
_ONE_TRY = 1 << 20


@kjit
def _schedule(xptr, src_tile, dst_tile, nbytes, leader, fab, tiles, todo, piece):  # type: ignore[no-untyped-def]
    """The schedule of the steps in `todo` (other steps get no pieces); with
    `piece` > 0, a step whose unicast sends cut into pieces of `piece` bytes
    (`_cut_units`) finish sooner is scheduled cut."""
    n_steps = xptr.shape[0] - 1
    cap = 0
    for s in range(n_steps):
        if todo[s]:
            for x in range(xptr[s], xptr[s + 1]):
                if leader[x] == x:
                    cap += 1 if piece <= 0 else (nbytes[x] + piece - 1) // piece
    q_send = np.empty(cap, dtype=np.int64)
    q_off = np.empty(cap, dtype=np.int64)
    q_bytes = np.empty(cap, dtype=np.int64)
    q_start = np.empty(cap, dtype=np.int64)
    step_piece = np.zeros(n_steps + 1, dtype=np.int64)
    step_xc = np.zeros(n_steps, dtype=np.int64)
    nq = 0
    for s in range(n_steps):
        step_piece[s] = nq
        i0, i1 = xptr[s], xptr[s + 1]
        if i1 == i0 or not todo[s]:
            continue
        lead, ptr, mem = _members(leader, i0, i1)
        wg, woff, wb, worder = _units(lead, ptr, mem, nbytes, src_tile, tiles)
        ug, uoff, ub, uorder = wg, woff, wb, worder
        start = np.empty(0, dtype=np.int64)
        best = np.int64(1) << 62
        more = _rotations(lead, ptr, mem, wb, src_tile, dst_tile, tiles)
        # the orders of `_TRIES` (the ones that shortened siglip-so400m-map's
        # steps, module docstring), the most often shortest first so that
        # the later runs stop early: the first shortest is kept
        for t in range(len(_TRIES)):
            if t > 0 and i1 - i0 > _ONE_TRY:
                break
            o, cut = _TRIES[t]
            order = worder if o == 0 else more[o - 1]
            if not cut:
                ostart = np.empty(wg.shape[0], dtype=np.int64)
                h = _run_units(wg, woff, wb, order, lead, ptr, mem, src_tile, dst_tile, fab,
                               tiles, ostart, best)
                if h < best:
                    ug, uoff, ub, uorder, start, best = wg, woff, wb, order, ostart, h
            elif piece > 0:
                cg, coff, cb, corder = _cut_units(wg, woff, wb, order, ptr, piece)
                if cg.shape[0] > wg.shape[0]:
                    cstart = np.empty(cg.shape[0], dtype=np.int64)
                    h = _run_units(cg, coff, cb, corder, lead, ptr, mem, src_tile, dst_tile,
                                   fab, tiles, cstart, best)
                    if h < best:
                        ug, uoff, ub, uorder, start, best = cg, coff, cb, corder, cstart, h
        for k in range(uorder.shape[0]):
            u = uorder[k]
            q_send[nq] = lead[ug[u]]
            q_off[nq] = uoff[u]
            q_bytes[nq] = ub[u]
            q_start[nq] = start[u]
            nq += 1
        step_xc[s] = best
    step_piece[n_steps] = nq
    return (q_send[:nq].copy(), q_off[:nq].copy(), q_bytes[:nq].copy(), q_start[:nq].copy(),
            step_piece, step_xc)


class _StepMemo:
    """Per-step results by a digest of everything they are computed from
    (bounded, least recently used first out; thread-safe).  The scheduler
    and the check are pure functions of one step's arrays, and most exchange
    steps do not change between the optimizer's builds (27-layer
    siglip-so400m-map, 8 steps: about 40 of a build's 44 exchange steps
    were scheduled by an earlier build of the same plan)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # total `size` of the values held
        self.held = 0
        self.items: OrderedDict[bytes, tuple[int, Any]] = OrderedDict()
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.held = 0

    def get(self, key: bytes) -> Any:
        with self.lock:
            hit = self.items.get(key)
            if hit is None:
                return None
            self.items.move_to_end(key)
            return hit[1]

    def unseen(self, keys: dict[int, bytes], n_steps: int) -> np.ndarray:
        """bool [n_steps]: the steps of `keys` (step -> digest) not held."""
        todo = np.zeros(n_steps, dtype=np.bool_)
        for s, key in keys.items():
            todo[s] = self.get(key) is None
        return todo

    def remember(self, keys: dict[int, bytes], ok: np.ndarray) -> None:
        """Hold the digest of each step of `keys` where `ok` (a pass mark)."""
        for s in np.flatnonzero(ok).tolist():
            self.put(keys[s], True)

    def put(self, key: bytes, value: Any, size: int = 1) -> None:
        with self.lock:
            if key in self.items or size > self.capacity:
                return
            self.items[key] = (size, value)
            self.held += size
            while self.held > self.capacity:
                _, (n, _v) = self.items.popitem(last=False)
                self.held -= n


# pieces (16 bytes each) of the schedules kept: a build of siglip-so400m-map
# 27 layers has ~0.82 M at batch 1 and ~1.06 M at batch 2, and the next build
# reuses most of them (at 1.2 M, batch-2 builds rescheduled steps evicted
# two builds before: 1.1 s of 3.2 s scheduling over 9 builds)
_SCHEDULES = _StepMemo(2_400_000)
_VALID = _StepMemo(4096)  # steps whose schedule the check found valid
_DISTINCT = _StepMemo(4096)  # steps whose sends the check found landing on distinct tiles


def forget() -> None:
    """Empty the per-step memos (for benchmarks that time the work itself)."""
    _SCHEDULES.clear()
    _VALID.clear()
    _DISTINCT.clear()


def _digest(fab: np.ndarray, *parts: np.ndarray) -> bytes:
    """A 128-bit digest (xxh3) of int64 arrays, with their lengths, under the
    fabric `fab`.  Not cryptographic: two different steps share a key by
    accident with odds of about n^2 / 2^129 for n steps seen."""
    h = xxhash.xxh3_128(np.ascontiguousarray(fab).data)
    for a in parts:
        a = np.ascontiguousarray(a, dtype=np.int64)
        h.update(a.size.to_bytes(8, "little"))
        h.update(a.data)
    return h.digest()


def schedule(dev: Device, xptr: np.ndarray, src_tile: np.ndarray, dst_tile: np.ndarray,
             nbytes: np.ndarray, leader: np.ndarray, piece: int = 0) -> dict[str, np.ndarray]:
    """The schedule arrays (module docstring) of transfers laid out by the
    CSR `xptr` over steps, grouped into sends by `leader`; with `piece` > 0,
    a step is scheduled with its long unicast sends cut into pieces of
    `piece` bytes when that ends it sooner.  A step's schedule depends only
    on its transfers' tiles, bytes and grouping: one scheduled before
    (`_SCHEDULES`) is reused."""
    i64 = np.int64
    xptr, src_tile, dst_tile, nbytes, leader = (
        a.astype(i64, copy=False) for a in (xptr, src_tile, dst_tile, nbytes, leader))
    fab = fabric(dev)
    key_fab = np.append(fab, i64(piece))
    n_steps = xptr.size - 1
    keys: dict[int, bytes] = {}
    known: dict[int, Any] = {}
    todo = np.zeros(n_steps, dtype=np.bool_)
    for s in np.flatnonzero(np.diff(xptr)).tolist():
        i0, i1 = xptr[s], xptr[s + 1]
        keys[s] = _digest(key_fab, src_tile[i0:i1], dst_tile[i0:i1], nbytes[i0:i1],
                          leader[i0:i1] - i0)
        hit = _SCHEDULES.get(keys[s])
        if hit is None:
            todo[s] = True
        else:
            known[s] = hit
    qs, qo, qb, qt, sp, sx = _schedule(xptr, src_tile, dst_tile, nbytes, leader, fab,
                                       i64(dev.tiles), todo, i64(piece))
    parts: list[tuple[np.ndarray, ...]] = []
    for s in keys:
        i0 = xptr[s]
        if s in known:
            rel, off, nb, start, sx[s] = known[s]
            parts.append((rel + i0, off, nb, start))
        else:
            p0, p1 = sp[s], sp[s + 1]
            got = (qs[p0:p1], qo[p0:p1], qb[p0:p1], qt[p0:p1])
            parts.append(got)
            _SCHEDULES.put(keys[s], ((got[0] - i0).astype(np.int32), got[1].astype(np.int32),
                                     got[2].astype(np.int32), got[3].astype(np.int32),
                                     int(sx[s])), p1 - p0)
    counts = np.zeros(n_steps + 1, dtype=i64)
    counts[1:][list(keys)] = [p[0].size for p in parts]
    cols = [np.concatenate([p[k] for p in parts]).astype(i64) if parts else np.zeros(0, i64)
            for k in range(4)]
    return {"x_send": leader, "step_piece": np.cumsum(counts), "step_xcycles": sx,
            "q_send": cols[0], "q_offset": cols[1], "q_bytes": cols[2], "q_start": cols[3]}


def schedule_arrays(dev: Device, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The schedule of a package's transfers (for packages built by hand;
    the planner schedules in its link)."""
    return schedule(dev, arrays["step_xfer"], arrays["x_src_tile"], arrays["x_dst_tile"],
                    arrays["x_bytes"], package_leaders(arrays, dev.tiles))


def rescheduled(pkg: Package, device: Device | None = None, **changes: np.ndarray) -> Package:
    """`pkg` with the arrays `changes` (and on `device`), its exchange
    scheduled afresh: for tests and experiments that change transfers or the
    fabric and mean the schedule to follow."""
    arrays = {**pkg.arrays, **changes}
    for k in SCHEDULE_ARRAYS:
        arrays.pop(k)
    return dataclasses.replace(pkg, device=device or pkg.device, arrays=arrays)


# ---- the check ------------------------------------------------------------------------


@kjit
def _better(out, s, kind, tile, cycle, item):  # type: ignore[no-untyped-def]
    """Keep the smaller of out[s] and (kind, tile, cycle, item)."""
    if out[s, 0] == V_NONE:
        better = True
    elif kind != out[s, 0]:
        better = kind < out[s, 0]
    elif tile != out[s, 1]:
        better = tile < out[s, 1]
    elif cycle != out[s, 2]:
        better = cycle < out[s, 2]
    else:
        better = item < out[s, 3]
    if better:
        out[s, 0] = kind
        out[s, 1] = tile
        out[s, 2] = cycle
        out[s, 3] = item


@kjit
def _sweep(out, s, kind, tile, t0, t1, q, limit):  # type: ignore[no-untyped-def]
    """Bookings (tile, start, end, piece) sorted by (tile, start, piece): each
    that starts before an earlier one of its tile ends is `kind`; each that
    ends after `limit` is V_LATE."""
    n = tile.shape[0]
    # bookings come in piece order, so a stable sort on (tile, start) breaks
    # ties by piece (starts < 2**40: the package's construction checks them)
    order = np.argsort(tile * (1 << 40) + t0, kind="mergesort")
    prev_tile = -1
    end = np.int64(0)
    for k in range(n):
        i = order[k]
        if tile[i] != prev_tile:
            prev_tile = tile[i]
            end = np.int64(-1 << 62)
        if t0[i] < end:
            _better(out, s, kind, tile[i], t0[i], q[i])
        end = max(end, t1[i])
        if t1[i] > limit:
            _better(out, s, V_LATE, tile[i], t1[i], q[i])


@kjit
def _violations(xptr, src_tile, dst_tile, nbytes, leader, pptr, q_send, q_off, q_bytes,
                q_start, step_xc, fab, todo):  # type: ignore[no-untyped-def]
    """The first violation of each step in `todo` (V_NONE for the others)."""
    n_steps = xptr.shape[0] - 1
    out = np.zeros((n_steps, 4), dtype=np.int64)
    for s in range(n_steps):
        i0, i1 = xptr[s], xptr[s + 1]
        p0, p1 = pptr[s], pptr[s + 1]
        if (i1 == i0 and p1 == p0) or not todo[s]:
            continue
        # coverage: per send, its pieces sorted by offset tile [0, bytes)
        covered = np.zeros(i1 - i0, dtype=np.int64)  # bytes covered so far, per leader
        bad_at = np.full(i1 - i0, -1, dtype=np.int64)
        order = np.argsort((q_send[p0:p1] - i0) * (1 << 40) + q_off[p0:p1], kind="mergesort")
        for k in range(p1 - p0):
            q = p0 + order[k]
            lx = q_send[q] - i0
            if bad_at[lx] < 0 and q_off[q] != covered[lx]:
                bad_at[lx] = min(covered[lx], nbytes[q_send[q]])
            covered[lx] = max(covered[lx], q_off[q] + q_bytes[q])
        for x in range(i0, i1):
            if leader[x] == x:
                lx = x - i0
                if bad_at[lx] < 0 and covered[lx] != nbytes[x]:
                    bad_at[lx] = min(covered[lx], nbytes[x])
                if bad_at[lx] >= 0:
                    _better(out, s, V_COVER, src_tile[x], bad_at[lx], x)
        # lanes
        n = p1 - p0
        lt = np.empty(n, dtype=np.int64)
        l0 = np.empty(n, dtype=np.int64)
        l1 = np.empty(n, dtype=np.int64)
        lq = np.empty(n, dtype=np.int64)
        for q in range(p0, p1):
            k = q - p0
            lt[k] = src_tile[q_send[q]]
            l0[k] = q_start[q]
            l1[k] = q_start[q] + lane_cycles(fab, q_bytes[q])
            lq[k] = q
        _sweep(out, s, V_LANE, lt, l0, l1, lq, step_xc[s])
        # ports: every member of a piece's send
        lead, ptr, mem = _members(leader, i0, i1)
        slot = np.full(i1 - i0, -1, dtype=np.int64)  # leader -> its send's row
        for g in range(lead.shape[0]):
            slot[lead[g] - i0] = g
        m = 0
        for q in range(p0, p1):
            g = slot[q_send[q] - i0]
            m += ptr[g + 1] - ptr[g]
        rt = np.empty(m, dtype=np.int64)
        r0 = np.empty(m, dtype=np.int64)
        r1 = np.empty(m, dtype=np.int64)
        rq = np.empty(m, dtype=np.int64)
        k = 0
        for q in range(p0, p1):
            g = slot[q_send[q] - i0]
            st = src_tile[q_send[q]]
            for j in range(ptr[g], ptr[g + 1]):
                d = dst_tile[mem[j]]
                rt[k] = d
                r0[k] = q_start[q] + latency(fab, st, d)
                r1[k] = r0[k] + port_cycles(fab, q_bytes[q], q_off[q] == 0)
                rq[k] = q
                k += 1
        _sweep(out, s, V_PORT, rt, r0, r1, rq, step_xc[s])
    return out


@kjit
def _repeated_members(xptr, leader, dst_tile, tiles, todo):  # type: ignore[no-untyped-def]
    """Per step in `todo`, the smallest (leader x tiles + destination tile)
    that two transfers share, -1 for none (and for the other steps)."""
    n_steps = xptr.shape[0] - 1
    out = np.full(n_steps, -1, dtype=np.int64)
    for s in range(n_steps):
        if todo[s]:
            out[s] = _repeated_pair(leader[xptr[s]:xptr[s + 1]],
                                    dst_tile[xptr[s]:xptr[s + 1]], tiles)
    return out


@kjit
def _repeated_pair(leader, dst_tile, tiles):  # type: ignore[no-untyped-def]
    if leader.shape[0] < 2:
        return -1
    key = np.sort(leader * tiles + dst_tile)
    for k in range(1, key.shape[0]):
        if key[k] == key[k - 1]:
            return key[k]
    return -1


def repeated_members(xptr: np.ndarray, leader: np.ndarray, dst_tile: np.ndarray,
                     tiles: int) -> tuple[int, int] | None:
    """The first (leader, tile) of a send two of whose transfers land on
    the same tile (a tile hears a transmission once), None for none.  A
    step found distinct before, with the same grouping and destinations
    (`_DISTINCT`), is not checked again."""
    i64 = np.int64
    xptr, leader, dst_tile = (a.astype(i64, copy=False) for a in (xptr, leader, dst_tile))
    tag = np.array([tiles], dtype=i64)
    keys = {s: _digest(tag, leader[xptr[s]:xptr[s + 1]] - xptr[s], dst_tile[xptr[s]:xptr[s + 1]])
            for s in np.flatnonzero(np.diff(xptr) > 1).tolist()}
    todo = _DISTINCT.unseen(keys, xptr.size - 1)
    rep = _repeated_members(xptr, leader, dst_tile, i64(tiles), todo)
    _DISTINCT.remember(keys, todo & (rep < 0))
    rep = rep[rep >= 0]
    if not rep.size:
        return None
    first = int(rep.min())
    return first // tiles, first % tiles


def violations(dev: Device, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """int64 [S, 4]: per step its first schedule violation (kind, tile, cycle,
    item), kind V_NONE when the step's schedule is valid.  The schedule's
    indices must be in range (the package's construction checks them) and
    its pieces must name leaders of their own step (`check_structure`).
    A step found valid before, with the same transfers, grouping and
    schedule (a digest of all the check reads: `_VALID`), is not checked
    again."""
    a = arrays
    fab = fabric(dev)
    xptr, pptr, qs = a["step_xfer"], a["step_piece"], a["q_send"]
    keys: dict[int, bytes] = {}
    for s in np.flatnonzero(np.diff(xptr) | np.diff(pptr)).tolist():
        i0, i1, p0, p1 = xptr[s], xptr[s + 1], pptr[s], pptr[s + 1]
        keys[s] = _digest(fab, a["x_src_tile"][i0:i1], a["x_dst_tile"][i0:i1],
                          a["x_bytes"][i0:i1], a["x_send"][i0:i1] - i0, qs[p0:p1] - i0,
                          a["q_offset"][p0:p1], a["q_bytes"][p0:p1], a["q_start"][p0:p1],
                          a["step_xcycles"][s:s + 1])
    todo = _VALID.unseen(keys, xptr.size - 1)
    out = _violations(xptr, a["x_src_tile"], a["x_dst_tile"], a["x_bytes"], a["x_send"], pptr,
                      qs, a["q_offset"], a["q_bytes"], a["q_start"], a["step_xcycles"], fab,
                      todo)
    _VALID.remember(keys, todo & (out[:, 0] == V_NONE))
    return out


def describe(row: np.ndarray, step: int) -> str:
    """One line naming a violation row of `violations`."""
    kind, tile, cycle, item = (int(v) for v in row)
    what = "send" if kind == V_COVER else "piece"
    at = "byte offset" if kind == V_COVER else "cycle"
    return f"step {step}: {V_NAMES[kind]} on tile {tile} ({what} {item}, {at} {cycle})"


def transfer_busy(dev: Device, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """int32 [X] each: the cycles its send holds the sender's lane (on the
    send's leader; 0 on the other members: a multicast leaves its tile once)
    and the cycles the transfer holds its receiver's port, over all the
    pieces of its send (the booking rules of the module docstring)."""
    a, c = arrays, dev.costs
    qs, nb = a["q_send"], a["q_bytes"]
    lane = np.maximum(-(-nb // c.exchange_out_bytes_per_cycle),
                      -(-nb // c.send_max_bytes) * c.send_cycles)
    port = -(-nb // c.exchange_in_bytes_per_cycle)
    port = np.where(a["q_offset"] == 0, np.maximum(port, c.receive_cycles), port)
    x_lane = np.zeros(a["x_send"].size, dtype=np.int64)
    x_port = np.zeros_like(x_lane)
    np.add.at(x_lane, qs, lane)
    np.add.at(x_port, qs, port)
    # int32: a transfer's cycles are bounded by a tile's memory / 4 (halves
    # what the engine's Program holds per package: 3.5 M transfers here)
    return x_lane.astype(np.int32), x_port[a["x_send"]].astype(np.int32)


def tile_windows(dev: Device, arrays: dict[str, np.ndarray],
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each tile's part in each exchange step's schedule: (step, tile, first
    cycle, end cycle) of the (step, tile) pairs with a booking, from the
    first booking of its lane or port to the end of the last, in cycles of
    the step's transfer window; sorted by step, then tile."""
    step, tile, first, end = _bookings(dev, arrays)
    if not step.size:
        return step, step, step, step
    key = step * dev.tiles + tile
    u, inv = np.unique(key, return_inverse=True)
    f = np.full(u.size, np.iinfo(np.int64).max, dtype=np.int64)
    e = np.zeros(u.size, dtype=np.int64)
    np.minimum.at(f, inv, first)
    np.maximum.at(e, inv, end)
    return u // dev.tiles, u % dev.tiles, f, e


def _bookings(dev: Device, arrays: dict[str, np.ndarray],
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every booking of the schedule: (step, tile, start, end), lanes first
    (piece order), then ports (piece, member order)."""
    a, c = arrays, dev.costs
    qs = a["q_send"]
    nq = qs.size
    empty = np.zeros(0, dtype=np.int64)
    if nq == 0:
        return empty, empty, empty, empty
    q_step = np.repeat(np.arange(a["step_piece"].size - 1, dtype=np.int64),
                       np.diff(a["step_piece"]))
    nb, t0 = a["q_bytes"], a["q_start"]
    lane = np.maximum(-(-nb // c.exchange_out_bytes_per_cycle),
                      -(-nb // c.send_max_bytes) * c.send_cycles)
    src = a["x_src_tile"][qs]
    # every (piece, member) pair: the members of a send, in transfer order
    members = np.argsort(a["x_send"], kind="stable")
    lo = np.searchsorted(a["x_send"][members], qs, side="left")
    hi = np.searchsorted(a["x_send"][members], qs, side="right")
    per = hi - lo
    q_of = np.repeat(np.arange(nq), per)
    x = members[np.repeat(lo, per) + (np.arange(q_of.size) - np.repeat(np.cumsum(per) - per, per))]
    d = a["x_dst_tile"][x]
    s_src = src[q_of]
    rows = c.tiles_per_row
    arr = t0[q_of] + c.arrival_latency_cycles + c.arrival_latency_row_cycles * np.abs(
        s_src // rows - d // rows)
    port = -(-nb[q_of] // c.exchange_in_bytes_per_cycle)
    port = np.where(a["q_offset"][q_of] == 0, np.maximum(port, c.receive_cycles), port)
    return (np.concatenate([q_step, q_step[q_of]]), np.concatenate([src, d]),
            np.concatenate([t0, arr]), np.concatenate([t0 + lane, arr + port]))
