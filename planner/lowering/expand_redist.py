"""Redistribution: move a distributed value into another layout as transfers.

A value's cell is stored contiguously row-major (row stride = cell width ×
element bytes) at a `Loc`.  Moving a rectangle between two cells is

- one transfer of `rows × width` bytes when the rectangle spans the full width
  of both the source and the destination cell (rows are then contiguous on
  both sides: every row-block → row-block move), and
- otherwise (column slicing: SplitHeads, MergeHeads, a K-sliced matmul
  operand, a column-blocked matmul result going back to row blocks) the
  piece is made contiguous with local COPY vertices: packed on the source
  tile into column panels of a scratch buffer (one COPY per run of
  consecutive rows of one column range, shared by every replica the piece
  goes to) and/or landed in column panels on the destination tile and
  unpacked into the cell the same way.  One transfer per piece instead of one per row
  keeps the exchange tables small (per-row transfers cost 2 table entries
  per row); single-row pieces move directly.

`segments` map destination coordinates to source coordinates; each segment
`(dr0, dr1, dc0, sr0, sc0, ncols)` says destination rows [dr0, dr1), columns
[dc0, dc0 + ncols) come from source rows [sr0, sr0 + dr1 - dr0), columns
[sc0, sc0 + ncols).  Replicated destination cells get one transfer each from
the same source bytes (a multicast: the simulator counts the bytes out once).
A destination replica on the tile that already holds the identical source
cell shares its storage instead (no transfer).

A move emits 10⁴–10⁶ transfers, so pieces, panel offsets and transfer rows
are computed over arrays: one jitted loop enumerates the pieces straight
into transfer columns (no per-piece arrays beyond the output: a move's
memory traffic is its cost), numpy lays out the panels of the few column
pieces and splits rows; only the COPY vertices and the rare endpoints with
a per-iteration `seq` (ping-pong loop carries) are built one object at a
time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from kernels import abi
from planner.decide.layout import Layout
from planner.lowering.program import NARGS, Program, Ref, Transfer, Vertex, Xfers
from tilecommon.jit import kjit
from tilecommon.search import bisect_left, bisect_right

# (buf, offset, iter_stride, seq): where a cell lives; seq for ping-pong carries
Loc = tuple[int, int, int, tuple[tuple[int, int], ...]]


def ref(arg: int, loc: Loc, extra: int = 0) -> Ref:
    """The address operand `arg` at `extra` bytes into the cell at `loc`."""
    seq = loc[3]
    if seq:
        return Ref(arg, seq[0][0], seq[0][1] + extra, 0,
                   tuple((b, o + extra) for b, o in seq))
    return Ref(arg, loc[0], loc[1] + extra, loc[2])


def loc_bufs(loc: Loc) -> tuple[int, ...]:
    if loc[3]:
        return tuple(sorted({b for b, _ in loc[3]}))
    return (loc[0],)


def shareable(src: Layout, dst: Layout, segments: tuple) -> bool:
    """True when dst cells equal src cells one to one (identity move)."""
    return (len(segments) == 1 and segments[0] == (0, dst.rows, 0, 0, 0, dst.cols)
            and src.row_cuts == dst.row_cuts and src.col_cuts == dst.col_cuts)


@dataclass
class Moves:
    """What one redistribution emits: COPY vertices packing column pieces on
    the source tiles, the transfers, COPY vertices unpacking on the
    destination tiles."""

    pack: list[Vertex] = field(default_factory=list)
    transfers: Xfers = field(default_factory=Xfers.empty)
    unpack: list[Vertex] = field(default_factory=list)


# columns of the piece array `pieces` returns
PIECE_COLUMNS = ("scell", "rep", "a0", "a1", "b0", "b1", "cell", "k", "row", "col")
# piece flags (`_enumerate`): the source / destination Loc has a seq; the
# piece is packed into a source panel / landed in a destination panel
SRC_SEQ, DST_SEQ, PACK, LAND = 1, 2, 4, 8


@dataclass(frozen=True)
class _Grid:
    """A layout's cells as int64 arrays: the cuts `rc`/`cc` and the owner
    tuples as CSR (replica j of cell c is tile `tiles[off[c] + j]`)."""

    rc: np.ndarray
    cc: np.ndarray
    off: np.ndarray
    tiles: np.ndarray

    @staticmethod
    def of(lay: Layout) -> _Grid:
        sizes = np.fromiter(map(len, lay.owners), dtype=np.int64, count=len(lay.owners))
        off = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=off[1:])
        tiles = np.fromiter(chain.from_iterable(lay.owners), dtype=np.int64, count=int(off[-1]))
        return _Grid(np.asarray(lay.row_cuts, dtype=np.int64),
                     np.asarray(lay.col_cuts, dtype=np.int64), off, tiles)

    def loc_columns(self, locs: list[list[Loc]]) -> tuple[list[Loc], np.ndarray, np.ndarray]:
        """The Locs of every cell replica flat (owner CSR order), their
        (buffer, offset, iter_stride) as int64 [3, n], and which have a seq."""
        flat = list(chain.from_iterable(locs))
        assert len(flat) == self.off[-1], "one Loc per cell replica"
        if not flat:
            return flat, np.zeros((3, 0), dtype=np.int64), np.zeros(0, dtype=np.bool_)
        bufs, offs, strides, seqs = zip(*flat, strict=True)
        has_seq = np.fromiter(map(bool, seqs), np.bool_, len(flat)) if any(seqs) \
            else np.zeros(len(flat), dtype=np.bool_)
        return flat, np.array((bufs, offs, strides), dtype=np.int64), has_seq


@dataclass
class _Enumerated:
    """What `_enumerate` fills (`moves` then edits the panel pieces): per
    piece i its transfer `xf[:, i]` (source buffer, offset, iter stride,
    destination buffer, offset, iter stride, bytes), flags (SRC_SEQ |
    DST_SEQ | PACK | LAND) and `_aligned` head (the first of two rows'
    bytes, 0 for one row); `ps` int64 [11, m]: the PIECE_COLUMNS and index
    of the listed pieces (every piece, or those with a flag)."""

    xf: np.ndarray
    flags: np.ndarray
    head: np.ndarray
    ps: np.ndarray

    def to_panel(self, rows: np.ndarray, side: int, bufs: np.ndarray, at: np.ndarray) -> None:
        """Pieces `rows` move from (`side` 0) or to (3) panel buffers `bufs`
        at offsets `at` instead of their cell: new endpoints, no seq there,
        heads again."""
        xf = self.xf
        xf[side, rows], xf[side + 1, rows], xf[side + 2, rows] = bufs, at, 0
        self.flags[rows] &= ~np.uint8(SRC_SEQ if side == 0 else DST_SEQ)
        a = _granule_of(xf[1, rows] | xf[2, rows] | xf[4, rows] | xf[5, rows])
        self.head[rows] = np.where((_granule_of(xf[6, rows]) > a) & (xf[6, rows] > a), a, 0)


def _enumerated(src: _Grid, dst: _Grid, segments: tuple, skip: set[tuple[int, int]],
                slocs: np.ndarray, sseq: np.ndarray, dlocs: np.ndarray, dseq: np.ndarray,
                elem: int, every: bool, row_moves: int = 0) -> _Enumerated:
    """Count, allocate, fill (`_enumerate`); `every`: list every piece in `ps`;
    pieces of at most `row_moves` rows that would be packed or landed move row
    by row instead (one transfer per row, nothing listed)."""
    todo = np.ones(dst.tiles.size, dtype=np.bool_)
    for cell, k in skip:
        todo[dst.off[cell] + k] = False
    segs = np.asarray(segments, dtype=np.int64).reshape(-1, 6)
    args = (segs, dst.rc, dst.cc, dst.off, dst.tiles, todo, src.rc, src.cc, src.off, src.tiles,
            slocs, sseq, dlocs, dseq, elem, every, row_moves)
    n, m = _enumerate(*args, np.empty((7, 0), dtype=np.int64), np.empty(0, dtype=np.uint8),
                      np.empty(0, dtype=np.uint8), np.empty((11, 0), dtype=np.int64))
    out = _Enumerated(np.empty((7, n), dtype=np.int64), np.empty(n, dtype=np.uint8),
                      np.empty(n, dtype=np.uint8), np.empty((11, m), dtype=np.int64))
    _enumerate(*args, out.xf, out.flags, out.head, out.ps)
    return out


def pieces(src: Layout, dst: Layout, segments: tuple,
           skip: set[tuple[int, int]]) -> np.ndarray:
    """Every source rectangle (in source coordinates) that lands in a
    destination cell replica, with its top-left destination coordinates:
    int64 [10, n], one row per field of `PIECE_COLUMNS` = (source cell,
    source replica (the one on the destination tile, else 0), source rows
    [a0, a1), source columns [b0, b1), destination cell, destination
    replica, destination row, destination column), ordered by segment,
    destination row cell, column cell, source row cell, column cell,
    destination replica."""
    sg, dg = _Grid.of(src), _Grid.of(dst)
    ns, nd = int(sg.off[-1]), int(dg.off[-1])
    return _enumerated(sg, dg, segments, skip, np.zeros((3, ns), dtype=np.int64),
                       np.zeros(ns, dtype=np.bool_), np.zeros((3, nd), dtype=np.int64),
                       np.zeros(nd, dtype=np.bool_), 1, True).ps[:10]


@kjit
def _enumerate(segs, d_rc, d_cc, doff, dtile, todo, s_rc, s_cc, soff, stile, slocs, sseq,
               dlocs, dseq, elem, every, row_moves, xf, flags, head,
               ps):  # pragma: no cover - jitted
    """Enumerate the pieces in `pieces` order and fill `_Enumerated`'s
    arrays while they fit (call with empty ones to count); return (pieces,
    listed pieces).  `slocs`/`dlocs` are the cell replicas' (buffer,
    offset, stride) rows, `sseq`/`dseq` which of them have a seq."""
    n = 0
    m = 0
    dnc, snc = d_cc.shape[0] - 1, s_cc.shape[0] - 1
    for g in range(segs.shape[0]):
        dr0, dr1, dc0, sr0, sc0, ncols = segs[g]
        ri0, ri1 = _span(d_rc, dr0, dr1)
        ci0, ci1 = _span(d_cc, dc0, dc0 + ncols)
        for ri in range(ri0, ri1):
            for ci in range(ci0, ci1):
                cell = ri * dnc + ci
                if not todo[doff[cell]:doff[cell + 1]].any():
                    continue
                r_lo, r_hi = max(d_rc[ri], dr0), min(d_rc[ri + 1], dr1)
                c_lo, c_hi = max(d_cc[ci], dc0), min(d_cc[ci + 1], dc0 + ncols)
                d_w = d_cc[ci + 1] - d_cc[ci]
                if r_lo >= r_hi or c_lo >= c_hi:
                    continue
                s_lo, s_hi = r_lo - dr0 + sr0, r_hi - dr0 + sr0
                t_lo, t_hi = c_lo - dc0 + sc0, c_hi - dc0 + sc0
                sri0, sri1 = _span(s_rc, s_lo, s_hi)
                sci0, sci1 = _span(s_cc, t_lo, t_hi)
                for sri in range(sri0, sri1):
                    a0, a1 = max(s_rc[sri], s_lo), min(s_rc[sri + 1], s_hi)
                    if a0 >= a1:
                        continue
                    for sci in range(sci0, sci1):
                        b0, b1 = max(s_cc[sci], t_lo), min(s_cc[sci + 1], t_hi)
                        if b0 >= b1:
                            continue
                        s_w = s_cc[sci + 1] - s_cc[sci]
                        scell = sri * snc + sci
                        row, col = a0 - sr0 + dr0, b0 - sc0 + dc0
                        s_at = ((a0 - s_rc[sri]) * s_w + b0 - s_cc[sci]) * elem
                        d_at = ((row - d_rc[ri]) * d_w + col - d_cc[ci]) * elem
                        f = 0
                        if a1 - a0 > 1 and b1 - b0 != s_w:
                            f |= PACK
                        if a1 - a0 > 1 and b1 - b0 != d_w:
                            f |= LAND
                        for kk in range(doff[cell], doff[cell + 1]):
                            if not todo[kk]:
                                continue
                            rep = 0
                            for j in range(soff[scell], soff[scell + 1]):
                                if stile[j] == dtile[kk]:
                                    rep = j - soff[scell]
                                    break
                            sj = soff[scell] + rep
                            ff = f | (SRC_SEQ if sseq[sj] else 0) | (DST_SEQ if dseq[kk] else 0)
                            if (ff & (PACK | LAND)) != 0 and (ff & (SRC_SEQ | DST_SEQ)) == 0 \
                                    and a1 - a0 <= row_moves:
                                for r in range(a1 - a0):  # row by row: no COPY either side
                                    if n < xf.shape[1]:
                                        x = xf[:, n]
                                        x[0] = slocs[0, sj]
                                        x[1] = slocs[1, sj] + s_at + r * s_w * elem
                                        x[2] = slocs[2, sj]
                                        x[3] = dlocs[0, kk]
                                        x[4] = dlocs[1, kk] + d_at + r * d_w * elem
                                        x[5] = dlocs[2, kk]
                                        x[6] = (b1 - b0) * elem
                                        flags[n] = 0
                                        head[n] = _head(x[1] | x[2] | x[4] | x[5], x[6])
                                    n += 1
                                continue
                            if n < xf.shape[1]:
                                x = xf[:, n]
                                x[0], x[1], x[2] = slocs[0, sj], slocs[1, sj] + s_at, slocs[2, sj]
                                x[3], x[4], x[5] = dlocs[0, kk], dlocs[1, kk] + d_at, dlocs[2, kk]
                                x[6] = (a1 - a0) * (b1 - b0) * elem
                                flags[n] = ff
                                head[n] = _head(x[1] | x[2] | x[4] | x[5], x[6])
                            if (every or ff) and m < ps.shape[1]:
                                p = ps[:, m]
                                p[0], p[1], p[2], p[3], p[4], p[5] = scell, rep, a0, a1, b0, b1
                                p[6], p[7], p[8], p[9], p[10] = cell, kk - doff[cell], row, col, n
                            m += 1 if every or ff else 0
                            n += 1
    return n, m


@kjit
def _span(cuts, lo, hi):  # pragma: no cover - jitted
    """(first, last + 1) of the cells of `cuts` overlapping [lo, hi), as
    `Layout.row_span` computes them (bisect right of lo, bisect left of hi)."""
    n = cuts.shape[0]
    first = max(bisect_right(cuts, 0, n, lo) - 1, 0)
    return first, min(bisect_left(cuts, 0, n, hi), n - 1)


@kjit
def _head(addr_bits, nbytes):  # pragma: no cover - jitted
    """`_aligned`'s head for endpoints whose offsets and strides OR to
    `addr_bits`: their common granule when it is below the size's, else 0."""
    a = (addr_bits | 4) & -(addr_bits | 4)
    g = (nbytes | 4) & -(nbytes | 4)
    return a if g > a and nbytes > a else 0


