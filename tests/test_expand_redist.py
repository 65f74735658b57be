"""Redistribution: the vectorised `moves` against a straightforward
per-object reference (the loops over cells × source cells × replicas it
replaces), on random small layouts with column slicing, replication, skip
sets, unaligned offsets and strides, and ping-pong `seq` locations."""

from __future__ import annotations

import numpy as np
import pytest
from handprog import dict_vertex as vertex

from kernels import abi
from planner.decide.layout import Layout, even_cuts
from planner.lowering.expand_redist import (
    PIECE_COLUMNS,
    Loc,
    _aligned,
    _granule,
    _granule_of,
    _span,
    moves,
    pieces,
    ref,
)
from planner.lowering.program import Program, Transfer, Vertex, Xfers

# ------------------------------------------------------------ reference


def ref_pieces(src: Layout, dst: Layout, segments: tuple, skip: set) -> list[tuple]:
    out = []
    for dr0, dr1, dc0, sr0, sc0, ncols in segments:
        for ri in dst.row_span(dr0, dr1):
            for ci in dst.col_span(dc0, dc0 + ncols):
                cell = ri * dst.nc + ci
                todo = [k for k in range(len(dst.owners[cell])) if (cell, k) not in skip]
                d_r0, d_r1, d_c0, d_c1 = dst.rect(ri, ci)
                r_lo, r_hi = max(d_r0, dr0), min(d_r1, dr1)
                c_lo, c_hi = max(d_c0, dc0), min(d_c1, dc0 + ncols)
                if not todo or r_lo >= r_hi or c_lo >= c_hi:
                    continue
                s_lo, s_hi = r_lo - dr0 + sr0, r_hi - dr0 + sr0
                t_lo, t_hi = c_lo - dc0 + sc0, c_hi - dc0 + sc0
                for sri in src.row_span(s_lo, s_hi):
                    for sci in src.col_span(t_lo, t_hi):
                        s_r0, s_r1, s_c0, s_c1 = src.rect(sri, sci)
                        a0, a1 = max(s_r0, s_lo), min(s_r1, s_hi)
                        b0, b1 = max(s_c0, t_lo), min(s_c1, t_hi)
                        if a0 >= a1 or b0 >= b1:
                            continue
                        scell = sri * src.nc + sci
                        owners = src.owners[scell]
                        for k in todo:
                            tile = dst.owners[cell][k]
                            rep = owners.index(tile) if tile in owners else 0
                            out.append((scell, rep, a0, a1, b0, b1, cell, k,
                                        a0 - sr0 + dr0, b0 - sc0 + dc0))
    return out


def ref_panels(groups: dict, elem: int) -> tuple[dict, dict]:
    """Per key (cell, rep, c0, c1): merged row runs (lo, hi, offset); per
    (cell, rep): buffer bytes.  Keys sorted, runs rounded up to 4 bytes."""
    runs: dict = {}
    size: dict = {}
    for key in sorted(groups):
        off = size.get(key[:2], 0)
        merged: list[list[int]] = []
        for lo, hi in sorted(set(groups[key])):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        runs[key] = []
        for lo, hi in merged:
            runs[key].append((lo, hi, off))
            off = (off + (hi - lo) * (key[3] - key[2]) * elem + 3) & ~3
        size[key[:2]] = off
    return runs, size


