"""planner.lowering.allocate: liveness rules, no overlap of live buffers, tensor range, failures."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from handprog import NBYTES, copy_vertex, loop_program

from kernels.abi import ADD, COPY
from planner.lowering.allocate import (
    MAX_ELEMENT_CANDIDATES,
    Overheads,
    _operands,
    _partners,
    allocate,
    live_ranges,
)
from planner.lowering.program import LoopMark, Phase, Program, Ref, Transfer, Vertex, Xfers
from planner.lowering.schedule import Schedule, schedule
from simulator.device import load_device
from tilecommon.errors import BuildFailure

TINY = load_device("tiny")


def _ovh(code: int = 0, xtable: int = 0, support: int = 0) -> Overheads:
    n = TINY.tiles
    return Overheads(np.full(n, code, dtype=np.int64), np.full(n, xtable, dtype=np.int64),
                     np.full(n, support, dtype=np.int64))


def _assert_valid(p: Program, alloc, lo: np.ndarray, hi: np.ndarray) -> None:
    bufs = p.bufs
    for i, bi in enumerate(bufs):
        a = int(alloc.addr[i])
        assert a % max(bi.align, TINY.alignment) == 0
        assert lo[bi.tile] <= a and a + bi.nbytes <= hi[bi.tile]
        for j in range(i + 1, len(bufs)):
            bj = bufs[j]
            if bj.tile != bi.tile:
                continue
            live = alloc.first[i] <= alloc.last[j] and alloc.first[j] <= alloc.last[i]
            b = int(alloc.addr[j])
            disjoint = a + bi.nbytes <= b or b + bj.nbytes <= a
            assert not live or disjoint, (bi.name, bj.name)


def test_loop_program_live_ranges() -> None:
    p = loop_program(3)
    s = schedule(p)
    first, last = live_ranges(p, s)
    names = {b.name: b.id for b in p.bufs}
    # steps: 0 exchange, 1 copies, 2 BEGIN, 3 add, 4 END, 5 exchange
    assert (first[names["x"]], last[names["x"]]) == (0, 5)  # persistent
    assert (first[names["x@1"]], last[names["x@1"]]) == (0, 1)
    # ping is written before the loop (crosses into it); pong is the final yield, read after
    assert (first[names["ping"]], last[names["ping"]]) == (1, 4)
    assert (first[names["pong"]], last[names["pong"]]) == (2, 5)
    assert (first[names["side_out"]], last[names["side_out"]]) == (1, 1)


def test_loop_carried_read_first_is_live_for_whole_loop() -> None:
    p = loop_program(2)
    s = schedule(p)
    first, last = live_ranges(p, s)
    w = next(b.id for b in p.bufs if b.name == "w")
    assert (first[w], last[w]) == (0, len(s.steps) - 1)


def test_allocation_valid_and_inside_tensor_range() -> None:
    p = loop_program(3)
    s = schedule(p)
    ovh = _ovh(code=200, xtable=16, support=2048)
    alloc = allocate(p, s, TINY, ovh)
    lo = TINY.memory_base + 200 + 16 + 2048
    lo = -(-lo // 8) * 8
    assert (alloc.tensor_lo == lo).all()
    assert (alloc.tensor_hi == TINY.memory_end).all()
    _assert_valid(p, alloc, alloc.tensor_lo, alloc.tensor_hi)
    assert alloc.peak_live[1] == 3 * NBYTES + 2 * NBYTES  # w (3 layers) + two of landing/ping/pong


def _range(support: int) -> tuple[np.ndarray, np.ndarray]:
    lo = np.full(TINY.tiles, TINY.memory_base + support, dtype=np.int64)
    return lo, np.full(TINY.tiles, TINY.memory_end, dtype=np.int64)


def _random_program(seed: int, nbuf: int = 60, nsteps: int = 40) -> Program:
    rng = np.random.default_rng(seed)
    p = Program()
    ids = [p.new_buf(int(rng.integers(0, 3)), int(rng.integers(1, 40)) * 8, "activation",
                     f"b{i}", persistent=bool(rng.random() < 0.1)) for i in range(nbuf)]
    by_tile: dict[int, list[int]] = {}
    for b in ids:
        by_tile.setdefault(p.bufs[b].tile, []).append(b)
    for k in range(nsteps):
        tile = int(rng.integers(0, 3))
        pool = by_tile.get(tile, [])
        if len(pool) < 2:
            continue
        src, dst = (int(v) for v in rng.choice(pool, size=2, replace=False))
        p.items.append(Phase("compute", f"s{k}", [copy_vertex(tile, src, dst)]))
    return p


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_never_overlap_live_buffers(seed: int) -> None:
    p = _random_program(seed)
    s = schedule(p)
    _assert_valid(p, allocate(p, s, TINY, _ovh(support=1024)), *_range(1024))
    alloc = allocate(p, s, TINY, _ovh(support=1024), avoid_conflicts=False)
    _assert_valid(p, alloc, alloc.tensor_lo, alloc.tensor_hi)
    # liveness-based reuse: the highest address never needs more than the sum of sizes
    for t in range(3):
        sizes = sum(b.nbytes for b in p.bufs if b.tile == t)
        assert alloc.tensor_top[t] - alloc.tensor_lo[t] <= sizes
        assert alloc.peak_live[t] <= alloc.tensor_top[t] - alloc.tensor_lo[t]


def test_disjoint_lifetimes_share_memory() -> None:
    p = Program()
    src = p.new_buf(0, 64, "activation", "src", persistent=True)
    tmp = [p.new_buf(0, 4096, "scratch", f"t{i}") for i in range(4)]
    chain = [src, *tmp]
    for i in range(4):  # t_i is live from step i-1 to step i: t0/t2 and t1/t3 may share
        p.items.append(Phase("compute", f"w{i}", [copy_vertex(0, chain[i], chain[i + 1])]))
    alloc = allocate(p, schedule(p), TINY, _ovh(), avoid_conflicts=False)
    assert len({int(alloc.addr[t]) for t in tmp}) == 2
    assert alloc.tensor_top[0] - alloc.tensor_lo[0] == 64 + 2 * 4096


def test_too_large_fails_with_tile_bytes_and_profile() -> None:
    p = Program()
    a = p.new_buf(5, 40000, "parameter", "big_w", persistent=True)
    b = p.new_buf(5, 30000, "activation", "big_act")
    p.items.append(Phase("compute", "use", [copy_vertex(5, a, b)]))
    with pytest.raises(BuildFailure) as ei:
        allocate(p, schedule(p), TINY, _ovh(code=100, support=2048))
    e = ei.value
    assert e.stage == "allocate" and e.tile == 5
    assert e.need == 70000 and e.have == TINY.memory_size - 2152  # 100 + 2048 rounded to 8
    assert "tile 5" in str(e) and "tensor range" in str(e)
    assert "largest live: big_w (parameter, 40000), big_act (activation, 30000)" in str(e)
    assert e.profile["parameter"] == 40000 and e.profile["activation"] == 30000
    assert e.profile["code"] == 100 and e.profile["support"] == 2048


def test_overheads_larger_than_tile_fail() -> None:
    p = Program()
    p.new_buf(0, 8, "activation", "a", persistent=True)
    with pytest.raises(BuildFailure, match="code, exchange tables and support"):
        allocate(p, schedule(p), TINY, _ovh(code=TINY.memory_size))


def test_deterministic() -> None:
    p1, p2 = _random_program(3), _random_program(3)
    a1 = allocate(p1, schedule(p1), TINY, _ovh())
    a2 = allocate(p2, schedule(p2), TINY, _ovh())
    assert np.array_equal(a1.addr, a2.addr)


def test_element_aware_placement_separates_operands() -> None:
    """A chain of copies between 4 KiB buffers: best fit packs source and
    destination into one 16 KiB element; element-aware placement never does."""
    p = Program()
    chain = [p.new_buf(0, 4096, "activation", "src", persistent=True)]
    chain += [p.new_buf(0, 4096, "activation", f"t{i}") for i in range(6)]
    for i in range(6):
        p.items.append(Phase("compute", f"c{i}", [copy_vertex(0, chain[i], chain[i + 1])]))
    s = schedule(p)
    e = TINY.element_bytes

    def shared(alloc) -> int:
        el = [(int(alloc.addr[b]) - TINY.memory_base) // e for b in chain]
        return sum(el[i] == el[i + 1] for i in range(6))

    plain = allocate(p, s, TINY, _ovh(), avoid_conflicts=False)
    aware = allocate(p, s, TINY, _ovh())
    _assert_valid(p, aware, aware.tensor_lo, aware.tensor_hi)
    assert shared(plain) > 0 and shared(aware) == 0
    assert aware.element_conflicts == 0 and aware.fallback_tiles == 0
    assert plain.element_conflicts == -1  # not measured without element awareness


def test_element_awareness_falls_back_when_memory_is_tight() -> None:
    """Three 20 KiB buffers of one vertex chain in a 62 KiB range: spreading
    them over element boundaries does not fit, plain best fit does."""
    p = Program()
    bufs = [p.new_buf(0, 20480, "activation", f"b{i}", persistent=True) for i in range(3)]
    p.items.append(Phase("compute", "c", [copy_vertex(0, bufs[0], bufs[1])]))
    p.items.append(Phase("compute", "d", [copy_vertex(0, bufs[1], bufs[2])]))
    ovh = _ovh(support=TINY.memory_size - 3 * 20480 - 1024)
    alloc = allocate(p, schedule(p), TINY, ovh)
    _assert_valid(p, alloc, alloc.tensor_lo, alloc.tensor_hi)
    assert alloc.fallback_tiles == 1


def _by_size(size: int, first: int, last: int, b: int) -> tuple[int, ...]:
    return (-size, first, b)


def _by_first(size: int, first: int, last: int, b: int) -> tuple[int, ...]:
    return (first, -size, b)


def _by_lifetime(size: int, first: int, last: int, b: int) -> tuple[int, ...]:
    return (first - last, -size, first, b)


def _naive_best_fit(p: Program, first: np.ndarray, last: np.ndarray, lo: int, hi: int,
                    key: Callable[[int, int, int, int], tuple[int, ...]] = _by_size,
                    ) -> tuple[dict[int, int], int]:
    """The slow, obvious twin of the jitted placement (plain best fit): for
    each buffer in `key` order, list the free gaps among placed buffers that
    are live at the same time, take the smallest gap that fits (then the
    lowest address).  Returns (addresses, -1), or (partial addresses, the
    first buffer that fits no gap)."""
    order = sorted(range(len(p.bufs)),
                   key=lambda b: key(p.bufs[b].nbytes, int(first[b]), int(last[b]), b))
    addr: dict[int, int] = {}
    for b in order:
        size = p.bufs[b].nbytes
        busy = sorted((addr[o], addr[o] + p.bufs[o].nbytes) for o in addr
                      if first[o] <= last[b] and first[b] <= last[o])
        cursor, best = lo, None
        for start, end in [*busy, (hi, hi)]:
            a = -(-cursor // 8) * 8
            if start - a >= size and (best is None or start - cursor < best[0]):
                best = (start - cursor, a)
            cursor = max(cursor, end)
        if best is None:
            return addr, b
        addr[b] = best[1]
    return addr, -1


@pytest.mark.parametrize("seed", range(4))
def test_jitted_placement_matches_naive_twin(seed: int) -> None:
    p = Program()
    rng = np.random.default_rng(100 + seed)
    ids = [p.new_buf(0, int(rng.integers(1, 64)) * 8, "activation", f"b{i}",
                     persistent=bool(rng.random() < 0.1)) for i in range(50)]
    for k in range(40):
        src, dst = (int(v) for v in rng.choice(ids, size=2, replace=False))
        p.items.append(Phase("compute", f"s{k}", [copy_vertex(0, src, dst)]))
    s = schedule(p)
    alloc = allocate(p, s, TINY, _ovh(), avoid_conflicts=False)
    want, failed = _naive_best_fit(p, alloc.first, alloc.last, TINY.memory_base,
                                   TINY.memory_end)
    assert failed < 0
    assert [int(alloc.addr[b]) for b in ids] == [want[b] for b in ids]


@pytest.mark.parametrize("seed", range(40))
def test_tight_tiles_try_the_three_orders_like_the_naive_twin(seed: int) -> None:
    """Plain best fit in a tensor range barely above the peak live bytes: the
    first of the three orders (size, first step, lifetime) whose naive
    placement fits gives the addresses (fallback counted when it is not the
    first); when none fits, the failure names the first order's buffer."""
    rng = np.random.default_rng(300 + seed)
    p = Program()
    ids = [p.new_buf(0, int(rng.integers(1, 48)) * 64, "activation", f"b{i}")
           for i in range(30)]
    for k in range(24):
        src, dst = (int(v) for v in rng.choice(ids, size=2, replace=False))
        p.items.append(Phase("compute", f"s{k}", [copy_vertex(0, src, dst)]))
    s = schedule(p)
    first, last = live_ranges(p, s)
    peak = max(sum(p.bufs[b].nbytes for b in ids if first[b] <= t <= last[b])
               for t in range(len(s.steps)))
    support = TINY.memory_size - peak - 64 * int(rng.integers(0, 4))
    lo = TINY.memory_base + support
    fits = [_naive_best_fit(p, first, last, lo, TINY.memory_end, key)
            for key in (_by_size, _by_first, _by_lifetime)]
    ok = [n for n, (_, failed) in enumerate(fits) if failed < 0]
    if not ok:
        with pytest.raises(BuildFailure) as ei:
            allocate(p, s, TINY, _ovh(support=support), avoid_conflicts=False)
        assert f"({p.bufs[fits[0][1]].name}, live steps" in str(ei.value)
        return
    alloc = allocate(p, s, TINY, _ovh(support=support), avoid_conflicts=False)
    assert alloc.fallback_tiles == (ok[0] > 0)
    assert [int(alloc.addr[b]) for b in ids] == [fits[ok[0]][0][b] for b in ids]


