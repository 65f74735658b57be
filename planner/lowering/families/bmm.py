"""Placement of the "bmm" family: the attention's batched matmuls.

Layouts: recipe `bmm:<bg>x<gr>` spreads groups of bg batches (or 1/gr row
blocks of one batch) over the device, the other operand's head(s) replicated
on the gr row-block tiles; `bmm:1x<gr>x<gc>` gives tile (b, s, c) batch b,
row block s and out column block c, a's cell (b, s) replicated over c and
b's cell (b, c) (key rows for transpose_b, value columns otherwise) over s.
Expansion: one BATCH_MATMUL vertex per a cell (or per out cell).

Grouped-query attention (kv_group g): b holds one batch per kv head, a cell
per kv head (rows of one head), replicated on every tile whose a batches
include a q head of its group; a tile's a cell is split into one vertex per
kv head its batches touch, each reading that one head for all its batches
(batch stride 0).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kernels import abi
from planner.decide.layout import Layout, even_cuts
from planner.decide.recipe import Recipe
from planner.ir.graph import Graph, Op
from planner.lowering.expand_ops import DT, ExpandContext, make_vertex, scalars
from planner.lowering.expand_redist import Loc
from planner.lowering.lowered import Step, Value
from planner.lowering.placement import Layouts, register_placement
from planner.lowering.program import Phase

BMM = abi.ARGS.BATCH_MATMUL


@register_placement("bmm")
class BmmPlacement:
    """Layouts and expansion of the bmm family (module docstring)."""

    def layouts(self, lw: Any, g: Graph, op: Op, recipe: Recipe) -> Layouts:
        return bmm_layouts(lw, g, op, recipe)

    def expand(self, ctx: ExpandContext, step: Step) -> None:
        expand_bmm(ctx, step)


def bmm_layouts(lw: Any, g: Graph, op: Any, r: Recipe):
    a_t, b_t, o_t = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    bt, m, k = a_t.shape
    n = o_t.shape[2]
    kb = b_t.shape[1]
    if len(r.grid) == 3:
        return bmm_split_layouts(lw, op, bt, m, k, n, kb, b_t.shape[2], r.grid[1:])
    bg, gr = r.grid
    groups = even_cuts(bt, -(-bt // bg)) if bg > 1 else tuple(range(bt + 1))
    ng = len(groups) - 1
    sub = even_cuts(m, gr)
    gr = len(sub) - 1
    tl = lw.spread(ng * gr)
    rows_a = [0]
    owners = []
    for gi in range(ng):
        if gr == 1:
            rows_a.append(groups[gi + 1] * m)
            owners.append((tl[gi],))
            continue
        for s in range(gr):
            rows_a.append(groups[gi] * m + sub[s + 1])
            owners.append((tl[gi * gr + s],))
    a = Layout(bt * m, k, tuple(rows_a), (0, k), tuple(owners))
    out = Layout(bt * m, n, tuple(rows_a), (0, n), tuple(owners))
    if op.kv_group > 1:  # one b cell per kv head, on the tiles of its q heads
        grp = op.kv_group
        kv_owners: list[list[int]] = [[] for _ in range(bt // grp)]
        for gi in range(ng):
            for kv in range(groups[gi] // grp, (groups[gi + 1] - 1) // grp + 1):
                for s in range(gr):
                    if tl[gi * gr + s] not in kv_owners[kv]:
                        kv_owners[kv].append(tl[gi * gr + s])
        b = Layout(bt // grp * kb, b_t.shape[2], tuple(x * kb for x in range(bt // grp + 1)),
                   (0, b_t.shape[2]), tuple(tuple(o) for o in kv_owners))
        return (a, b), out, {}
    b = Layout(bt * kb, b_t.shape[2], tuple(x * kb for x in groups), (0, b_t.shape[2]),
               tuple(tuple(tl[gi * gr + s] for s in range(gr)) for gi in range(ng)))
    return (a, b), out, {}


def bmm_split_layouts(lw: Any, op: Any, bt: int, m: int, k: int, n: int, kb: int,
                      bcols: int, grid: tuple[int, ...]):
    """bmm:1x<gr>x<gc>: tile (b, s, c) = batch b, row block s, out column
    block c; a cells (b, s) replicated over c, b cells (b, c) (key rows
    for transpose_b, value columns otherwise) replicated over s."""
    sub, nc = even_cuts(m, grid[0]), even_cuts(n, grid[1])
    gr, gc = len(sub) - 1, len(nc) - 1
    tl = lw.spread(bt * gr * gc)

    def tile(b: int, s: int, c: int) -> int:
        return tl[(b * gr + s) * gc + c]

    rows_a = (0,) + tuple(b * m + sub[s + 1] for b in range(bt) for s in range(gr))
    a = Layout(bt * m, k, rows_a, (0, k), tuple(
        tuple(tile(b, s, c) for c in range(gc)) for b in range(bt) for s in range(gr)))
    out = Layout(bt * m, n, rows_a, nc, tuple(
        (tile(b, s, c),) for b in range(bt) for s in range(gr) for c in range(gc)))
    grp = op.kv_group  # b cell (kv, c) on the tiles of its group's q heads
    bk = bt // grp
    b_owners = tuple(tuple(tile(b, s, c) for b in range(kv * grp, (kv + 1) * grp)
                           for s in range(gr))
                     for kv in range(bk) for c in range(gc))
    if op.transpose_b:  # b is [Bt, N, K]: a column block of out is a row block of b
        rows_b = (0,) + tuple(b * n + nc[c + 1] for b in range(bk) for c in range(gc))
        lay_b = Layout(bk * n, bcols, rows_b, (0, bcols), b_owners)
    else:
        lay_b = Layout(bk * kb, bcols, tuple(b * kb for b in range(bk + 1)), nc, b_owners)
    return (a, lay_b), out, {}


@lru_cache(maxsize=4096)
def bmm_args(lda: int, ldb: int, ldc: int, m: int, k: int, n: int, dt_in: int, dt_out: int,
             trans_b: bool, batch: int, sa: int, sb: int, sc: int,
             scale_exp: int = 0) -> tuple[int, ...]:
    flags = (abi.FLAG_TRANS_B if trans_b else 0) | abi.bmm_scale_flags(scale_exp)
    return scalars("BATCH_MATMUL", lda=lda, ldb=ldb, ldc=ldc, M=m, K=k, N=n, in_dtype=dt_in,
                   out_dtype=dt_out, flags=flags, batch=batch,
                   batch_stride_a=sa, batch_stride_b=sb, batch_stride_c=sc)


def expand_bmm(ctx: ExpandContext, step: Step) -> None:
    op: Any = step.op
    av, bv, ov = ctx.value(step.inputs[0]), ctx.value(step.inputs[1]), ctx.value(step.outputs[0])
    _, m, k = av.shape
    kb, bc = bv.shape[1], bv.shape[2]
    n = ov.shape[2]
    a, b, o = av.layout, bv.layout, ov.layout
    if o.nc > 1:
        expand_bmm_split(ctx, step, av, bv, ov)
        return
    ctx.materialise(ov)
    pa, pb, po = ctx.locs(av.name), ctx.locs(bv.name), ctx.locs(ov.name)
    e, eo = av.elem, ov.elem
    phase = Phase("compute", step.label)
    if op.kv_group > 1:
        _expand_gqa(phase, op, av, bv, ov, pa, pb, po)
        ctx.emit(phase)
        return
    gr = a.nr // b.nr
    for c in range(a.nr):
        gi, s = divmod(c, gr)
        r0, r1 = a.row_cuts[c], a.row_cuts[c + 1]
        b0, b1 = b.row_cuts[gi], b.row_cuts[gi + 1]
        batch = (b1 - b0) // kb
        rows = (r1 - r0) // batch
        args = bmm_args(k * e, bc * e, n * eo, rows, k, n, DT[av.dtype], DT[ov.dtype],
                        op.transpose_b, batch, rows * k * e, kb * bc * e, rows * n * eo,
                        av.scale_exp + bv.scale_exp)
        phase.vertices.append(make_vertex(a.owners[c][0], abi.BATCH_MATMUL, args,
                                          ((BMM.a, pa[c][0]), (BMM.b, pb[gi][s])),
                                          ((BMM.c, po[c][0]),)))
    ctx.emit(phase)


def _shifted(loc: Loc, extra: int) -> Loc:
    """`loc` `extra` bytes further into its cell."""
    return (loc[0], loc[1] + extra, loc[2], tuple((b, o + extra) for b, o in loc[3]))


def _expand_gqa(phase: Phase, op: Any, av: Value, bv: Value, ov: Value, pa: list, pb: list,
                po: list) -> None:
    """Grouped-query batches (module docstring): per a cell, one vertex per
    kv head its batches touch, b's stride 0."""
    bt, m, k = av.shape
    bc = bv.shape[2]
    n = ov.shape[2]
    a, b = av.layout, bv.layout
    grp, e, eo = op.kv_group, av.elem, ov.elem
    for c in range(a.nr):
        r0, r1 = a.row_cuts[c], a.row_cuts[c + 1]
        t0, t1 = r0 // m, -(-r1 // m)  # the cell's batches (one when it is a row block)
        rows = (r1 - r0) // (t1 - t0)
        tile = a.owners[c][0]
        for kv in range(t0 // grp, (t1 - 1) // grp + 1):
            s0, s1 = max(t0, kv * grp), min(t1, (kv + 1) * grp)
            args = bmm_args(k * e, bc * e, n * eo, rows, k, n, DT[av.dtype], DT[ov.dtype],
                            op.transpose_b, s1 - s0, rows * k * e, 0, rows * n * eo,
                            av.scale_exp + bv.scale_exp)
            off = (s0 - t0) * rows
            phase.vertices.append(make_vertex(
                tile, abi.BATCH_MATMUL, args,
                ((BMM.a, _shifted(pa[c][0], off * k * e)),
                 (BMM.b, pb[kv][b.owners[kv].index(tile)])),
                ((BMM.c, _shifted(po[c][0], off * n * eo)),)))


def expand_bmm_split(ctx: ExpandContext, step: Step, av: Value, bv: Value, ov: Value) -> None:
    """bmm:1x<gr>x<gc>: one vertex per out cell (row block of one batch ×
    column block); its a cell is replica c, its b cell (batch, c) replica s."""
    op: Any = step.op
    bt, _, k = av.shape
    a, o, b_lay = av.layout, ov.layout, bv.layout
    gr, gc = a.nr // bt, o.nc
    ctx.materialise(ov)
    pa, pb, po = ctx.locs(av.name), ctx.locs(bv.name), ctx.locs(ov.name)
    e, eo = av.elem, ov.elem
    phase = Phase("compute", step.label)
    for ri, ci in o.cells():
        r0, r1, c0, c1 = o.rect(ri, ci)
        w = c1 - c0
        bi, s = divmod(ri, gr)
        kv = bi // op.kv_group
        tile = o.owners[ri * gc + ci][0]
        rep = b_lay.owners[kv * gc + ci].index(tile)
        args = bmm_args(k * e, (k if op.transpose_b else w) * e, w * eo, r1 - r0, k, w,
                        DT[av.dtype], DT[ov.dtype], op.transpose_b, 1, (r1 - r0) * k * e,
                        k * w * e, (r1 - r0) * w * eo, av.scale_exp + bv.scale_exp)
        phase.vertices.append(make_vertex(tile, abi.BATCH_MATMUL, args,
                                          ((BMM.a, pa[ri][ci]), (BMM.b, pb[kv * gc + ci][rep])),
                                          ((BMM.c, po[ri * gc + ci][0]),)))
    ctx.emit(phase)
