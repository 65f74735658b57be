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
are computed over arrays (jitted loops enumerate the pieces and their
endpoints, numpy lays out panels and splits rows); only the COPY vertices
and the rare endpoints with a per-iteration `seq` (ping-pong loop carries)
are built one object at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from kernels import ids
from kernels.jit import kjit
from planner.layout import Layout
from planner.program import NARGS, Program, Ref, Transfer, Vertex, Xfers

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


@dataclass(frozen=True)
class _Grid:
    """A layout's cells as int64 arrays: the cuts `rc`/`cc`; the owner
    tuples as CSR (replica j of cell c is tile `tiles[off[c] + j]`); per
    cell its first row `r0`, first column `c0` and width `cw`."""

    rc: np.ndarray
    cc: np.ndarray
    off: np.ndarray
    tiles: np.ndarray
    r0: np.ndarray
    c0: np.ndarray
    cw: np.ndarray

    @staticmethod
    def of(lay: Layout) -> _Grid:
        rc = np.asarray(lay.row_cuts, dtype=np.int64)
        cc = np.asarray(lay.col_cuts, dtype=np.int64)
        sizes = np.fromiter(map(len, lay.owners), dtype=np.int64, count=len(lay.owners))
        off = np.zeros(sizes.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=off[1:])
        tiles = np.fromiter(chain.from_iterable(lay.owners), dtype=np.int64, count=int(off[-1]))
        return _Grid(rc, cc, off, tiles, np.repeat(rc[:-1], lay.nc), np.tile(cc[:-1], lay.nr),
                     np.tile(np.diff(cc), lay.nr))


def pieces(src: Layout, dst: Layout, segments: tuple,
           skip: set[tuple[int, int]]) -> np.ndarray:
    """Every source rectangle (in source coordinates) that lands in a
    destination cell replica, with its top-left destination coordinates:
    int64 [10, n], one row per field of `PIECE_COLUMNS` = (source cell, source replica
    (the one on the destination tile, else 0), source rows [a0, a1), source
    columns [b0, b1), destination cell, destination replica, destination row,
    destination column), ordered by segment, destination row cell, column
    cell, source row cell, column cell, destination replica."""
    return _grid_pieces(_Grid.of(src), _Grid.of(dst), segments, skip)


def _grid_pieces(src: _Grid, dst: _Grid, segments: tuple,
                 skip: set[tuple[int, int]]) -> np.ndarray:
    todo = np.ones(dst.tiles.size, dtype=np.bool_)
    for cell, k in skip:
        todo[dst.off[cell] + k] = False
    segs = np.asarray(segments, dtype=np.int64).reshape(-1, 6)
    args = (segs, dst.rc, dst.cc, dst.off, dst.tiles, todo, src.rc, src.cc, src.off, src.tiles)
    out = np.empty((len(PIECE_COLUMNS), 0), dtype=np.int64)
    n = _pieces(*args, out)
    out = np.empty((len(PIECE_COLUMNS), n), dtype=np.int64)
    _pieces(*args, out)
    return out