def _looped_program(seed: int, nbuf: int = 40, nphases: int = 30) -> Program:
    """Random compute and exchange phases on 3 tiles, some inside (nested)
    Repeats, with iterated refs: `iter_stride` and per-iteration `seq` on
    vertex operands and transfer ends (a seq ref's buffers need not be in the
    vertex's reads)."""
    rng = np.random.default_rng(seed)
    p = Program()
    ids = [p.new_buf(int(rng.integers(0, 3)), int(rng.integers(1, 40)) * 8, "activation",
                     f"b{i}", persistent=bool(rng.random() < 0.1)) for i in range(nbuf)]
    by_tile = {t: [b for b in ids if p.bufs[b].tile == t] for t in range(3)}
    open_trips: list[int] = []
    for k in range(nphases):
        u = rng.random()
        if u < 0.1 and len(open_trips) < 2:
            open_trips.append(int(rng.integers(2, 4)))
            p.items.append(LoopMark(True, open_trips[-1], f"L{k}"))
            continue
        if u < 0.2 and open_trips:
            p.items.append(LoopMark(False, open_trips.pop(), f"E{k}"))
            continue
        trips = open_trips[-1] if open_trips else 0
        tile = int(rng.integers(0, 3))
        a, b, c = (int(v) for v in rng.choice(by_tile[tile], size=3, replace=False))
        kind = int(rng.integers(0, 3)) if trips else 0  # 1: stride, 2: seq
        src = Ref(0, a, iter_stride=8 * (kind == 1),
                  seq=tuple(((a, c)[i % 2], 0) for i in range(trips)) if kind == 2 else ())
        if rng.random() < 0.6:
            v = Vertex(tile, COPY, (0,) * 16, (src, Ref(2, b)), (a,), (b,))
            p.items.append(Phase("compute", f"c{k}", [v]))
            continue
        dst_tile = int(rng.integers(0, 3))
        d = int(rng.choice(by_tile[dst_tile]))
        dst = Ref(1, d, iter_stride=8 * (kind == 2),
                  seq=tuple((d, 0) for _ in range(trips)) if kind == 1 else ())
        p.items.append(Phase("exchange", f"x{k}", transfers=Xfers.of([Transfer(src, dst, 8)])))
    while open_trips:
        p.items.append(LoopMark(False, open_trips.pop(), "end"))
    return p


