"""Allocate: give every logical buffer an address on its tile.

Joint and liveness-based, per tile; there is no persistent/scratch partition.

Tile layout (absolute addresses, low to high)::

    memory_base | code | exchange tables | support (+ patch tables) | tensor range ... | memory_end

The first three are sized by the linker from counts before allocation
(`Overheads`, see `planner.link.reserve`); the tensor range is what is left.

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
The hot loop is one jitted function over flat arrays.

Failure raises `BuildFailure("allocate", tile, need, have, detail, profile)`
where `profile` maps kinds (code, exchange-table, support, parameter,
activation, scratch, exchange-landing) and `peak_live_tensor` to bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.exceptions import BuildFailure
from kernels.jit import kjit
from planner.program import TENSOR_KINDS, Program
from planner.schedule import Schedule
from simulator.device import Device


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


def _align_up(x: np.ndarray | int, a: int) -> np.ndarray | int:
    return -(-x // a) * a


def _touches(sched: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (buffer, step) reference as arrays: buffer, step, is-read,
    is-iterated.  Vertex reads/writes name the buffers (Program contract);
    refs are scanned only for iterated bindings (inside loops), which count
    as extra touches flagged iterated."""
    rb: list[int] = []  # read touches
    rs: list[int] = []
    wb: list[int] = []  # write touches
    ws: list[int] = []
    ib: list[int] = []  # iterated-ref touches
    is_: list[int] = []
    for s, st in enumerate(sched.steps):
        n_r, n_w = len(rb), len(wb)
        for v in st.vertices:
            rb.extend(v.reads)
            wb.extend(v.writes)
        rs.extend([s] * (len(rb) - n_r))
        ws.extend([s] * (len(wb) - n_w))
        if sched.loop_of[s] < 0:
            continue
        for r in (r for v in st.vertices for r in v.refs):
            if r.iter_stride or r.seq:
                bs = r.buffers()
                ib.extend(bs)
                is_.extend([s] * len(bs))
    # transfers from the flat arrays; seq endpoints touch every buffer of the seq
    x = sched.transfers()
    keep = np.ones(x.step.size, dtype=bool)
    keep[x.seq] = False
    for i in x.seq.tolist():
        (src, dst), s = x.refs(i), int(x.step[i])
        for r, into_b, into_s in ((src, rb, rs), (dst, wb, ws)):
            bs = r.buffers()
            into_b.extend(bs)
            into_s.extend([s] * len(bs))
            if r.iter_stride or r.seq:
                ib.extend(bs)
                is_.extend([s] * len(bs))
    xsrc, xdst, xs_r, xs_w = x.src_buf[keep], x.dst_buf[keep], x.step[keep], x.step[keep]
    s_it = keep & (x.src_stride != 0)
    d_it = keep & (x.dst_stride != 0)
    ib_x = np.concatenate([x.src_buf[s_it], x.dst_buf[d_it]])
    is_x = np.concatenate([x.step[s_it], x.step[d_it]])
    pb = np.concatenate([np.asarray(rb, dtype=np.int64), xsrc,
                         np.asarray(wb, dtype=np.int64), xdst, np.asarray(ib, dtype=np.int64),
                         ib_x])
    ps = np.concatenate([np.asarray(rs, dtype=np.int64), xs_r,
                         np.asarray(ws, dtype=np.int64), xs_w, np.asarray(is_, dtype=np.int64),
                         is_x])
    n_read = len(rb) + xsrc.size
    n_write = len(wb) + xdst.size
    pr = np.zeros(pb.size, dtype=bool)
    pr[:n_read] = True
    pi = np.zeros(pb.size, dtype=bool)
    pi[n_read + n_write:] = True
    return pb, ps, pr, pi


