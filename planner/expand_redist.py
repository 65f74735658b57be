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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernels import ids
from planner.layout import Layout
from planner.program import Program, Ref, Transfer, Vertex

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
    transfers: list[Transfer] = field(default_factory=list)
    unpack: list[Vertex] = field(default_factory=list)


# (src cell, src replica, a0, a1, b0, b1, dst cell, dst replica, dst row, dst col)
_Piece = tuple[int, int, int, int, int, int, int, int, int, int]


def pieces(src: Layout, dst: Layout, segments: tuple,
           skip: set[tuple[int, int]]) -> list[_Piece]:
    """Every source rectangle (in source coordinates) that lands in a
    destination cell replica, with its top-left destination coordinates."""
    out: list[_Piece] = []
    for dr0, dr1, dc0, sr0, sc0, ncols in segments:
        for ri in dst.row_span(dr0, dr1):
            for ci in dst.col_span(dc0, dc0 + ncols):
                cell = ri * dst.nc + ci
                todo = [k for k in range(len(dst.owners[cell])) if (cell, k) not in skip]
                if not todo:
                    continue
                d_r0, d_r1, d_c0, d_c1 = dst.rect(ri, ci)
                r_lo, r_hi = max(d_r0, dr0), min(d_r1, dr1)
                c_lo, c_hi = max(d_c0, dc0), min(d_c1, dc0 + ncols)
                if r_lo >= r_hi or c_lo >= c_hi:
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