def _naive_live_ranges(p: Program, s: Schedule) -> list[tuple[int, int]]:
    """The slow, obvious twin of `live_ranges`, from the module rules: touches
    (buffer, step, read, iterated) read off the Step objects, then every loop
    (innermost first) extends carried and crossing ranges."""
    touches: list[tuple[int, int, bool, bool]] = []
    for k, st in enumerate(s.steps):
        for v in st.vertices:
            touches += [(b, k, True, False) for b in v.reads]
            touches += [(b, k, False, False) for b in v.writes]
            if s.loop_of[k] >= 0:
                touches += [(b, k, False, True) for r in v.refs if r.iterated
                            for b in r.buffers()]
        for t in st.transfers:
            for r, read in ((t.src, True), (t.dst, False)):
                touches += [(b, k, read, r.iterated) for b in r.buffers()]
    n = len(s.steps)
    ranges = []
    for b, buf in enumerate(p.bufs):
        steps = [k for bb, k, _, _ in touches if bb == b]
        if buf.persistent:
            ranges.append((0, max(n - 1, 0)))
        else:
            ranges.append((min(steps), max(steps)) if steps else (0, 0))
    for b0, e0, _ in sorted(s.loops(), key=lambda x: (x[1] - x[0], x[0])):
        for b in range(len(p.bufs)):
            inside = [t for t in touches if t[0] == b and b0 < t[1] < e0]
            start = min((t[1] for t in inside), default=-1)
            carried = any(t[3] or (t[2] and t[1] == start) for t in inside)
            f, last = ranges[b]
            crosses = f < e0 and last > b0 and (f <= b0 or last >= e0)
            if carried or crosses:
                ranges[b] = (min(f, b0), max(last, e0))
    return ranges