@kjit
def _pieces(segs, drc, dcc, doff, dtile, todo, src, scc, soff, stile,
            out):  # pragma: no cover - jitted
    """Fill `out` with the pieces (as `pieces` documents) while they fit;
    return how many there are (call with an empty `out` to count)."""
    n = 0
    dnr, dnc = drc.shape[0] - 1, dcc.shape[0] - 1
    snr, snc = src.shape[0] - 1, scc.shape[0] - 1
    for g in range(segs.shape[0]):
        dr0, dr1, dc0, sr0, sc0, ncols = segs[g]
        ri0 = max(np.searchsorted(drc, dr0, side="right") - 1, 0)
        ri1 = min(np.searchsorted(drc, dr1, side="left"), dnr)
        ci0 = max(np.searchsorted(dcc, dc0, side="right") - 1, 0)
        ci1 = min(np.searchsorted(dcc, dc0 + ncols, side="left"), dnc)
        for ri in range(ri0, ri1):
            for ci in range(ci0, ci1):
                cell = ri * dnc + ci
                if not todo[doff[cell]:doff[cell + 1]].any():
                    continue
                r_lo, r_hi = max(drc[ri], dr0), min(drc[ri + 1], dr1)
                c_lo, c_hi = max(dcc[ci], dc0), min(dcc[ci + 1], dc0 + ncols)
                if r_lo >= r_hi or c_lo >= c_hi:
                    continue
                s_lo, s_hi = r_lo - dr0 + sr0, r_hi - dr0 + sr0
                t_lo, t_hi = c_lo - dc0 + sc0, c_hi - dc0 + sc0
                sri0 = max(np.searchsorted(src, s_lo, side="right") - 1, 0)
                sri1 = min(np.searchsorted(src, s_hi, side="left"), snr)
                sci0 = max(np.searchsorted(scc, t_lo, side="right") - 1, 0)
                sci1 = min(np.searchsorted(scc, t_hi, side="left"), snc)
                for sri in range(sri0, sri1):
                    a0, a1 = max(src[sri], s_lo), min(src[sri + 1], s_hi)
                    if a0 >= a1:
                        continue
                    for sci in range(sci0, sci1):
                        b0, b1 = max(scc[sci], t_lo), min(scc[sci + 1], t_hi)
                        if b0 >= b1:
                            continue
                        scell = sri * snc + sci
                        for kk in range(doff[cell], doff[cell + 1]):
                            if not todo[kk]:
                                continue
                            rep = 0
                            for m in range(soff[scell], soff[scell + 1]):
                                if stile[m] == dtile[kk]:
                                    rep = m - soff[scell]
                                    break
                            if n < out.shape[1]:
                                out[0, n], out[1, n], out[2, n], out[3, n] = scell, rep, a0, a1
                                out[4, n], out[5, n], out[6, n] = b0, b1, cell
                                out[7, n], out[8, n] = kk - doff[cell], a0 - sr0 + dr0
                                out[9, n] = b0 - sc0 + dc0
                            n += 1
    return n


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
          skip: set[tuple[int, int]]) -> Moves:
    """Pack/transfer/unpack work filling every destination replica except the
    `(cell, replica)` pairs in `skip` (which share storage).

    A multi-row piece narrower than its source cell is packed into a column
    panel of the source replica's pack buffer (one COPY per run of
    consecutive rows of one column range); one narrower than its destination
    cell lands in a column panel of a landing buffer and is unpacked the same
    way.  Each piece is then one contiguous transfer (split in two as
    `_aligned` says), in `pieces` order."""
    sgrid, dgrid = _Grid.of(src), _Grid.of(dst)
    sc, rep, a0, a1, b0, b1, dc, k, rr0, cc0 = _grid_pieces(sgrid, dgrid, segments, skip)
    res = Moves()
    if not sc.size:
        return res
    w, rows = b1 - b0, a1 - a0
    src_end = _Ends.of(sgrid, src_locs, sc, rep, a0, b0, w, elem)
    dst_end = _Ends.of(dgrid, dst_locs, dc, k, rr0, cc0, w, elem)
    pk = np.flatnonzero((rows > 1) & src_end.narrow)
    ld = np.flatnonzero((rows > 1) & dst_end.narrow)
    pp = _panels(np.stack([sc[pk], rep[pk], b0[pk], b1[pk], a0[pk], a1[pk]], axis=1), elem) \
        if pk.size else None
    lp = _panels(np.stack([dc[ld], k[ld], cc0[ld], cc0[ld] + w[ld], rr0[ld], rr0[ld] + rows[ld]],
                          axis=1), elem) if ld.size else None
    pack_bufs = [prog.new_buf(src.owners[c][r], size, "scratch", f"{label}:pack{c}.{r}")
                 for c, r, size in (pp.owners.tolist() if pp else [])]
    land_bufs = [prog.new_buf(dst.owners[c][r], size, "exchange-landing", f"{label}:land{c}.{r}")
                 for c, r, size in (lp.owners.tolist() if lp else [])]
    if pp:
        res.pack = _copies(src, src_locs, pp, pack_bufs, elem, into_panel=True)
        src_end.panel(pk, np.asarray(pack_bufs, np.int64)[pp.owner_of], pp.at)
    if lp:
        res.unpack = _copies(dst, dst_locs, lp, land_bufs, elem, into_panel=False)
        dst_end.panel(ld, np.asarray(land_bufs, np.int64)[lp.owner_of], lp.at)
    res.transfers = _transfers(src_end, dst_end, rows * w * elem)
    return res