@dataclass(frozen=True)
class _Panels:
    """Column panels of one side of a move (see `_panels`)."""

    runs: np.ndarray      # int64 [r, 7]: cell, replica, c0, c1, lo, hi, byte offset
    run_owner: np.ndarray  # int64 [r]: each run's owner's index in `owners`
    owners: np.ndarray    # int64 [o, 3]: cell, replica, buffer bytes
    owner_of: np.ndarray  # int64 [m]: per entry, its owner's index in `owners`
    at: np.ndarray        # int64 [m]: per entry, byte offset of its row `lo`


def _panels(keys: np.ndarray, elem: int) -> _Panels:
    """Lay out column panels.  `keys` int64 [m, 6] = (cell, replica, c0, c1,
    lo, hi): entry i needs rows [lo, hi) of columns [c0, c1) of that cell
    replica in a panel.  Per group (cell, replica, c0, c1) the maximal runs of
    consecutive rows are placed one after another (each rounded up to 4
    bytes) in the owner's (cell, replica) buffer; groups are visited sorted,
    so offsets are deterministic."""
    order = np.lexsort(keys.T[::-1])
    s = keys[order]
    m = s.shape[0]
    new_group = np.ones(m, dtype=np.bool_)
    new_group[1:] = (s[1:, :4] != s[:-1, :4]).any(axis=1)
    gid = np.cumsum(new_group) - 1
    big = int(s[:, 5].max()) + 1
    # per group running max of `hi`: groups are contiguous and gid·big
    # exceeds every hi of an earlier group
    reach = np.maximum.accumulate(gid * big + s[:, 5]) - gid * big
    new_run = new_group.copy()
    new_run[1:] |= s[1:, 4] > reach[:-1]
    starts = np.flatnonzero(new_run)
    run_of = np.cumsum(new_run) - 1
    lo = s[starts, 4]
    hi = np.maximum.reduceat(s[:, 5], starts)
    width = (s[starts, 3] - s[starts, 2]) * elem
    nbytes = ((hi - lo) * width + 3) & ~3
    new_owner = np.ones(starts.size, dtype=np.bool_)
    new_owner[1:] = (s[starts[1:], :2] != s[starts[:-1], :2]).any(axis=1)
    ostarts = np.flatnonzero(new_owner)
    run_owner = np.cumsum(new_owner) - 1
    before = np.cumsum(nbytes) - nbytes
    off = before - before[ostarts][run_owner]
    runs = np.column_stack([s[starts, :4], lo, hi, off])
    owners = np.column_stack([s[starts[ostarts], :2], np.add.reduceat(nbytes, ostarts)])
    owner_of = np.empty(m, dtype=np.int64)
    at = np.empty(m, dtype=np.int64)
    owner_of[order] = run_owner[run_of]
    at[order] = off[run_of] + (s[:, 4] - lo[run_of]) * width[run_of]
    return _Panels(runs, run_owner, owners, owner_of, at)


