"""Per-tile vertices of each recipe family (kernel ABI: docs/contracts.md §2).

Each function takes the expander (`ctx`: program, placed values, helpers) and
one lowered compute step, and appends phases.  Operand cells are found through
the values' layouts, so the grid → tile map chosen by lower is never
recomputed here.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from kernels import ids
from planner.expand_redist import Loc, loc_bufs, ref
from planner.graph import BatchMatMul, Cast, Gelu, LayerNorm, MatMul, Softmax
from planner.program import NARGS, Phase, Transfer, Vertex, Xfers

if TYPE_CHECKING:
    from planner.expand import Expander
    from planner.lower import Step, Value

DT = {"fp8": 0, "fp16": 1, "fp32": 2}


def f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", float(x)))[0])


def vertex(tile: int, kid: int, args: dict[int, int], reads: dict[int, Loc],
           writes: dict[int, Loc], extra: dict[int, int] | None = None) -> Vertex:
    """A vertex with scalar `args`, address args from `reads`/`writes` locs
    (arg index → loc, plus `extra` byte offsets)."""
    a = [0] * NARGS
    for k, v in args.items():
        a[k] = int(v)
    extra = extra or {}
    refs = tuple(ref(k, loc, extra.get(k, 0)) for k, loc in sorted({**reads, **writes}.items()))
    rb = tuple(sorted({b for loc in reads.values() for b in loc_bufs(loc)}))
    wb = tuple(sorted({b for loc in writes.values() for b in loc_bufs(loc)}))
    return Vertex(tile, kid, tuple(a), refs, rb, wb)


def expand_matmul(ctx: Expander, step: Step) -> None:
    op = step.op
    assert isinstance(op, MatMul)
    av, bv = ctx.value(step.inputs[0]), ctx.value(step.inputs[1])
    biasv = ctx.value(step.inputs[2]) if len(step.inputs) > 2 else None
    ov = ctx.value(step.outputs[0])
    a, b, o = av.layout, bv.layout, ov.layout
    gm, gk, gn = a.nr, a.nc, b.nc
    pa, pb = ctx.locs(av.name), ctx.locs(bv.name)
    pbias = ctx.locs(biasv.name) if biasv else None
    e = av.elem
    shift = av.scale_exp + bv.scale_exp
    label = step.label
    if gk == 1:
        ctx.materialise(ov)
        po = ctx.locs(ov.name)
        phase = Phase("compute", label)
        for i in range(gm):
            for j in range(gn):
                m0, m1, k0, k1 = a.rect(i, 0)
                n0, n1 = b.col_cuts[j], b.col_cuts[j + 1]
                tile = a.owners[i][j]
                reads = {0: pa[i][j], 2: pb[j][i]}
                if pbias is not None:
                    reads[13] = pbias[j][i]
                args = {1: (k1 - k0) * e, 3: (n1 - n0) * e, 5: (n1 - n0) * ov.elem,
                        6: m1 - m0, 7: k1 - k0, 8: n1 - n0, 9: DT[av.dtype], 10: DT[ov.dtype],
                        11: 0, 12: shift}
                phase.vertices.append(vertex(tile, ids.MATMUL, args, reads,
                                             {4: po[i * gn + j][0]}))
        ctx.emit(phase)
        return
    # K-split: fp32 partials, exchanged to the row-slice owners, REDUCE (+ bias)
    ctx.materialise(ov)
    po = ctx.locs(ov.name)
    parts: dict[tuple[int, int, int], Loc] = {}
    mm = Phase("compute", f"{label} partials")
    for i in range(gm):
        for j in range(gn):
            for l in range(gk):
                m0, m1, k0, k1 = a.rect(i, l)
                n0, n1 = b.col_cuts[j], b.col_cuts[j + 1]
                tile = a.owners[i * gk + l][j]
                buf = ctx.prog.new_buf(tile, (m1 - m0) * (n1 - n0) * 4, "scratch",
                                       f"{label}:part{i}.{j}.{l}")
                parts[i, j, l] = (buf, 0, 0, ())
                args = {1: (k1 - k0) * e, 3: (n1 - n0) * e, 5: (n1 - n0) * 4, 6: m1 - m0,
                        7: k1 - k0, 8: n1 - n0, 9: DT[av.dtype], 10: DT["fp32"], 11: 0,
                        12: shift}
                mm.vertices.append(vertex(tile, ids.MATMUL, args,
                                          {0: pa[i * gk + l][j], 2: pb[l * gn + j][i]},
                                          {4: parts[i, j, l]}))
    ctx.emit(mm)
    sums: list[Transfer] = []
    red = Phase("compute", f"{label} reduce")
    for i in range(gm):
        m0, m1 = a.row_cuts[i], a.row_cuts[i + 1]
        for ri in o.row_span(m0, m1):
            r0, r1 = o.row_cuts[ri], o.row_cuts[ri + 1]
            for j in range(gn):
                n0, n1 = b.col_cuts[j], b.col_cuts[j + 1]
                w = n1 - n0
                block = (r1 - r0) * w * 4
                tile = o.owners[ri * gn + j][0]
                land = ctx.prog.new_buf(tile, gk * block, "exchange-landing",
                                        f"{label}:land{ri}.{j}")
                for l in range(gk):
                    sums.append(Transfer(ref(0, parts[i, j, l], (r0 - m0) * w * 4),
                                                  ref(1, (land, 0, 0, ()), l * block), block))
                reads = {0: (land, 0, 0, ())}
                if pbias is not None:
                    reads[9] = pbias[j][ri]
                args = {1: w * 4, 2: block, 3: gk, 5: w * ov.elem, 6: r1 - r0, 7: w,
                        8: DT[ov.dtype]}
                red.vertices.append(vertex(tile, ids.REDUCE, args, reads,
                                           {4: po[ri * gn + j][0]}))
    ctx.emit(Phase("exchange", f"{label} partial sums", transfers=Xfers.of(sums)))
    ctx.emit(red)


def expand_bmm(ctx: Expander, step: Step) -> None:
    op = step.op
    assert isinstance(op, BatchMatMul)
    av, bv, ov = ctx.value(step.inputs[0]), ctx.value(step.inputs[1]), ctx.value(step.outputs[0])
    _, m, k = av.shape
    kb, bc = bv.shape[1], bv.shape[2]
    n = ov.shape[2]
    a, b, o = av.layout, bv.layout, ov.layout
    if o.nc > 1:
        expand_bmm_split(ctx, step, av, bv, ov)
        return
    gr = a.nr // b.nr
    ctx.materialise(ov)
    pa, pb, po = ctx.locs(av.name), ctx.locs(bv.name), ctx.locs(ov.name)
    e, eo = av.elem, ov.elem
    phase = Phase("compute", step.label)
    for c in range(a.nr):
        gi, s = divmod(c, gr)
        r0, r1 = a.row_cuts[c], a.row_cuts[c + 1]
        b0, b1 = b.row_cuts[gi], b.row_cuts[gi + 1]
        batch = (b1 - b0) // kb
        rows = (r1 - r0) // batch
        args = {1: k * e, 3: bc * e, 5: n * eo, 6: rows, 7: k, 8: n, 9: DT[av.dtype],
                10: DT[ov.dtype], 11: 1 if op.transpose_b else 0, 12: batch,
                13: rows * k * e, 14: kb * bc * e, 15: rows * n * eo}
        phase.vertices.append(vertex(a.owners[c][0], ids.BATCH_MATMUL, args,
                                     {0: pa[c][0], 2: pb[gi][s]}, {4: po[c][0]}))
    ctx.emit(phase)


def expand_bmm_split(ctx: Expander, step: Step, av: Value, bv: Value, ov: Value) -> None:
    """bmm:1x<gr>x<gc>: one vertex per out cell (row block of one batch ×
    column block); its a cell is replica c, its b cell (batch, c) replica s."""
    op = step.op
    assert isinstance(op, BatchMatMul)
    bt, _, k = av.shape
    a, o = av.layout, ov.layout
    gr, gc = a.nr // bt, o.nc
    ctx.materialise(ov)
    pa, pb, po = ctx.locs(av.name), ctx.locs(bv.name), ctx.locs(ov.name)
    e, eo = av.elem, ov.elem
    phase = Phase("compute", step.label)
    for ri, ci in o.cells():
        r0, r1, c0, c1 = o.rect(ri, ci)
        w = c1 - c0
        bi, s = divmod(ri, gr)
        args = {1: k * e, 3: (k if op.transpose_b else w) * e, 5: w * eo, 6: r1 - r0, 7: k,
                8: w, 9: DT[av.dtype], 10: DT[ov.dtype], 11: 1 if op.transpose_b else 0,
                12: 1, 13: (r1 - r0) * k * e, 14: k * w * e, 15: (r1 - r0) * w * eo}
        phase.vertices.append(vertex(o.owners[ri * gc + ci][0], ids.BATCH_MATMUL, args,
                                     {0: pa[ri][ci], 2: pb[bi * gc + ci][s]},
                                     {4: po[ri * gc + ci][0]}))
    ctx.emit(phase)


def expand_rows(ctx: Expander, step: Step) -> None:
    """One vertex per cell; LayerNorm/Softmax cells span whole rows, the
    elementwise ops' cells may be column blocks (row stride = cell width)."""
    op = step.op
    ins = [ctx.value(v) for v in step.inputs]
    ov = ctx.value(step.outputs[0])
    xv = ins[0]
    lay = xv.layout
    if lay.nc > 1 and isinstance(op, (LayerNorm, Softmax)):
        raise AssertionError(f"{step.label}: row kernel on column blocks")
    ctx.materialise(ov)
    px, po = ctx.locs(xv.name), ctx.locs(ov.name)
    phase = Phase("compute", step.label)
    for ri, ci in lay.cells():
        c = ri * lay.nc + ci
        tile = lay.owners[c][0]
        r0, r1, c0, c1 = lay.rect(ri, ci)
        rows, cols = r1 - r0, c1 - c0
        ldx, ldy = cols * xv.elem, cols * ov.elem
        x, y = px[c][0], po[c][0]
        if isinstance(op, LayerNorm):
            pg, pb = ctx.locs(ins[1].name), ctx.locs(ins[2].name)
            v = vertex(tile, ids.LAYERNORM, {1: ldx, 5: ldy, 6: rows, 7: cols,
                                             8: f32_bits(op.eps)},
                       {0: x, 2: pg[0][c], 3: pb[0][c]}, {4: y})
        elif isinstance(op, Gelu):
            v = vertex(tile, ids.GELU, {1: ldx, 3: ldy, 4: rows, 5: cols}, {0: x}, {2: y})
        elif isinstance(op, Softmax):
            v = vertex(tile, ids.SOFTMAX, {1: ldx, 3: ldy, 4: rows, 5: cols,
                                           6: f32_bits(op.scale), 7: DT[xv.dtype],
                                           8: DT[ov.dtype]}, {0: x}, {2: y})
        elif isinstance(op, Cast):
            v = cast_vertex(tile, xv, ov, x, y, rows, cols)
        else:  # Add
            bv = ins[1]
            pbv = ctx.locs(bv.name)
            v = vertex(tile, ids.ADD, {1: ldx, 3: cols * bv.elem, 5: ldy, 6: rows, 7: cols,
                                       8: DT[xv.dtype], 9: DT[bv.dtype], 10: DT[ov.dtype]},
                       {0: x, 2: pbv[c][0]}, {4: y})
        phase.vertices.append(v)
    ctx.emit(phase)


def cast_vertex(tile: int, xv: Value, yv: Value, x: Loc, y: Loc, rows: int, cols: int) -> Vertex:
    shift = xv.scale_exp - yv.scale_exp
    return vertex(tile, ids.CAST, {1: cols * xv.elem, 3: cols * yv.elem, 4: rows, 5: cols,
                                   6: DT[xv.dtype], 7: DT[yv.dtype], 8: shift},
                  {0: x}, {2: y})


def expand_cast_step(ctx: Expander, step: Step) -> None:
    """Cast conversion: every cell and replica of a value, in its layout."""
    xv, yv = ctx.value(step.inputs[0]), ctx.value(step.outputs[0])
    ctx.materialise(yv, kind="exchange-landing")
    px, py = ctx.locs(xv.name), ctx.locs(yv.name)
    lay = xv.layout
    phase = Phase("compute", f"cast {step.label}")
    for ri, ci in lay.cells():
        r0, r1, c0, c1 = lay.rect(ri, ci)
        cell = ri * lay.nc + ci
        for k, tile in enumerate(lay.owners[cell]):
            phase.vertices.append(cast_vertex(tile, xv, yv, px[cell][k], py[cell][k], r1 - r0,
                                              c1 - c0))
    ctx.emit(phase)