def live_ranges(program: Program, sched: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) int64[B] inclusive step ranges, per the module rules."""
    nb = len(program.bufs)
    nsteps = len(sched.steps)
    pb, ps, pr, pi = _touches(sched)
    big = np.int64(nsteps + 1)
    first = np.full(nb, big, dtype=np.int64)
    last = np.full(nb, -1, dtype=np.int64)
    np.minimum.at(first, pb, ps)
    np.maximum.at(last, pb, ps)
    unused = last < 0
    first[unused] = 0
    last[unused] = 0
    persistent = np.fromiter((b.persistent for b in program.bufs), dtype=bool, count=nb)
    first[persistent] = 0
    last[persistent] = max(nsteps - 1, 0)

    # innermost loops first: a range extended to an inner loop that then
    # crosses an outer boundary is extended again by the outer loop
    loops = sorted(sched.loops(), key=lambda x: (x[1] - x[0], x[0]))
    for b, e, _trips in loops:
        inside = (ps > b) & (ps < e)
        carried = np.zeros(nb, dtype=bool)
        carried[pb[inside & pi]] = True
        if inside.any():
            fin = np.full(nb, big, dtype=np.int64)
            np.minimum.at(fin, pb[inside], ps[inside])
            at_first = inside & (ps == fin[pb]) & pr
            carried[pb[at_first]] = True
        crosses = (first < e) & (last > b) & ((first <= b) | (last >= e))
        grow = carried | crosses
        first[grow] = np.minimum(first[grow], b)
        last[grow] = np.maximum(last[grow], e)
    return first, last


# element-boundary positions tried per free gap when avoiding element conflicts
MAX_ELEMENT_CANDIDATES = 8


@kjit
def _conflicts(i, cand, size, addr, p_ptr, p_list, placed, base, elem):  # pragma: no cover
    """Placed partners of buffer i whose element span meets i's span at `cand`."""
    e0 = (cand - base) // elem
    e1 = (cand + size[i] - 1 - base) // elem
    n = 0
    for q in range(p_ptr[i], p_ptr[i + 1]):
        p = p_list[q]
        if placed[p] == 0:
            continue
        f0 = (addr[p] - base) // elem
        f1 = (addr[p] + size[p] - 1 - base) // elem
        if f0 <= e1 and e0 <= f1:
            n += 1
    return n