def ref_moves(prog: Program, label: str, src: Layout, src_locs: list, dst: Layout,
              dst_locs: list, elem: int, segments: tuple, skip: set
              ) -> tuple[list[Vertex], list[Transfer], list[Vertex]]:
    ps = ref_pieces(src, dst, segments, skip)
    pg: dict = {}
    lg: dict = {}
    for scell, rep, a0, a1, b0, b1, cell, k, rr0, _cc0 in ps:
        if a1 - a0 > 1 and b1 - b0 != src.rect(*divmod(scell, src.nc))[3] - \
                src.rect(*divmod(scell, src.nc))[2]:
            pg.setdefault((scell, rep, b0, b1), []).append((a0, a1))
        d_r0, _, d_c0, d_c1 = dst.rect(*divmod(cell, dst.nc))
        if a1 - a0 > 1 and b1 - b0 != d_c1 - d_c0:
            lg.setdefault((cell, k, _cc0, _cc0 + b1 - b0), []).append((rr0, rr0 + a1 - a0))
    pruns, psize = ref_panels(pg, elem)
    lruns, lsize = ref_panels(lg, elem)
    pbuf = {o: prog.new_buf(src.owners[o[0]][o[1]], n, "scratch", f"{label}:pack{o[0]}.{o[1]}")
            for o, n in sorted(psize.items())}
    lbuf = {o: prog.new_buf(dst.owners[o[0]][o[1]], n, "exchange-landing",
                            f"{label}:land{o[0]}.{o[1]}") for o, n in sorted(lsize.items())}
    pack, unpack, transfers = [], [], []
    for (c, r, c0, c1), rs in sorted(pruns.items()):
        r0, _, s_c0, s_c1 = src.rect(*divmod(c, src.nc))
        ld, w = (s_c1 - s_c0) * elem, (c1 - c0) * elem
        for lo, hi, off in rs:
            pack.append(vertex(src.owners[c][r], abi.COPY, {1: ld, 3: w, 4: hi - lo, 5: w},
                               {0: src_locs[c][r]}, {2: (pbuf[c, r], 0, 0, ())},
                               {0: (lo - r0) * ld + (c0 - s_c0) * elem, 2: off}))
    for (c, r, c0, c1), rs in sorted(lruns.items()):
        r0, _, d_c0, d_c1 = dst.rect(*divmod(c, dst.nc))
        ld, w = (d_c1 - d_c0) * elem, (c1 - c0) * elem
        for lo, hi, off in rs:
            unpack.append(vertex(dst.owners[c][r], abi.COPY, {1: w, 3: ld, 4: hi - lo, 5: w},
                                 {0: (lbuf[c, r], 0, 0, ())}, {2: dst_locs[c][r]},
                                 {0: off, 2: (lo - r0) * ld + (c0 - d_c0) * elem}))

    def at(runs: list, row: int, w: int) -> int:
        return next(off + (row - lo) * w for lo, hi, off in runs if lo <= row < hi)

    for scell, rep, a0, a1, b0, b1, cell, k, rr0, cc0 in ps:
        s_r0, _, s_c0, s_c1 = src.rect(*divmod(scell, src.nc))
        d_r0, _, d_c0, d_c1 = dst.rect(*divmod(cell, dst.nc))
        w, rows = (b1 - b0) * elem, a1 - a0
        if rows > 1 and (scell, rep, b0, b1) in pruns:
            s = ref(0, (pbuf[scell, rep], 0, 0, ()), at(pruns[scell, rep, b0, b1], a0, w))
        else:
            s = ref(0, src_locs[scell][rep], (a0 - s_r0) * (s_c1 - s_c0) * elem
                    + (b0 - s_c0) * elem)
        if rows > 1 and (cell, k, cc0, cc0 + b1 - b0) in lruns:
            d = ref(1, (lbuf[cell, k], 0, 0, ()), at(lruns[cell, k, cc0, cc0 + b1 - b0], rr0, w))
        else:
            d = ref(1, dst_locs[cell][k], (rr0 - d_r0) * (d_c1 - d_c0) * elem
                    + (cc0 - d_c0) * elem)
        transfers += _aligned(s, d, rows * w)
    return pack, transfers, unpack


# ------------------------------------------------------------ random cases


