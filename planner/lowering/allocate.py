"""Allocate: give every logical buffer an address on its tile.

Joint and liveness-based, per tile; there is no persistent/scratch partition.

Tile layout (absolute addresses, low to high)::

    memory_base | code | exchange tables | support (+ patch tables) | tensor range ... | memory_end

The first three are sized by the linker from counts before allocation
(`Overheads`, see `planner.lowering.link.reserve`); the tensor range is what is left.

Live ranges are inclusive step intervals [first, last] (indices into the
Schedule):
- persistent buffers (parameters, model inputs and outputs): the whole program;
- others: first..last step whose vertices or transfers reference them;
- a range that crosses a Repeat boundary, a buffer referenced by an iterated
  ref of a loop, and a buffer whose first touch inside a loop body reads it (a
  loop-carried value) are live for the whole loop, BEGIN..END inclusive
  (innermost loops first, so nesting composes);
- a non-persistent buffer that no step references gets [0, 0].

Placement is an interval-graph packing: buffers sorted by (size desc, first,
id) are placed best-fit into the aligned free address gaps left by the already
placed buffers whose live ranges overlap theirs (smallest fitting gap, then
lowest address).

Element conflicts.  Two operand streams of one vertex in the same 16 KiB SRAM
element halve its streaming rate (kernels/cost.py).  The first attempt on
each tile is element-aware: besides the start of each fitting gap it tries
the first MAX_ELEMENT_CANDIDATES element boundaries inside it,
and picks the position with the fewest already placed *partners* (buffers
that are distinct operands of a common vertex) sharing an element with it,
then the best fit.  That can fragment memory, so if it fails on a tile the
plain best-fit order and two other deterministic orders (first asc; then
lifetime length desc) are tried before the tile is declared infeasible.

Operands are read once into flat arrays (the program's `BufColumns`, vertex
reads/writes, ref buffers, the schedule's transfer columns); live ranges, partner pairs
and the placement of all tiles are jitted functions over them.

Failure raises `BuildFailure("allocate", tile, need, have, detail, profile)`
where `profile` maps kinds (code, exchange-table, support, parameter,
activation, scratch, exchange-landing) and `peak_live_tensor` to bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np

from planner.lowering.columns import BufColumns, buf_columns
from planner.lowering.program import TENSOR_KINDS, Program
from planner.lowering.schedule import Schedule
from simulator.device import Device
from tilecommon.errors import BuildFailure
from tilecommon.jit import kjit


@dataclass(frozen=True)
class Overheads:
    """Bytes per tile (int64[tiles] each) below the tensor range."""

    code: np.ndarray
    xtable: np.ndarray
    support: np.ndarray

    def total(self) -> np.ndarray:
        return self.code + self.xtable + self.support


@dataclass(frozen=True)
class Allocation:
    """Addresses and live ranges of every Program buffer (int64[B] arrays),
    and per tile (int64[tiles]): the tensor range [tensor_lo, tensor_hi), the
    highest tensor address used (`tensor_top`, = tensor_lo when empty) and the
    peak live tensor bytes over all steps.  `fallback_tiles` counts tiles
    where element-aware placement did not fit and a plain best-fit order
    was used; `element_conflicts` the partner buffer pairs that still share
    an element (-1 when placement was not element-aware)."""

    addr: np.ndarray
    first: np.ndarray
    last: np.ndarray
    tensor_lo: np.ndarray
    tensor_hi: np.ndarray
    tensor_top: np.ndarray
    peak_live: np.ndarray
    fallback_tiles: int = 0
    element_conflicts: int = -1


# touch flags: the step reads the buffer; the reference is iterated (its
# address changes with the Repeat counter)
READ = 1
ITERATED = 2


@dataclass(frozen=True, eq=False)
class _Operands:
    """A schedule's buffer references as flat int64 arrays.

    Touches (buffer, step, flags): vertex reads (READ) and writes, iterated
    vertex refs inside loops (ITERATED) and both ends of transfers with a
    per-iteration seq (every buffer of the seq).  Transfers without a seq stay
    in the schedule's columns (`xsrc`/`xdst` their buffers), `xseq` the rows
    with a seq (skipped there).
    `vbuf` lists every buffer each vertex's refs touch, grouped by vertex
    (`vptr[V+1]` offsets, duplicates allowed)."""

    tb: np.ndarray
    ts: np.ndarray
    tf: np.ndarray
    xstep: np.ndarray
    xsrc: np.ndarray
    xdst: np.ndarray
    xss: np.ndarray
    xds: np.ndarray
    xseq: np.ndarray
    vptr: np.ndarray
    vbuf: np.ndarray


def _align_up(x: np.ndarray | int, a: int) -> np.ndarray | int:
    return -(-x // a) * a


def _operands(sched: Schedule) -> _Operands:
    """Read every buffer reference of `sched` once (see `_Operands`).  Vertex
    reads/writes name the buffers (Program contract); refs (the schedule's
    vertex columns) give the partner groups and, inside loops, the iterated
    bindings."""
    va = sched.vertex_arrays()
    nv = va.step.size
    vstep = va.step
    rb, r_step = va.read_buf, vstep[va.read_vertex]
    wb, w_step = va.write_buf, vstep[va.write_vertex]
    ref_vertex = va.ref_vertex
    vbuf = va.ref_buf.copy()  # writable like the seq path's (one jitted signature)

    iterated = va.iterated
    odd_refs = va.iter_refs
    it_step = vstep[ref_vertex[iterated]]
    in_loop = np.asarray(sched.loop_of, dtype=np.int64).reshape(-1)[it_step] >= 0
    has_seq = np.fromiter(map(bool, map(attrgetter("seq"), odd_refs)), dtype=bool,
                          count=len(odd_refs))
    # iterated refs inside loops touch their buffer; seq refs every buffer of the seq
    tb: list[np.ndarray] = [vbuf[iterated[in_loop & ~has_seq]]]
    ts: list[np.ndarray] = [it_step[in_loop & ~has_seq]]
    tf: list[np.ndarray] = [np.full(tb[0].size, ITERATED, dtype=np.int64)]
    if has_seq.any():
        seq_at = np.flatnonzero(has_seq)
        bufs = [odd_refs[k].buffers() for k in seq_at.tolist()]
        n_seq = np.fromiter(map(len, bufs), dtype=np.int64, count=len(bufs))
        seq_buf = np.fromiter(chain.from_iterable(bufs), dtype=np.int64, count=int(n_seq.sum()))
        at = np.repeat(seq_at, n_seq)
        touch = in_loop[at]
        tb.append(seq_buf[touch])
        ts.append(it_step[at][touch])
        tf.append(np.full(int(touch.sum()), ITERATED, dtype=np.int64))
        # partner groups: a seq ref's buffers are its seq's (not its `buf`)
        keep = np.ones(vbuf.size, dtype=bool)
        keep[iterated[seq_at]] = False
        ref_vertex = np.concatenate([ref_vertex[keep], ref_vertex[iterated[at]]])
        vbuf = np.concatenate([vbuf[keep], seq_buf])[np.argsort(ref_vertex, kind="stable")]
    vptr = np.zeros(nv + 1, dtype=np.int64)
    np.cumsum(np.bincount(ref_vertex, minlength=nv), out=vptr[1:])

    x = sched.transfers()
    for i in x.seq.tolist():  # seq transfer ends touch every buffer of the seq
        (src, dst), s = x.refs(i), int(x.step[i])
        for r, flag in ((src, READ), (dst, 0)):
            bs = np.asarray(r.buffers(), dtype=np.int64)
            tb.append(bs)
            ts.append(np.full(bs.size, s, dtype=np.int64))
            tf.append(np.full(bs.size, flag | (ITERATED if r.iterated else 0), dtype=np.int64))
    return _Operands(
        tb=np.concatenate([rb, wb, *tb]),
        ts=np.concatenate([r_step, w_step, *ts]),
        tf=np.concatenate([np.full(rb.size, READ, dtype=np.int64),
                           np.zeros(wb.size, dtype=np.int64), *tf]),
        xstep=x.step, xsrc=x.src_buf, xdst=x.dst_buf, xss=x.src_stride, xds=x.dst_stride,
        xseq=x.seq,
        vptr=vptr, vbuf=vbuf)


@kjit
def _live(tb, ts, tf, xstep, xsrc, xdst, xss, xds, xseq, persistent, nsteps, loop_b,
          loop_e):  # pragma: no cover - jitted
    """(first, last) per the module rules: touches (tb, ts, tf flags) plus
    transfers (xstep, xsrc/xdst buffers, xss/xds iter strides; rows `xseq`
    skipped: their touches are in tb);
    `loop_b`/`loop_e` the Repeats, innermost first.  The loops are written
    out per source: inlined helpers taking arrays cost ~40 ns per touch in
    reference counting."""
    nb = persistent.shape[0]
    big = nsteps + 1
    first = np.full(nb, big, dtype=np.int64)
    last = np.full(nb, -1, dtype=np.int64)
    skip = np.zeros(xstep.shape[0], dtype=np.bool_)
    for j in range(xseq.shape[0]):
        skip[xseq[j]] = True
    for i in range(tb.shape[0]):
        b, s = tb[i], ts[i]
        first[b] = min(first[b], s)
        last[b] = max(last[b], s)
    for i in range(xstep.shape[0]):
        if skip[i]:
            continue
        s = xstep[i]
        b, d = xsrc[i], xdst[i]
        first[b] = min(first[b], s)
        last[b] = max(last[b], s)
        first[d] = min(first[d], s)
        last[d] = max(last[d], s)
    for b in range(nb):
        if last[b] < 0:
            first[b] = 0
            last[b] = 0
        if persistent[b]:
            first[b] = 0
            last[b] = max(nsteps - 1, 0)
    for k in range(loop_b.shape[0]):
        b0, e0 = loop_b[k], loop_e[k]
        fin = np.full(nb, big, dtype=np.int64)  # earliest step inside the loop
        carried = np.zeros(nb, dtype=np.bool_)
        for i in range(tb.shape[0]):
            b, s = tb[i], ts[i]
            if b0 < s < e0:
                fin[b] = min(fin[b], s)
                carried[b] |= (tf[i] & ITERATED) != 0
        for i in range(xstep.shape[0]):
            s = xstep[i]
            if b0 < s < e0 and not skip[i]:
                b = xsrc[i]
                fin[b] = min(fin[b], s)
                carried[b] |= xss[i] != 0
                b = xdst[i]
                fin[b] = min(fin[b], s)
                carried[b] |= xds[i] != 0
        # read at its earliest step inside the loop: a loop-carried value
        for i in range(tb.shape[0]):
            b, s = tb[i], ts[i]
            if b0 < s < e0 and s == fin[b] and (tf[i] & READ) != 0:
                carried[b] = True
        for i in range(xstep.shape[0]):
            b, s = xsrc[i], xstep[i]
            if b0 < s < e0 and s == fin[b] and not skip[i]:
                carried[b] = True
        for b in range(nb):
            crosses = first[b] < e0 and last[b] > b0 and (first[b] <= b0 or last[b] >= e0)
            if carried[b] or crosses:
                first[b] = min(first[b], b0)
                last[b] = max(last[b], e0)
    return first, last


def _live_ranges(ops: _Operands, persistent: np.ndarray,
                 sched: Schedule) -> tuple[np.ndarray, np.ndarray]:
    # innermost loops first: a range extended to an inner loop that then
    # crosses an outer boundary is extended again by the outer loop
    loops = sorted(sched.loops(), key=lambda x: (x[1] - x[0], x[0]))
    loop_b = np.asarray([b for b, _, _ in loops], dtype=np.int64)
    loop_e = np.asarray([e for _, e, _ in loops], dtype=np.int64)
    return _live(ops.tb, ops.ts, ops.tf, ops.xstep, ops.xsrc, ops.xdst, ops.xss, ops.xds,
                 ops.xseq, persistent, len(sched.steps), loop_b, loop_e)


def live_ranges(program: Program, sched: Schedule,
                cols: BufColumns | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) int64[B] inclusive step ranges, per the module rules."""
    persistent = (cols or buf_columns(program)).persistent.astype(np.bool_)
    return _live_ranges(_operands(sched), persistent, sched)