@kjit
def _place(order, size, align, first, last, lo, hi, addr, p_ptr, p_list, placed, base, elem,
           avoid):  # pragma: no cover - jitted
    """Place buffers `order` (indices) of one tile into [lo, hi).

    Best fit into the free gaps left by placed buffers with overlapping live
    ranges.  With `avoid`, candidate positions also include element
    boundaries and gap ends, scored first by the number of already placed
    partners (operand streams of a common vertex) sharing a memory element.
    Writes addr[i] and placed[i] = 1.  Returns (-1, 0) on success, else
    (position in `order` that failed, largest aligned free gap in bytes)."""
    n = order.shape[0]
    for k in range(n):
        placed[order[k]] = 0
    done = np.empty(n, dtype=np.int64)
    starts = np.empty(n, dtype=np.int64)
    ends = np.empty(n, dtype=np.int64)
    for k in range(n):
        i = order[k]
        m = 0
        for j in range(k):
            p = done[j]
            if first[p] <= last[i] and first[i] <= last[p]:
                starts[m] = addr[p]
                ends[m] = addr[p] + size[p]
                m += 1
        idx = np.argsort(starts[:m], kind="mergesort")
        a = align[i]
        sz = size[i]
        partners = avoid and p_ptr[i + 1] > p_ptr[i]
        cursor = lo
        best = -1
        best_conf = n + 1
        best_gap = hi - lo + 1
        best_rank = 2
        largest = 0
        for q in range(m + 1):
            nxt = hi if q == m else starts[idx[q]]
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
                        if c == 0:
                            cand = start
                        else:
                            eb = base + (-(-(start - base) // elem) + c - 1) * elem
                            cand = -(-eb // a) * a
                        if cand < start or cand + sz > nxt:
                            continue
                        conf = 0
                        if partners:
                            conf = _conflicts(i, cand, size, addr, p_ptr, p_list, placed, base,
                                              elem)
                        better = conf < best_conf or (conf == best_conf and (
                            gap < best_gap or (gap == best_gap and rank < best_rank)))
                        if better:
                            best, best_conf, best_gap, best_rank = cand, conf, gap, rank
            if q < m and ends[idx[q]] > cursor:
                cursor = ends[idx[q]]
        if best < 0:
            return k, largest
        addr[i] = best
        placed[i] = 1
        done[k] = i
    return -1, 0


def _partners(sched: Schedule, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (ptr[nb+1], list) of buffers that are distinct operands of one vertex."""
    pairs: list[tuple[int, int]] = []
    for st in sched.steps:
        for v in st.vertices:
            bs = sorted({b for r in v.refs for b in r.buffers()})
            for x in range(len(bs)):
                for y in range(x + 1, len(bs)):
                    pairs.append((bs[x], bs[y]))
                    pairs.append((bs[y], bs[x]))
    if not pairs:
        return np.zeros(nb + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    raw = np.asarray(pairs, dtype=np.int64)
    key = np.unique(raw[:, 0] * nb + raw[:, 1])  # sorted by (owner, partner)
    ptr = np.searchsorted(key // nb, np.arange(nb + 1)).astype(np.int64)
    return ptr, key % nb


def _orders(ids: np.ndarray, size: np.ndarray, first: np.ndarray,
            last: np.ndarray) -> list[np.ndarray]:
    s, f, ln = size[ids], first[ids], last[ids] - first[ids]
    return [
        ids[np.lexsort((ids, f, -s))],
        ids[np.lexsort((ids, -s, f))],
        ids[np.lexsort((ids, f, -s, -ln))],
    ]


def _profile(tile: int, program: Program, kinds: np.ndarray, size: np.ndarray,
             tile_of: np.ndarray, ovh: Overheads, peak: int) -> dict[str, int]:
    prof = {
        "code": int(ovh.code[tile]),
        "exchange-table": int(ovh.xtable[tile]),
        "support": int(ovh.support[tile]),
    }
    on = tile_of == tile
    for k, name in enumerate(TENSOR_KINDS):
        prof[name] = int(size[on & (kinds == k)].sum())
    prof["peak_live_tensor"] = peak
    return prof


def allocate(program: Program, sched: Schedule, device: Device, ovh: Overheads,
             avoid_conflicts: bool = True) -> Allocation:
    """Place every buffer of `program`; raises BuildFailure("allocate", ...).

    `avoid_conflicts`: first try an element-aware placement on each tile
    (module docstring); the plain best-fit orders remain the fallback."""
    nb = len(program.bufs)
    tiles = device.tiles
    tile_of = np.fromiter((b.tile for b in program.bufs), dtype=np.int64, count=nb)
    size = np.fromiter((b.nbytes for b in program.bufs), dtype=np.int64, count=nb)
    align = np.fromiter((max(b.align, device.alignment) for b in program.bufs),
                        dtype=np.int64, count=nb)
    kinds = np.fromiter((TENSOR_KINDS.index(b.kind) for b in program.bufs),
                        dtype=np.int64, count=nb)
    if nb and (tile_of.min() < 0 or tile_of.max() >= tiles):
        bad = int(np.flatnonzero((tile_of < 0) | (tile_of >= tiles))[0])
        raise BuildFailure("allocate", int(tile_of[bad]), 0, 0,
                           f"buffer {program.bufs[bad].name} on tile {tile_of[bad]} "
                           f"outside the device's {tiles} tiles")
    first, last = live_ranges(program, sched)
    nsteps = max(len(sched.steps), 1)

    lo = np.asarray(_align_up(device.memory_base + ovh.total(), device.alignment), dtype=np.int64)
    hi = np.full(tiles, device.memory_end, dtype=np.int64)
    over = np.flatnonzero(lo >= hi)
    if over.size:
        t = int(over[0])
        raise BuildFailure("allocate", t, int(ovh.total()[t]), device.memory_size,
                           f"code, exchange tables and support need {int(ovh.total()[t])} bytes "
                           f"of a {device.memory_size}-byte tile",
                           _profile(t, program, kinds, size, tile_of, ovh, 0))

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
                           _profile(t, program, kinds, size, tile_of, ovh, int(peak[t])))

    addr = np.full(nb, -1, dtype=np.int64)
    placed = np.zeros(nb, dtype=np.int8)
    p_ptr, p_list = _partners(sched, nb) if avoid_conflicts else (
        np.zeros(nb + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    fallback = 0
    order_by_tile = np.argsort(tile_of, kind="stable")
    bounds = np.searchsorted(tile_of[order_by_tile], np.arange(tiles + 1))
    for t in range(tiles):
        ids = order_by_tile[bounds[t]:bounds[t + 1]]
        if ids.size == 0:
            continue
        failure: tuple[int, int] | None = None
        orders = _orders(ids, size, first, last)
        attempts = [(o, False) for o in orders]
        if avoid_conflicts:
            attempts.insert(0, (orders[0], True))
        for n_try, (order, avoid) in enumerate(attempts):
            k, largest = _place(order, size, align, first, last, lo[t], hi[t], addr, p_ptr,
                                p_list, placed, device.memory_base, device.element_bytes,
                                avoid)
            if k < 0:
                failure = None
                fallback += n_try > 0
                break
            if failure is None and not avoid:  # report the plain best-fit failure
                failure = (int(order[k]), int(largest))
        if failure is not None:
            b, largest = failure
            buf = program.bufs[b]
            raise BuildFailure(
                "allocate", t, buf.nbytes, largest,
                f"cannot place a {buf.nbytes}-byte {buf.kind} ({buf.name}, live steps "
                f"{int(first[b])}..{int(last[b])}) into the remaining tensor range "
                f"{int(lo[t]):#x}..{int(hi[t]):#x}",
                _profile(t, program, kinds, size, tile_of, ovh, int(peak[t])))

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