def _cuts(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    if rng.random() < 0.4:
        return even_cuts(n, int(rng.integers(1, n + 1)))
    if n == 1:
        return (0, 1)
    inner = rng.choice(np.arange(1, n), size=int(rng.integers(0, n)), replace=False)
    return (0, *sorted(int(c) for c in inner), n)


def _layout(rng: np.random.Generator, rows: int, cols: int, tiles: int) -> Layout:
    rc, cc = _cuts(rng, rows), _cuts(rng, cols)
    reps = int(rng.integers(1, min(3, tiles) + 1))
    owners = tuple(tuple(int(t) for t in rng.choice(tiles, size=int(rng.integers(1, reps + 1)),
                                                      replace=False))
                   for _ in range((len(rc) - 1) * (len(cc) - 1)))
    return Layout(rows, cols, rc, cc, owners)


def _locs(rng: np.random.Generator, lay: Layout, first_buf: int, seq: bool) -> list[list[Loc]]:
    out: list[list[Loc]] = []
    buf = first_buf
    for owners in lay.owners:
        cell: list[Loc] = []
        for _ in owners:
            buf += 1
            off = int(rng.choice([0, 8, int(rng.integers(0, 64))]))
            if seq and rng.random() < 0.3:
                cell.append((buf, 0, 0, ((buf, off), (buf + 1000, int(rng.integers(0, 9))))))
            else:
                stride = int(rng.choice([0, 0, 64, int(rng.integers(1, 40))]))
                cell.append((buf, off, stride, ()))
        out.append(cell)
    return out


def _segments(rng: np.random.Generator, src: Layout, dst: Layout) -> tuple:
    if rng.random() < 0.3 and (src.rows, src.cols) == (dst.rows, dst.cols):
        return ((0, dst.rows, 0, 0, 0, dst.cols),)
    segs = []
    for _ in range(int(rng.integers(1, 4))):
        nrows = int(rng.integers(1, min(src.rows, dst.rows) + 1))
        ncols = int(rng.integers(1, min(src.cols, dst.cols) + 1))
        dr0 = int(rng.integers(0, dst.rows - nrows + 1))
        dc0 = int(rng.integers(0, dst.cols - ncols + 1))
        sr0 = int(rng.integers(0, src.rows - nrows + 1))
        sc0 = int(rng.integers(0, src.cols - ncols + 1))
        segs.append((dr0, dr0 + nrows, dc0, sr0, sc0, ncols))
    return tuple(segs)


def _case(seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    tiles = int(rng.integers(2, 7))
    rows, cols = int(rng.integers(1, 13)), int(rng.integers(1, 11))
    src = _layout(rng, rows, cols, tiles)
    if rng.random() < 0.5:
        dst = _layout(rng, rows, cols, tiles)
    else:
        dst = _layout(rng, int(rng.integers(1, 13)), int(rng.integers(1, 11)), tiles)
    seq = seed % 4 == 0
    src_locs = _locs(rng, src, 10, seq)
    dst_locs = _locs(rng, dst, 500, seq)
    skip = {(c, k) for c, o in enumerate(dst.owners) for k in range(len(o)) if rng.random() < 0.2}
    elem = int(rng.choice([1, 2, 4]))
    return src, src_locs, dst, dst_locs, elem, _segments(rng, src, dst), skip


def _columns(x: Xfers) -> tuple:
    return tuple(getattr(x, c).tolist() for c in ("src_buf", "src_off", "src_stride", "dst_buf",
                                                   "dst_off", "dst_stride", "nbytes")) + (x.seq,)


@pytest.mark.parametrize("seed", range(300))
def test_moves_match_reference(seed: int) -> None:
    src, src_locs, dst, dst_locs, elem, segs, skip = _case(seed)
    ps = pieces(src, dst, segs, skip)
    assert ps.shape == (len(PIECE_COLUMNS), len(ref_pieces(src, dst, segs, skip)))
    assert [tuple(p) for p in ps.T.tolist()] == ref_pieces(src, dst, segs, skip)
    got_prog, want_prog = Program(), Program()
    for p in (got_prog, want_prog):
        p.new_buf(0, 8, "scratch", "first")
    got = moves(got_prog, "m", src, src_locs, dst, dst_locs, elem, segs, skip)
    pack, transfers, unpack = ref_moves(want_prog, "m", src, src_locs, dst, dst_locs, elem,
                                        segs, skip)
    assert got_prog.bufs == want_prog.bufs
    assert got.pack == pack
    assert got.unpack == unpack
    assert _columns(got.transfers) == _columns(Xfers.of(transfers))


def test_reference_cases_cover_every_path() -> None:
    """The random cases exercise packing, landing, replication, skips, split
    transfers and seq rows (so the comparison above means something)."""
    seen = {"pack": 0, "unpack": 0, "split": 0, "seq": 0, "rep": 0, "skip": 0}
    for seed in range(300):
        src, src_locs, dst, dst_locs, elem, segs, skip = _case(seed)
        mv = moves(Program(), "m", src, src_locs, dst, dst_locs, elem, segs, skip)
        ps = pieces(src, dst, segs, skip)
        seen["pack"] += len(mv.pack)
        seen["unpack"] += len(mv.unpack)
        seen["split"] += len(mv.transfers) > ps.shape[1]
        seen["seq"] += len(mv.transfers.seq)
        seen["rep"] += int((ps[1] > 0).sum())
        seen["skip"] += len(skip) > 0 and ps.shape[1] > 0
    assert all(n > 0 for n in seen.values()), seen


def test_full_width_rows_move_as_one_transfer_each() -> None:
    """Row blocks → other row blocks: one transfer per overlap, no COPYs;
    a replica on the tile holding the source takes that replica."""
    src = Layout(6, 4, (0, 3, 6), (0, 4), ((1,), (2,)))
    dst = Layout(6, 4, (0, 2, 6), (0, 4), ((2,), (1, 2)))
    locs_s: list[list[Loc]] = [[(10, 0, 0, ())], [(11, 0, 0, ())]]
    locs_d: list[list[Loc]] = [[(20, 0, 0, ())], [(21, 0, 0, ()), (22, 0, 0, ())]]
    mv = moves(Program(), "m", src, locs_s, dst, locs_d, 2, ((0, 6, 0, 0, 0, 4),), set())
    assert mv.pack == [] and mv.unpack == []
    # dst cell 0 rows 0-1 from src 0; dst cell 1 rows 2 (src 0) and 3-5 (src 1), 2 replicas
    assert mv.transfers.src_buf.tolist() == [10, 10, 10, 11, 11]
    assert mv.transfers.src_off.tolist() == [0, 16, 16, 0, 0]
    assert mv.transfers.dst_buf.tolist() == [20, 21, 22, 21, 22]
    assert mv.transfers.dst_off.tolist() == [0, 0, 0, 8, 8]
    assert mv.transfers.nbytes.tolist() == [16, 8, 8, 24, 24]
    assert pieces(src, dst, ((0, 6, 0, 0, 0, 4),), set())[1].tolist() == [0, 0, 0, 0, 0]


def test_column_piece_is_packed_once_for_every_replica() -> None:
    """A 3-row column slice of a 4-wide source cell going to two replicas:
    one pack COPY into a 3 × 2 panel, two transfers from it."""
    src = Layout(3, 4, (0, 3), (0, 4), ((0,),))
    dst = Layout(3, 2, (0, 3), (0, 2), ((1, 2),))
    prog = Program()
    mv = moves(prog, "m", src, [[(5, 0, 0, ())]], dst, [[(6, 0, 0, ()), (7, 0, 0, ())]], 2,
               ((0, 3, 0, 0, 2, 2),), set())
    assert [b.name for b in prog.bufs] == ["m:pack0.0"] and prog.bufs[0].nbytes == 12
    assert len(mv.pack) == 1 and mv.unpack == []
    assert mv.pack[0].args[:6] == (0, 8, 0, 4, 3, 4)
    assert [(r.arg, r.buf, r.offset) for r in mv.pack[0].refs] == [(0, 5, 4), (2, 0, 0)]
    assert mv.transfers.src_buf.tolist() == [0, 0]
    assert mv.transfers.dst_buf.tolist() == [6, 7]
    assert mv.transfers.nbytes.tolist() == [12, 12]


def test_unaligned_endpoint_splits_off_a_head() -> None:
    """6 bytes from offset 2: granule 2 for both, one transfer; 4 bytes from
    offset 2 (granule 4 > 2): a 2-byte head, then 2 bytes."""
    src = Layout(1, 8, (0, 1), (0, 8), ((0,),))
    dst = Layout(1, 8, (0, 1), (0, 8), ((1,),))
    one = moves(Program(), "m", src, [[(5, 0, 0, ())]], dst, [[(6, 0, 0, ())]], 1,
                ((0, 1, 0, 0, 2, 6),), set())
    assert one.transfers.nbytes.tolist() == [6]
    two = moves(Program(), "m", src, [[(5, 0, 0, ())]], dst, [[(6, 0, 0, ())]], 1,
                ((0, 1, 0, 0, 2, 4), (0, 1, 4, 0, 0, 4)), set())
    assert two.transfers.nbytes.tolist() == [2, 2, 4]
    assert two.transfers.src_off.tolist() == [2, 4, 0]
    assert two.transfers.dst_off.tolist() == [0, 2, 4]


def test_granule_of_matches_granule() -> None:
    xs = np.arange(-70, 70, dtype=np.int64)
    assert _granule_of(xs).tolist() == [_granule(int(x)) if x else 4 for x in xs]


def test_copies_build_what_vertex_builds() -> None:
    """The direct COPY construction equals `handprog.dict_vertex`, also when
    the cell location has a seq."""
    src = Layout(4, 4, (0, 4), (0, 4), ((3,),))
    dst = Layout(4, 2, (0, 4), (0, 2), ((1,),))
    seq_loc: Loc = (5, 0, 0, ((5, 0), (9, 0)))
    mv = moves(Program(), "m", dst, [[seq_loc]], src, [[(7, 4, 0, ())]], 2,
               ((0, 4, 1, 0, 0, 2),), set())
    want = vertex(3, abi.COPY, {1: 4, 3: 8, 4: 4, 5: 4}, {0: (0, 0, 0, ())}, {2: (7, 4, 0, ())},
                  {0: 0, 2: 2})
    assert mv.unpack == [want]
    assert mv.transfers.seq == ((0, ((5, 0), (9, 0)), ()),)


def test_span_is_layout_row_span() -> None:
    """The jitted bisection equals `Layout.row_span` (clipped searchsorted),
    empty and out-of-range intervals included."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        cuts = _cuts(rng, n)
        lay = Layout(n, 1, cuts, (0, 1), tuple((0,) for _ in cuts[1:]))
        lo = int(rng.integers(-1, n + 2))
        hi = int(rng.integers(lo, n + 3))
        span = lay.row_span(lo, hi)
        assert _span(np.asarray(cuts, dtype=np.int64), lo, hi) == (span.start, span.stop)