def moves(prog: Program, label: str, src: Layout, src_locs: list[list[Loc]], dst: Layout,
          dst_locs: list[list[Loc]], elem: int, segments: tuple,
          skip: set[tuple[int, int]], row_moves: int = 0) -> Moves:
    """Pack/transfer/unpack work filling every destination replica except the
    `(cell, replica)` pairs in `skip` (which share storage).

    A multi-row piece narrower than its source cell is packed into a column
    panel of the source replica's pack buffer (one COPY per run of
    consecutive rows of one column range); one narrower than its destination
    cell lands in a column panel of a landing buffer and is unpacked the same
    way, unless it has at most `row_moves` rows (`Plan.row_moves`): then it
    moves row by row, one transfer per row and no COPY.  Each piece is then
    one contiguous transfer (split in two as `_aligned` says), in `pieces`
    order."""
    sg, dg = _Grid.of(src), _Grid.of(dst)
    sflat, slocs, sseq = sg.loc_columns(src_locs)
    dflat, dlocs, dseq = dg.loc_columns(dst_locs)
    en = _enumerated(sg, dg, segments, skip, slocs, sseq, dlocs, dseq, elem, False, row_moves)
    res = Moves()
    if not en.flags.size:
        return res
    listed = en.flags[en.ps[10]]
    pk, ld = en.ps[:, (listed & PACK) != 0], en.ps[:, (listed & LAND) != 0]
    pp = _panels(np.stack([pk[0], pk[1], pk[4], pk[5], pk[2], pk[3]], axis=1), elem) \
        if pk.size else None
    lp = _panels(np.stack([ld[6], ld[7], ld[9], ld[9] + ld[5] - ld[4], ld[8],
                           ld[8] + ld[3] - ld[2]], axis=1), elem) if ld.size else None
    pack_bufs = [prog.new_buf(src.owners[c][r], size, "scratch", f"{label}:pack{c}.{r}")
                 for c, r, size in (pp.owners.tolist() if pp else [])]
    land_bufs = [prog.new_buf(dst.owners[c][r], size, "exchange-landing", f"{label}:land{c}.{r}")
                 for c, r, size in (lp.owners.tolist() if lp else [])]
    if pp:
        res.pack = _copies(src, src_locs, pp, pack_bufs, elem, into_panel=True)
        en.to_panel(pk[10], 0, np.asarray(pack_bufs, np.int64)[pp.owner_of], pp.at)
    if lp:
        res.unpack = _copies(dst, dst_locs, lp, land_bufs, elem, into_panel=False)
        en.to_panel(ld[10], 3, np.asarray(land_bufs, np.int64)[lp.owner_of], lp.at)
    slow = {}  # pieces with a seq endpoint: exactly as `ref` and `_aligned` make them
    for p in en.ps[:, (en.flags[en.ps[10]] & (SRC_SEQ | DST_SEQ)) != 0].T.tolist():
        i, f = p[10], int(en.flags[p[10]])
        ends = en.xf[:6, i].tolist()
        sloc = sflat[sg.off[p[0]] + p[1]] if f & SRC_SEQ else None
        dloc = dflat[dg.off[p[6]] + p[7]] if f & DST_SEQ else None
        slow[i] = _aligned(ref(0, sloc, ends[1] - sloc[1]) if sloc else Ref(0, *ends[:3]),
                           ref(1, dloc, ends[4] - dloc[1]) if dloc else Ref(1, *ends[3:]),
                           int(en.xf[6, i]))
    res.transfers = _rows(en.xf, en.head, slow)
    return res