def _copies(lay: Layout, locs: list[list[Loc]], panels: _Panels, bufs: list[int], elem: int,
            into_panel: bool) -> list[Vertex]:
    """One COPY per panel run between the cell replica and its panel buffer
    (`bufs[owner]`): cell → panel when `into_panel` (pack), else panel →
    cell (unpack).  Built as `expand_ops.vertex` builds them (a test
    compares), without its generic dict handling: a move may need 10⁴."""
    out = []
    pad = (0,) * (NARGS - 6)
    for (c, r, c0, c1, lo, hi, off), o in zip(panels.runs.tolist(), panels.run_owner.tolist(),
                                              strict=True):
        r0, _, col0, col1 = lay.rect(c // lay.nc, c % lay.nc)
        ld, pw = (col1 - col0) * elem, (c1 - c0) * elem
        cell, at = locs[c][r], (lo - r0) * ld + (c0 - col0) * elem
        if into_panel:
            out.append(Vertex(lay.owners[c][r], ids.COPY, (0, ld, 0, pw, hi - lo, pw) + pad,
                              (ref(0, cell, at), Ref(2, bufs[o], off)),
                              loc_bufs(cell), (bufs[o],)))
        else:
            out.append(Vertex(lay.owners[c][r], ids.COPY, (0, pw, 0, ld, hi - lo, pw) + pad,
                              (Ref(0, bufs[o], off), ref(2, cell, at)),
                              (bufs[o],), loc_bufs(cell)))
    return out


@dataclass
class _Ends:
    """One side's endpoint of every piece: buffer, byte offset and iter
    stride (int64 [n] each), at element (`row`, `col`) of replica `rep` of
    `cell`; `narrow` marks pieces narrower than their cell; `seq` marks
    endpoints whose Loc (`locs[at]`; `at` empty when no Loc has a seq) has a
    per-iteration seq (`ref` builds those exactly from the Loc; their
    `buf`/`stride` are not used)."""

    buf: np.ndarray
    off: np.ndarray
    stride: np.ndarray
    seq: np.ndarray
    narrow: np.ndarray
    locs: list[Loc]
    at: np.ndarray

    @staticmethod
    def of(grid: _Grid, locs: list[list[Loc]], cell: np.ndarray, rep: np.ndarray,
           row: np.ndarray, col: np.ndarray, width: np.ndarray, elem: int) -> _Ends:
        """Endpoints of pieces `width` columns wide; the cell replicas are
        stored at `locs[cell][rep]`."""
        flat = list(chain.from_iterable(locs))
        assert len(flat) == grid.off[-1], "one Loc per cell replica"
        lbuf, loff, lstride, lseq = zip(*flat, strict=True)
        cols = np.array((lbuf, loff, lstride), dtype=np.int64)
        has_seq = np.fromiter(map(bool, lseq), np.bool_, len(flat)) if any(lseq) \
            else np.zeros(len(flat), dtype=np.bool_)
        out = np.empty((3, cell.size), dtype=np.int64)
        seq = np.empty(cell.size, dtype=np.bool_)
        narrow = np.empty(cell.size, dtype=np.bool_)
        _ends(grid.r0, grid.c0, grid.cw, grid.off, cols, has_seq, cell, rep, row, col, width,
              elem, out, seq, narrow)
        at = grid.off[cell] + rep if has_seq.any() else cell[:0]
        return _Ends(out[0], out[1], out[2], seq, narrow, flat, at)

    def panel(self, rows: np.ndarray, bufs: np.ndarray, at: np.ndarray) -> None:
        """Pieces `rows` move from/to panel buffers `bufs` at offsets `at`."""
        self.buf[rows], self.off[rows], self.stride[rows], self.seq[rows] = bufs, at, 0, False

    def ref(self, arg: int, i: int) -> Ref:
        """Piece i's endpoint as a `Ref` (the slow path)."""
        if self.seq[i]:
            loc = self.locs[int(self.at[i])]
            return ref(arg, loc, int(self.off[i]) - loc[1])
        return Ref(arg, int(self.buf[i]), int(self.off[i]), int(self.stride[i]))


@kjit
def _ends(r0, c0, cw, off, locs, has_seq, cell, rep, row, col, width, elem, out, seq,
          narrow):  # pragma: no cover - jitted
    """Per piece i (`_Ends.of`): out[:, i] = buffer, byte offset, iter stride
    at element (row[i], col[i]) of replica rep[i] of cell[i] (first row
    `r0`, column `c0`, width `cw`; its Loc is column off[cell] + rep of
    `locs` = buffer, offset, stride rows)."""
    for i in range(cell.shape[0]):
        c = cell[i]
        j = off[c] + rep[i]
        out[0, i] = locs[0, j]
        out[1, i] = locs[1, j] + ((row[i] - r0[c]) * cw[c] + col[i] - c0[c]) * elem
        out[2, i] = locs[2, j]
        seq[i] = has_seq[j]
        narrow[i] = width[i] != cw[c]


def _granule_of(x: np.ndarray) -> np.ndarray:
    """`_granule` elementwise (4 for 0); of an OR of offsets, the least of
    theirs: the lowest set bit of x | 4."""
    x = x | 4
    return x & -x


def _transfers(s: _Ends, d: _Ends, nbytes: np.ndarray) -> Xfers:
    """The rows of every piece in order: one, or the two of `_aligned`
    (vectorised for plain endpoints; pieces with a seq endpoint go through
    `_aligned` itself)."""
    a = _granule_of(s.off | s.stride | d.off | d.stride)
    split = (_granule_of(nbytes) > a) & (nbytes > a)
    slow = {i: _aligned(s.ref(0, i), d.ref(1, i), int(nbytes[i]))
            for i in np.flatnonzero(s.seq | d.seq).tolist()}
    if not slow and not split.any():
        return Xfers.columns(s.buf, s.off, d.buf, d.off, nbytes, s.stride, d.stride)
    counts = 1 + split.astype(np.int64)
    for i, ts in slow.items():
        counts[i] = len(ts)
    first = np.cumsum(counts) - counts
    piece = np.repeat(np.arange(nbytes.size), counts)
    second = np.arange(piece.size) - first[piece]
    head = np.where(split, a, 0)[piece] * second
    nb = np.where(split[piece], np.where(second == 0, a[piece], nbytes[piece] - a[piece]),
                  nbytes[piece])
    cols = (s.buf[piece], s.off[piece] + head, d.buf[piece], d.off[piece] + head, nb,
            s.stride[piece], d.stride[piece])
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