@pytest.mark.parametrize("seed", range(12))
def test_live_ranges_match_naive_twin(seed: int) -> None:
    p = _looped_program(seed)
    s = schedule(p)
    assert s.loops(), "every seed opens a Repeat"
    first, last = live_ranges(p, s)
    assert list(zip(first.tolist(), last.tolist(), strict=True)) == _naive_live_ranges(p, s)
    _assert_valid(p, allocate(p, s, TINY, _ovh()), *_range(0))


@pytest.mark.parametrize("trips", [2, 3])
def test_loop_program_live_ranges_match_naive_twin(trips: int) -> None:
    p = loop_program(trips)
    s = schedule(p)
    first, last = live_ranges(p, s)
    assert list(zip(first.tolist(), last.tolist(), strict=True)) == _naive_live_ranges(p, s)


def test_partners_are_distinct_ref_buffers_of_one_vertex() -> None:
    """Partner pairs against sets: seq refs contribute their seq's buffers,
    not `buf` (the seq ref of `_looped_program` names a and c, never b)."""
    for seed in range(6):
        p = _looped_program(seed)
        s = schedule(p)
        ptr, lst = _partners(_operands(s), len(p.bufs))
        got = [(o, int(q)) for o in range(len(p.bufs)) for q in lst[ptr[o]:ptr[o + 1]]]
        want = set()
        for st in s.steps:
            for v in st.vertices:
                bs = {b for r in v.refs for b in r.buffers()}
                want |= {(x, y) for x in bs for y in bs if x != y}
        assert got == sorted(want)