def _copies(lay: Layout, locs: list[list[Loc]], panels: _Panels, bufs: list[int], elem: int,
            into_panel: bool) -> list[Vertex]:
    """One COPY per panel run between the cell replica and its panel buffer
    (`bufs[owner]`): cell → panel when `into_panel` (pack), else panel →
    cell (unpack).  Built directly, without the generic operand handling of
    `expand_ops.make_vertex` (a test compares with the obvious twin): a move
    may need 10⁴."""
    runs = panels.runs
    rc, cc = np.asarray(lay.row_cuts, dtype=np.int64), np.asarray(lay.col_cuts, dtype=np.int64)
    ri, ci = np.divmod(runs[:, 0], lay.nc)
    ld = (cc[ci + 1] - cc[ci]) * elem
    at = (runs[:, 4] - rc[ri]) * ld + (runs[:, 2] - cc[ci]) * elem
    cols = (runs[:, 0], runs[:, 1], ld, (runs[:, 3] - runs[:, 2]) * elem, runs[:, 5] - runs[:, 4],
            at, panels.run_owner, runs[:, 6])
    out = []
    cp = abi.ARGS.COPY
    assert cp[:6] == tuple(range(6)) and len(cp) == 6, "COPY args: src lds dst ldd rows bytes"
    pad = (0,) * (NARGS - len(cp))
    cell_arg = cp.src if into_panel else cp.dst
    for c, r, ld_, pw, n, at_, o, off in zip(*(x.tolist() for x in cols), strict=True):
        cell, panel = locs[c][r], bufs[o]
        cref = ref(cell_arg, cell, at_)
        # (src, lds, dst, ldd, rows, row_bytes): address slots 0, filled by link
        if into_panel:
            out.append(Vertex(lay.owners[c][r], abi.COPY, (0, ld_, 0, pw, n, pw) + pad,
                              (cref, Ref(cp.dst, panel, off)), loc_bufs(cell), (panel,)))
        else:
            out.append(Vertex(lay.owners[c][r], abi.COPY, (0, pw, 0, ld_, n, pw) + pad,
                              (Ref(cp.src, panel, off), cref), (panel,), loc_bufs(cell)))
    return out