# element-boundary positions tried per free gap when avoiding element conflicts
MAX_ELEMENT_CANDIDATES = 8


@kjit
def _pair_keys(vptr, vbuf, nb):  # pragma: no cover - jitted
    """owner * nb + partner for every ordered pair of distinct buffers in one
    vertex group (with repeats)."""
    n = 0
    for v in range(vptr.shape[0] - 1):
        k = vptr[v + 1] - vptr[v]
        n += k * (k - 1)
    keys = np.empty(n, dtype=np.int64)
    m = 0
    for v in range(vptr.shape[0] - 1):
        for x in range(vptr[v], vptr[v + 1]):
            for y in range(vptr[v], vptr[v + 1]):
                if vbuf[x] != vbuf[y]:
                    keys[m] = vbuf[x] * nb + vbuf[y]
                    m += 1
    return keys[:m]


def _partners(ops: _Operands, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (ptr[nb+1], list) of buffers that are distinct operands of one vertex."""
    keys = np.sort(_pair_keys(ops.vptr, ops.vbuf, nb))
    if keys.size:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    ptr = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys // nb, minlength=nb), out=ptr[1:])
    return ptr, keys % nb


@kjit
def _place(order, size, align, first, last, lo, hi, addr, p_ptr, p_list, placed, base, elem,
           avoid, span0, span1):  # pragma: no cover - jitted
    """Place buffers `order` (indices) of one tile into [lo, hi).

    Best fit into the free gaps left by placed buffers with overlapping live
    ranges.  With `avoid`, candidate positions also include element
    boundaries and gap ends, scored first by the number of already placed
    partners (operand streams of a common vertex) sharing a memory element.
    Writes addr[i] and placed[i] = 1; `span0`/`span1` are scratch for the
    element spans of placed partners (length >= any buffer's partner count).
    Returns (-1, 0) on success, else (position in `order` that failed,
    largest aligned free gap in bytes)."""
    n = order.shape[0]
    for k in range(n):
        placed[order[k]] = 0
    # placed buffers in placement order: start, end, first and last step
    p_start = np.empty(n, dtype=np.int64)
    p_end = np.empty(n, dtype=np.int64)
    p_first = np.empty(n, dtype=np.int64)
    p_last = np.empty(n, dtype=np.int64)
    starts = np.empty(n + 1, dtype=np.int64)  # those live with buffer i, then hi
    ends = np.empty(n + 1, dtype=np.int64)
    for k in range(n):
        i = order[k]
        a = align[i]
        sz = size[i]
        fi = first[i]
        li = last[i]
        m = 0
        for q in range(k):  # branch-free filter: most placed buffers are not live with i
            starts[m] = p_start[q]
            ends[m] = p_end[q]
            m += (p_first[q] <= li) & (fi <= p_last[q])
        for q in range(1, m):  # insertion sort by address (few: ~3 on vit-tiny)
            x0, x1 = starts[q], ends[q]
            j = q
            while j > 0 and starts[j - 1] > x0:
                starts[j] = starts[j - 1]
                ends[j] = ends[j - 1]
                j -= 1
            starts[j] = x0
            ends[j] = x1
        starts[m] = hi
        ends[m] = hi
        partners = avoid and p_ptr[i + 1] > p_ptr[i]
        n_span = 0  # element spans of i's placed partners
        if partners:
            for q in range(p_ptr[i], p_ptr[i + 1]):
                p = p_list[q]
                if placed[p] != 0:
                    span0[n_span] = (addr[p] - base) // elem
                    span1[n_span] = (addr[p] + size[p] - 1 - base) // elem
                    n_span += 1
        cursor = lo
        best = -1
        best_conf = n + 1
        best_gap = hi - lo + 1
        best_rank = 2
        largest = 0
        for q in range(m + 1):
            nxt = starts[q]
            if nxt > cursor:  # else no room: the aligned start is >= cursor
                start = -(-cursor // a) * a
                if nxt > start:
                    room = nxt - start
                    if room > largest:
                        largest = room
                    if room >= sz:
                        gap = nxt - cursor
                        n_cand = 1
                        if partners:
                            n_cand = 1 + MAX_ELEMENT_CANDIDATES
                        for c in range(n_cand):
                            rank = 0 if c == 0 else 1
                            if best_conf == 0 and (gap > best_gap or (gap == best_gap
                                                                      and rank >= best_rank)):
                                break  # conflicts are never negative: nothing here can win
                            if c == 0:
                                cand = start
                            else:  # element boundaries, ascending
                                eb = base + (-(-(start - base) // elem) + c - 1) * elem
                                cand = -(-eb // a) * a
                            if cand + sz > nxt:
                                break
                            conf = 0
                            if n_span:
                                e0 = (cand - base) // elem
                                e1 = (cand + sz - 1 - base) // elem
                                for u in range(n_span):
                                    conf += (span0[u] <= e1) & (e0 <= span1[u])
                            better = conf < best_conf or (conf == best_conf and (
                                gap < best_gap or (gap == best_gap and rank < best_rank)))
                            if better:
                                best, best_conf, best_gap, best_rank = cand, conf, gap, rank
            if ends[q] > cursor:
                cursor = ends[q]
        if best < 0:
            return k, largest
        addr[i] = best
        placed[i] = 1
        p_start[k] = best
        p_end[k] = best + sz
        p_first[k] = fi
        p_last[k] = li
    return -1, 0


@kjit
def _stable_by(ids, key):  # pragma: no cover - jitted
    """`ids` stably sorted by key[ids].  Insertion sort: a tile holds tens of
    buffers (placement is quadratic in them anyway), and it compiles in a
    fraction of the time of numba's merge sort."""
    out = ids.copy()
    for q in range(1, out.shape[0]):
        x = out[q]
        kx = key[x]
        j = q
        while j > 0 and key[out[j - 1]] > kx:
            out[j] = out[j - 1]
            j -= 1
        out[j] = x
    return out


@kjit
def _place_tiles(tile_ids, bounds, size, align, first, last, lo, hi, addr, p_ptr, p_list, base,
                 elem, avoid):  # pragma: no cover - jitted
    """Place every tile's buffers (`tile_ids[bounds[t]:bounds[t+1]]`, ids
    ascending): with `avoid`, element-aware in order (size desc, first, id),
    then plain best fit in that order, (first, size desc, id) and (lifetime
    length desc, size desc, first, id).  Returns (fallback tiles, failing
    tile, the buffer whose plain best-fit placement failed first there, the
    largest free gap then); tile -1 when every tile fits."""
    placed = np.zeros(size.shape[0], dtype=np.int8)
    width = 0  # the most partners of one buffer
    for b in range(size.shape[0]):
        width = max(width, p_ptr[b + 1] - p_ptr[b])
    span0 = np.empty(width, dtype=np.int64)
    span1 = np.empty(width, dtype=np.int64)
    neg_size = -size
    neg_len = first - last
    fallback = 0
    for t in range(bounds.shape[0] - 1):
        ids = tile_ids[bounds[t]:bounds[t + 1]]
        if ids.shape[0] == 0:
            continue
        by_size = _stable_by(_stable_by(ids, first), neg_size)
        fail_buf = -1
        fail_gap = 0
        placed_all = False
        # attempt 0: element-aware by size; 1, 2, 3: plain by size, first step, lifetime.
        # One call site: a literal True/False argument would compile _place once more each.
        for attempt in range(4):
            if attempt == 0 and not avoid:
                continue
            if attempt <= 1:
                order = by_size
            elif attempt == 2:
                order = _stable_by(_stable_by(ids, neg_size), first)
            else:
                order = _stable_by(by_size, neg_len)
            k, largest = _place(order, size, align, first, last, lo[t], hi[t], addr, p_ptr,
                                p_list, placed, base, elem, attempt == 0, span0, span1)
            if k < 0:
                fallback += 1 if attempt > 1 or (attempt == 1 and avoid) else 0
                placed_all = True
                break
            if attempt > 0 and fail_buf < 0:
                fail_buf = order[k]
                fail_gap = largest
        if not placed_all:
            return fallback, t, fail_buf, fail_gap
    return fallback, -1, -1, 0


def _profile(tile: int, cols: BufColumns, ovh: Overheads, peak: int) -> dict[str, int]:
    prof = {
        "code": int(ovh.code[tile]),
        "exchange-table": int(ovh.xtable[tile]),
        "support": int(ovh.support[tile]),
    }
    on = cols.tile == tile
    for k, name in enumerate(TENSOR_KINDS):
        prof[name] = int(cols.nbytes[on & (cols.kind == k)].sum())
    prof["peak_live_tensor"] = peak
    return prof


def allocate(program: Program, sched: Schedule, device: Device, ovh: Overheads,
             avoid_conflicts: bool = True, cols: BufColumns | None = None) -> Allocation:
    """Place every buffer of `program`; raises BuildFailure("allocate", ...).

    `avoid_conflicts`: first try an element-aware placement on each tile
    (module docstring); the plain best-fit orders remain the fallback.
    `cols`: the program's buffer columns when the caller has read them."""
    cols = cols if cols is not None else buf_columns(program)
    nb = len(cols)
    tiles = device.tiles
    tile_of = cols.tile
    size = cols.nbytes
    align = np.maximum(cols.align, device.alignment)
    if nb and (tile_of.min() < 0 or tile_of.max() >= tiles):
        bad = int(np.flatnonzero((tile_of < 0) | (tile_of >= tiles))[0])
        raise BuildFailure("allocate", int(tile_of[bad]), 0, 0,
                           f"buffer {cols.names[bad]} on tile {tile_of[bad]} "
                           f"outside the device's {tiles} tiles")
    ops = _operands(sched)
    first, last = _live_ranges(ops, cols.persistent.astype(np.bool_), sched)
    nsteps = max(len(sched.steps), 1)

    lo = np.asarray(_align_up(device.memory_base + ovh.total(), device.alignment), dtype=np.int64)
    hi = np.full(tiles, device.memory_end, dtype=np.int64)
    over = np.flatnonzero(lo >= hi)
    if over.size:
        t = int(over[0])
        raise BuildFailure("allocate", t, int(ovh.total()[t]), device.memory_size,
                           f"code, exchange tables and support need {int(ovh.total()[t])} bytes "
                           f"of a {device.memory_size}-byte tile",
                           _profile(t, cols, ovh, 0))

    # peak live tensor bytes per tile over steps (inclusive ranges)
    delta = np.zeros((tiles, nsteps + 1), dtype=np.int64)
    np.add.at(delta, (tile_of, first), size)
    np.add.at(delta, (tile_of, last + 1), -size)
    live = np.cumsum(delta, axis=1)[:, :nsteps]
    peak = live.max(axis=1) if nb else np.zeros(tiles, dtype=np.int64)
    room = hi - lo
    short = np.flatnonzero(peak > room)
    if short.size:
        t = int(short[np.argmax(peak[short] - room[short])])
        s = int(np.argmax(live[t]))
        at = np.flatnonzero((tile_of == t) & (first <= s) & (last >= s))
        big = at[np.lexsort((at, -size[at]))][:3]
        names = ", ".join(f"{program.bufs[b].name} ({program.bufs[b].kind}, {int(size[b])})"
                          for b in big.tolist())
        raise BuildFailure("allocate", t, int(peak[t]), int(room[t]),
                           f"{int(peak[t])} live tensor bytes at step {s} but the "
                           f"tensor range {int(lo[t]):#x}..{int(hi[t]):#x} holds {int(room[t])}; "
                           f"largest live: {names}",
                           _profile(t, cols, ovh, int(peak[t])))

    addr = np.full(nb, -1, dtype=np.int64)
    p_ptr, p_list = _partners(ops, nb) if avoid_conflicts else (
        np.zeros(nb + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    tile_ids = np.argsort(tile_of, kind="stable")
    bounds = np.searchsorted(tile_of[tile_ids], np.arange(tiles + 1))
    fallback, t, b, largest = _place_tiles(tile_ids, bounds, size, align, first, last, lo, hi,
                                           addr, p_ptr, p_list, device.memory_base,
                                           device.element_bytes, avoid_conflicts)
    if t >= 0:
        buf = program.bufs[b]
        raise BuildFailure(
            "allocate", t, buf.nbytes, largest,
            f"cannot place a {buf.nbytes}-byte {buf.kind} ({buf.name}, live steps "
            f"{int(first[b])}..{int(last[b])}) into the remaining tensor range "
            f"{int(lo[t]):#x}..{int(hi[t]):#x}",
            _profile(t, cols, ovh, int(peak[t])))

    ends = np.where(addr >= 0, addr + size, 0)
    top = lo.copy()
    np.maximum.at(top, tile_of, ends)
    conflicts = _count_conflicts(p_ptr, p_list, addr, size, device) if avoid_conflicts else -1
    return Allocation(addr, first, last, lo, hi, top, peak.astype(np.int64), fallback,
                      conflicts)


def _count_conflicts(p_ptr: np.ndarray, p_list: np.ndarray, addr: np.ndarray,
                     size: np.ndarray, device: Device) -> int:
    """Partner pairs (counted once) whose element spans meet."""
    owner = np.repeat(np.arange(p_ptr.size - 1, dtype=np.int64), np.diff(p_ptr))
    keep = owner < p_list
    a, b = owner[keep], p_list[keep]
    el = device.element_bytes
    base = device.memory_base
    a0, a1 = (addr[a] - base) // el, (addr[a] + size[a] - 1 - base) // el
    b0, b1 = (addr[b] - base) // el, (addr[b] + size[b] - 1 - base) // el
    return int(np.count_nonzero((a0 <= b1) & (b0 <= a1)))