def _runs(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive rows covered by `spans` (row intervals)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(set(spans)):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _panels(groups: dict[tuple, list[tuple[int, int]]], width: dict[tuple, int], elem: int
            ) -> tuple[dict[tuple, list[tuple[int, int, int]]], dict[tuple, int]]:
    """Lay out column panels: per group key (cell, replica, c0, c1) its row runs
    (lo, hi, byte offset) in the owner's buffer, and that buffer's size per
    (cell, replica).  Keys are visited sorted: deterministic offsets."""
    runs: dict[tuple, list[tuple[int, int, int]]] = {}
    size: dict[tuple, int] = {}
    for key in sorted(groups):
        owner = key[:2]
        off = size.get(owner, 0)
        placed = []
        for lo, hi in _runs(groups[key]):
            placed.append((lo, hi, off))
            off = _up4(off + (hi - lo) * width[key] * elem)
        runs[key] = placed
        size[owner] = off
    return runs, size


def _at(runs: list[tuple[int, int, int]], row: int, row_bytes: int) -> int:
    for lo, hi, off in runs:
        if lo <= row < hi:
            return off + (row - lo) * row_bytes
    raise AssertionError(f"row {row} not in a panel run")


def moves(prog: Program, label: str, src: Layout, src_locs: list[list[Loc]], dst: Layout,
          dst_locs: list[list[Loc]], elem: int, segments: tuple,
          skip: set[tuple[int, int]]) -> Moves:
    """Pack/transfer/unpack work filling every destination replica except the
    `(cell, replica)` pairs in `skip` (which share storage).

    A multi-row piece narrower than its source cell is packed into a column
    panel of the source replica's pack buffer (one COPY per run of
    consecutive rows of one column range); one narrower than its destination
    cell lands in a column panel of a landing buffer and is unpacked the same
    way.  Each piece is then one contiguous transfer."""
    from planner.expand_ops import vertex

    ps = pieces(src, dst, segments, skip)
    res = Moves()
    pgroups: dict[tuple, list[tuple[int, int]]] = {}
    lgroups: dict[tuple, list[tuple[int, int]]] = {}
    width: dict[tuple, int] = {}
    for scell, rep, a0, a1, b0, b1, cell, k, rr0, cc0 in ps:
        w, rows = b1 - b0, a1 - a0
        if rows == 1:
            continue
        ci = scell % src.nc
        if w != src.col_cuts[ci + 1] - src.col_cuts[ci]:
            key = (scell, rep, b0, b1)
            pgroups.setdefault(key, []).append((a0, a1))
            width[key] = w
        dci = cell % dst.nc
        if w != dst.col_cuts[dci + 1] - dst.col_cuts[dci]:
            key = (cell, k, cc0, cc0 + w)
            lgroups.setdefault(key, []).append((rr0, rr0 + rows))
            width[key] = w
    pruns, psize = _panels(pgroups, width, elem)
    lruns, lsize = _panels(lgroups, width, elem)
    pack_buf = {key: prog.new_buf(src.owners[key[0]][key[1]], size, "scratch",
                                  f"{label}:pack{key[0]}.{key[1]}")
                for key, size in sorted(psize.items())}
    land_buf = {key: prog.new_buf(dst.owners[key[0]][key[1]], size, "exchange-landing",
                                  f"{label}:land{key[0]}.{key[1]}")
                for key, size in sorted(lsize.items())}
    for key, runs in sorted(pruns.items()):
        scell, rep, b0, b1 = key
        s_r0, _, s_c0, s_c1 = src.rect(scell // src.nc, scell % src.nc)
        s_ld, w = (s_c1 - s_c0) * elem, (b1 - b0) * elem
        ploc: Loc = (pack_buf[scell, rep], 0, 0, ())
        for lo, hi, off in runs:
            res.pack.append(vertex(src.owners[scell][rep], ids.COPY,
                                   {1: s_ld, 3: w, 4: hi - lo, 5: w},
                                   {0: src_locs[scell][rep]}, {2: ploc},
                                   {0: (lo - s_r0) * s_ld + (b0 - s_c0) * elem, 2: off}))
    for key, runs in sorted(lruns.items()):
        cell, k, c0, c1 = key
        d_r0, _, d_c0, d_c1 = dst.rect(cell // dst.nc, cell % dst.nc)
        d_ld, w = (d_c1 - d_c0) * elem, (c1 - c0) * elem
        lloc: Loc = (land_buf[cell, k], 0, 0, ())
        for lo, hi, off in runs:
            res.unpack.append(vertex(dst.owners[cell][k], ids.COPY,
                                     {1: w, 3: d_ld, 4: hi - lo, 5: w},
                                     {0: lloc}, {2: dst_locs[cell][k]},
                                     {0: off, 2: (lo - d_r0) * d_ld + (c0 - d_c0) * elem}))
    srefs: dict[tuple[int, int, int, int, int, int], Ref] = {}  # multicast: one src ref
    snc, dnc = src.nc, dst.nc
    scr, scc, dcr, dcc = src.row_cuts, src.col_cuts, dst.row_cuts, dst.col_cuts
    for scell, rep, a0, a1, b0, b1, cell, k, rr0, cc0 in ps:
        sri, sci = divmod(scell, snc)
        dri, dci = divmod(cell, dnc)
        s_r0, s_c0, s_c1 = scr[sri], scc[sci], scc[sci + 1]
        d_r0, d_c0, d_c1 = dcr[dri], dcc[dci], dcc[dci + 1]
        s_ld, d_ld = (s_c1 - s_c0) * elem, (d_c1 - d_c0) * elem
        w, rows = (b1 - b0) * elem, a1 - a0
        skey = (scell, rep, a0, a1, b0, b1)
        sref = srefs.get(skey)
        if sref is None:
            pkey = (scell, rep, b0, b1)
            if rows > 1 and pkey in pruns:
                sref = ref(0, (pack_buf[scell, rep], 0, 0, ()), _at(pruns[pkey], a0, w))
            else:
                sref = ref(0, src_locs[scell][rep], (a0 - s_r0) * s_ld + (b0 - s_c0) * elem)
            srefs[skey] = sref
        lkey = (cell, k, cc0, cc0 + b1 - b0)
        if rows > 1 and lkey in lruns:
            dref = ref(1, (land_buf[cell, k], 0, 0, ()), _at(lruns[lkey], rr0, w))
        else:
            dref = ref(1, dst_locs[cell][k], (rr0 - d_r0) * d_ld + (cc0 - d_c0) * elem)
        res.transfers.extend(_aligned(sref, dref, rows * w))
    return res


def _up4(n: int) -> int:
    return (n + 3) & ~3


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