def _granule_of(x: np.ndarray) -> np.ndarray:
    """`_granule` elementwise (4 for 0); of an OR of offsets, the least of
    theirs: the lowest set bit of x | 4."""
    x = x | 4
    return x & -x


def _rows(xf: np.ndarray, head: np.ndarray, slow: dict[int, list[Transfer]]) -> Xfers:
    """The transfer rows of every piece in order: `xf[:, i]` as one row, or
    two (a head of `head[i]` bytes, then the rest) when `head[i]` is not 0,
    or the `slow[i]` Transfers (pieces with a seq endpoint)."""
    if not slow and not head.any():
        return Xfers.columns(xf[0], xf[1], xf[3], xf[4], xf[6], xf[2], xf[5])
    a = head.astype(np.int64)
    counts = 1 + (a > 0)
    for i, ts in slow.items():
        counts[i] = len(ts)
    first = np.cumsum(counts) - counts
    piece = np.repeat(np.arange(a.size), counts)
    second = np.arange(piece.size) - first[piece]
    shift = a[piece] * second
    nb = np.where(a[piece] > 0, np.where(second == 0, a[piece], xf[6, piece] - a[piece]),
                  xf[6, piece])
    cols = (xf[0, piece], xf[1, piece] + shift, xf[3, piece], xf[4, piece] + shift, nb,
            xf[2, piece], xf[5, piece])
    seq = []
    for i, ts in slow.items():
        for j, t in enumerate(ts):
            row = int(first[i]) + j
            for col, v in zip(cols, (t.src.buf, t.src.offset, t.dst.buf, t.dst.offset, t.nbytes,
                                     t.src.iter_stride, t.dst.iter_stride), strict=True):
                col[row] = v
            if t.src.seq or t.dst.seq:
                seq.append((row, t.src.seq, t.dst.seq))
    return Xfers.columns(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6],
                         tuple(seq))