def _naive_element_aware(p: Program, first: np.ndarray, last: np.ndarray,
                         partners: set[tuple[int, int]], lo: int, hi: int) -> dict[int, int]:
    """The slow twin of element-aware placement on one tile: every candidate
    (each fitting gap's aligned start, and for a buffer with partners the
    first MAX_ELEMENT_CANDIDATES element boundaries inside the gap) scored
    by (placed partners sharing an element, gap size, start before
    boundary), the first such minimum in address order."""
    el, base = TINY.element_bytes, TINY.memory_base
    size = [b.nbytes for b in p.bufs]

    def elems(a: int, n: int) -> tuple[int, int]:
        return (a - base) // el, (a + n - 1 - base) // el

    order = sorted(range(len(p.bufs)), key=lambda b: (-size[b], first[b], b))
    addr: dict[int, int] = {}
    for b in order:
        mine = [q for q in addr if (b, q) in partners]
        busy = sorted((addr[o], addr[o] + size[o]) for o in addr
                      if first[o] <= last[b] and first[b] <= last[o])
        cands: list[tuple[int, int, int, int, int]] = []
        cursor = lo
        for start, end in [*busy, (hi, hi)]:
            a = -(-cursor // 8) * 8
            if start - a >= size[b]:
                pos = [a]
                if any(bb == b for bb, _ in partners):
                    k0 = -(-(a - base) // el)
                    pos += [base + (k0 + c) * el for c in range(MAX_ELEMENT_CANDIDATES)]
                for rank, x in enumerate(pos):
                    if x + size[b] <= start:
                        e0, e1 = elems(x, size[b])
                        conf = sum(1 for q in mine if elems(addr[q], size[q])[0] <= e1
                                   and e0 <= elems(addr[q], size[q])[1])
                        cands.append((conf, start - cursor, min(rank, 1), len(cands), x))
            cursor = max(cursor, end)
        addr[b] = min(cands)[-1]
    return addr


@pytest.mark.parametrize("seed", range(6))
def test_element_aware_placement_matches_naive_twin(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    p = Program()
    ids = [p.new_buf(0, int(rng.integers(1, 200)) * 16, "activation", f"b{i}",
                     persistent=bool(rng.random() < 0.1)) for i in range(24)]
    for k in range(20):
        a, b, c = (int(v) for v in rng.choice(ids, size=3, replace=False))
        v = Vertex(0, ADD, (0,) * 16, (Ref(0, a), Ref(2, b), Ref(4, c)), (a, b), (c,))
        p.items.append(Phase("compute", f"s{k}", [v]))
    s = schedule(p)
    alloc = allocate(p, s, TINY, _ovh())
    assert alloc.fallback_tiles == 0
    ptr, lst = _partners(_operands(s), len(p.bufs))
    partners = {(o, int(q)) for o in ids for q in lst[ptr[o]:ptr[o + 1]]}
    want = _naive_element_aware(p, alloc.first, alloc.last, partners, TINY.memory_base,
                                TINY.memory_end)
    assert [int(alloc.addr[b]) for b in ids] == [want[b] for b in ids]


def test_iterated_transfer_ends_are_live_for_the_whole_loop() -> None:
    """Inside a Repeat, w is first written (plain copy) and then read by a
    strided transfer, and y only written by a strided transfer: neither is
    read first, yet both change address with the counter, so both are live
    BEGIN..END; the plain landing buffer t is not."""
    p = Program()
    x = p.new_buf(0, 16, "activation", "x", persistent=True)
    w = p.new_buf(0, 16, "activation", "w")
    y = p.new_buf(1, 16, "activation", "y")
    t = p.new_buf(1, 8, "exchange-landing", "t")
    p.items.append(LoopMark(True, 2, "L"))
    p.items.append(Phase("compute", "w", [copy_vertex(0, x, w)]))
    p.items.append(Phase("exchange", "w to t", transfers=Xfers.of([
        Transfer(Ref(0, w, iter_stride=8), Ref(1, t), 8)])))
    p.items.append(Phase("exchange", "x to y", transfers=Xfers.of([
        Transfer(Ref(0, x), Ref(1, y, iter_stride=8), 8)])))
    p.items.append(LoopMark(False, 2, "L"))
    s = schedule(p)
    first, last = live_ranges(p, s)
    end = len(s.steps) - 1  # steps: BEGIN, copy, exchange(s), END
    assert (first[w], last[w]) == (0, end) and (first[y], last[y]) == (0, end)
    assert first[t] == last[t] and 0 < first[t] < end
    assert list(zip(first.tolist(), last.tolist(), strict=True)) == _naive_live_ranges(p, s)