def _granule(n: int) -> int:
    """Natural alignment the simulator demands of an n-byte access (≤ 4)."""
    return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1


def _shift(r: Ref, by: int) -> Ref:
    return Ref(r.arg, r.buf, r.offset + by, r.iter_stride,
               tuple((b, o + by) for b, o in r.seq))


def _aligned(src: Ref, dst: Ref, nbytes: int) -> list[Transfer]:
    """One transfer, or two when an endpoint address (at any iteration) is less
    aligned than the byte count's natural granule (buffers start 8-aligned):
    a head of `a` bytes (a = the endpoints' common alignment) then the rest,
    whose size then has granule ≤ a."""
    if not (src.offset | dst.offset | src.iter_stride | dst.iter_stride) % 4 \
            and not (src.seq or dst.seq):
        return [Transfer(src, dst, nbytes)]
    a = 4
    for r in (src, dst):  # every iteration's address: offset, stride, seq entries
        for o in (r.offset, r.iter_stride, *(o for _, o in r.seq)):
            a = min(a, _granule(o) if o else 4)
    if _granule(nbytes) <= a or nbytes <= a:
        return [Transfer(src, dst, nbytes)]
    return [Transfer(src, dst, a), Transfer(_shift(src, a), _shift(dst, a), nbytes - a)]
