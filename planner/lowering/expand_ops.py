"""Per-tile vertices of each recipe family (kernel ABI: docs/contracts.md §2).

Each function takes the expander (`ctx`: program, placed values, helpers) and
one lowered compute step, and appends phases.  Operand cells are found through
the values' layouts, so the grid → tile map chosen by lower is never
recomputed here.

A vit-tiny build makes ~2·10⁴ vertices, so they are built by `make_vertex`
from a ready args tuple (the per-kernel `*_args` builders, memoised: the cells
of one op share a few shapes) and (arg, loc) operand pairs (tests compare it
with an obvious dict-based twin, tests/handprog.py `dict_vertex`).
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Protocol

import numpy as np

from kernels import abi
from planner.ir.graph import BatchMatMul, Cast, Gelu, LayerNorm, MatMul, Softmax
from planner.lowering.expand_redist import Loc, loc_bufs, ref
from planner.lowering.lower import Step, Value
from planner.lowering.program import NARGS, LoopMark, Phase, Program, Ref, Vertex, Xfers

DT = {name: code for code, name in enumerate(abi.DTYPE_NAMES)}

Operands = tuple[tuple[int, Loc], ...]  # (vertex arg index, loc), in any order


class ExpandContext(Protocol):
    """What the per-family expanders need of the expander
    (planner.lowering.expand.Expander): the program being built, the placed
    values and their locations, phase emission and buffer materialisation."""

    prog: Program

    def value(self, name: str) -> Value: ...

    def locs(self, name: str) -> list[list[Loc]]: ...

    def emit(self, item: Phase | LoopMark) -> None: ...

    def materialise(self, v: Value, kind: str | None = None,
                    skip: dict[tuple[int, int], Loc] | None = None) -> None: ...


# argument slots (kernels.abi)
MM, BMM, RED = abi.ARGS.MATMUL, abi.ARGS.BATCH_MATMUL, abi.ARGS.REDUCE
LN, GE, SM, AD, CA = (abi.ARGS.LAYERNORM, abi.ARGS.GELU, abi.ARGS.SOFTMAX, abi.ARGS.ADD,
                      abi.ARGS.CAST)

def f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", float(x)))[0])


def scalars(kernel: str, **named: int) -> tuple[int, ...]:
    """The NARGS vertex args of `kernel` with the `named` arguments set (the
    slot names of kernels.abi.KERNEL_ARGS), the others 0."""
    names = abi.KERNEL_ARGS[kernel]
    a = [0] * NARGS
    for k, v in named.items():
        a[names.index(k)] = int(v)
    return tuple(a)


def _bufs(ops: Operands) -> tuple[int, ...]:
    """Sorted unique buffers of the operand locs (every iteration's)."""
    if len(ops) == 1:
        return loc_bufs(ops[0][1])
    bufs = {loc[0] for _, loc in ops if not loc[3]}
    for _, loc in ops:
        if loc[3]:
            bufs.update(b for b, _ in loc[3])
    return tuple(sorted(bufs))


def make_vertex(tile: int, kid: int, args: tuple[int, ...], reads: Operands,
                writes: Operands) -> Vertex:
    """A vertex from its args as a ready NARGS tuple (address slots 0) and
    its address operands as (arg index, loc) pairs, arg indices distinct:
    refs in arg order, reads/writes the buffers of the read/written locs."""
    refs = tuple([ref(k, loc) if loc[3] else Ref(k, loc[0], loc[1], loc[2])
                  for k, loc in sorted(reads + writes)])
    return Vertex(tile, kid, args, refs, _bufs(reads), _bufs(writes))


@lru_cache(maxsize=4096)
def matmul_args(lda: int, ldb: int, ldc: int, m: int, k: int, n: int, dt_in: int,
                dt_out: int, shift: int) -> tuple[int, ...]:
    return scalars("MATMUL", lda=lda, ldb=ldb, ldc=ldc, M=m, K=k, N=n, in_dtype=dt_in,
                   out_dtype=dt_out, scale_exp=shift)


@lru_cache(maxsize=4096)
def reduce_args(ld_parts: int, part_stride: int, k: int, ldo: int, m: int, n: int,
                dt_out: int) -> tuple[int, ...]:
    return scalars("REDUCE", ld_parts=ld_parts, part_stride=part_stride, k=k, ldo=ldo, M=m, N=n,
                   out_dtype=dt_out)


@lru_cache(maxsize=4096)
def bmm_args(lda: int, ldb: int, ldc: int, m: int, k: int, n: int, dt_in: int, dt_out: int,
             trans_b: bool, batch: int, sa: int, sb: int, sc: int,
             scale_exp: int = 0) -> tuple[int, ...]:
    flags = (abi.FLAG_TRANS_B if trans_b else 0) | abi.bmm_scale_flags(scale_exp)
    return scalars("BATCH_MATMUL", lda=lda, ldb=ldb, ldc=ldc, M=m, K=k, N=n, in_dtype=dt_in,
                   out_dtype=dt_out, flags=flags, batch=batch,
                   batch_stride_a=sa, batch_stride_b=sb, batch_stride_c=sc)


@lru_cache(maxsize=4096)
def layernorm_args(ldx: int, ldy: int, rows: int, cols: int, eps_bits: int) -> tuple[int, ...]:
    return scalars("LAYERNORM", ldx=ldx, ldy=ldy, M=rows, N=cols, eps=eps_bits)


@lru_cache(maxsize=4096)
def gelu_args(ldx: int, ldy: int, rows: int, cols: int) -> tuple[int, ...]:
    return scalars("GELU", ldx=ldx, ldy=ldy, M=rows, N=cols)


@lru_cache(maxsize=4096)
def softmax_args(ldx: int, ldy: int, rows: int, cols: int, scale_bits: int, dt_x: int,
                 dt_y: int) -> tuple[int, ...]:
    return scalars("SOFTMAX", ldx=ldx, ldy=ldy, M=rows, N=cols, scale=scale_bits, dtype_x=dt_x,
                   dtype_y=dt_y)


@lru_cache(maxsize=4096)
def cast_args(ldx: int, ldy: int, rows: int, cols: int, dt_x: int, dt_y: int,
              shift: int) -> tuple[int, ...]:
    return scalars("CAST", ldx=ldx, ldy=ldy, M=rows, N=cols, dtype_x=dt_x, dtype_y=dt_y,
                   shift=shift)


@lru_cache(maxsize=4096)
def add_args(lda: int, ldb: int, ldc: int, rows: int, cols: int, dt_a: int, dt_b: int,
             dt_c: int) -> tuple[int, ...]:
    return scalars("ADD", lda=lda, ldb=ldb, ldc=ldc, M=rows, N=cols, dtype_a=dt_a,
                   dtype_b=dt_b, dtype_c=dt_c)


def expand_matmul(ctx: ExpandContext, step: Step) -> None:
    op = step.op
    assert isinstance(op, MatMul)
    av, bv = ctx.value(step.inputs[0]), ctx.value(step.inputs[1])
    biasv = ctx.value(step.inputs[2]) if len(step.inputs) > 2 else None
    ov = ctx.value(step.outputs[0])
    a, b, o = av.layout, bv.layout, ov.layout
    gm, gk, gn = a.nr, a.nc, b.nc
    pa, pb = ctx.locs(av.name), ctx.locs(bv.name)
    pbias = ctx.locs(biasv.name) if biasv else None
    e, eo = av.elem, ov.elem
    dt_in, dt_out = DT[av.dtype], DT[ov.dtype]
    shift = av.scale_exp + bv.scale_exp
    label = step.label
    cuts = b.col_cuts
    ctx.materialise(ov)
    po = ctx.locs(ov.name)
    # cell (i, j, l) runs where b's cell (l, j) has replica i; a's cell (i, l)
    # has its replica j there, or (a fused sibling's shared a, planner.decide.fusion)
    # one of more replicas on the tile
    shared = any(len(o) != gn for o in a.owners)

    def a_loc(c: int, j: int, tile: int) -> Loc:
        return pa[c][a.owners[c].index(tile) if shared else j]

    if gk == 1:
        phase = Phase("compute", label)
        for i in range(gm):
            m0, m1, k0, k1 = a.rect(i, 0)
            for j in range(gn):
                n = cuts[j + 1] - cuts[j]
                tile = b.owners[j][i]
                args = matmul_args((k1 - k0) * e, n * e, n * eo, m1 - m0, k1 - k0, n, dt_in,
                                   dt_out, shift)
                reads: Operands = ((MM.a, a_loc(i, j, tile)), (MM.b, pb[j][i]))
                if pbias is not None:
                    reads += ((MM.bias, pbias[j][i]),)
                phase.vertices.append(make_vertex(tile, abi.MATMUL, args, reads,
                                                  ((MM.c, po[i * gn + j][0]),)))
        ctx.emit(phase)
        return
    # K-split: fp32 partials, exchanged to the row-slice owners, REDUCE (+ bias);
    # partial (i, j, l) is buffer parts[(i * gn + j) * gk + l]
    rc, kc = a.row_cuts, a.col_cuts
    widths = [cuts[j + 1] - cuts[j] for j in range(gn)]
    depths = [kc[l + 1] - kc[l] for l in range(gk)]
    new_buf = ctx.prog.new_buf
    parts: list[int] = []
    mm = Phase("compute", f"{label} partials", source=label, part="partials")
    for i in range(gm):
        m = rc[i + 1] - rc[i]
        for j, n in enumerate(widths):
            for l, k in enumerate(depths):
                tile = b.owners[l * gn + j][i]
                buf = new_buf(tile, m * n * 4, "scratch", f"{label}:part{i}.{j}.{l}")
                parts.append(buf)
                args = matmul_args(k * e, n * e, n * 4, m, k, n, dt_in, DT["fp32"], shift)
                mm.vertices.append(make_vertex(
                    tile, abi.MATMUL, args,
                    ((MM.a, a_loc(i * gk + l, j, tile)), (MM.b, pb[l * gn + j][i])),
                    ((MM.c, (buf, 0, 0, ())),)))
    ctx.emit(mm)
    sums: list[tuple[int, int, int, int]] = []
    red = Phase("compute", f"{label} reduce", source=label, part="reduce")
    for i in range(gm):
        m0, m1 = rc[i], rc[i + 1]
        for ri in o.row_span(m0, m1):
            r0, r1 = o.row_cuts[ri], o.row_cuts[ri + 1]
            for j, w in enumerate(widths):
                block = (r1 - r0) * w * 4
                tile = o.owners[ri * gn + j][0]
                land = new_buf(tile, gk * block, "exchange-landing", f"{label}:land{ri}.{j}")
                sums.append(((i * gn + j) * gk, (r0 - m0) * w * 4, land, block))
                landed: Operands = ((RED.parts, (land, 0, 0, ())),)
                if pbias is not None:
                    landed += ((RED.bias, pbias[j][ri]),)
                args = reduce_args(w * 4, block, gk, w * eo, r1 - r0, w, dt_out)
                red.vertices.append(make_vertex(tile, abi.REDUCE, args, landed,
                                                ((RED.out, po[ri * gn + j][0]),)))
    ctx.emit(Phase("exchange", f"{label} partial sums", transfers=partial_sums(parts, sums, gk),
                   source=label, part="partial sums"))
    ctx.emit(red)


def partial_sums(parts: list[int], sums: list[tuple[int, int, int, int]], gk: int) -> Xfers:
    """The K-split partial sums as transfer columns.  Each entry of `sums`
    is (index in `parts` of partial l = 0, byte offset of the row block in
    the partials, landing buffer, block bytes): partial l's block goes to
    block l of the landing buffer, l < gk (rows in `sums` order, then l)."""
    first, off, land, block = (np.asarray(c, dtype=np.int64) for c in zip(*sums, strict=True))
    l = np.arange(gk, dtype=np.int64)
    src = np.asarray(parts, dtype=np.int64)[first[:, None] + l]
    return Xfers.columns(src.reshape(-1), np.repeat(off, gk), np.repeat(land, gk),
                         (block[:, None] * l).reshape(-1), np.repeat(block, gk))


def expand_bmm(ctx: ExpandContext, step: Step) -> None:
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
        args = bmm_args(k * e, bc * e, n * eo, rows, k, n, DT[av.dtype], DT[ov.dtype],
                        op.transpose_b, batch, rows * k * e, kb * bc * e, rows * n * eo,
                        av.scale_exp + bv.scale_exp)
        phase.vertices.append(make_vertex(a.owners[c][0], abi.BATCH_MATMUL, args,
                                          ((BMM.a, pa[c][0]), (BMM.b, pb[gi][s])),
                                          ((BMM.c, po[c][0]),)))
    ctx.emit(phase)


def expand_bmm_split(ctx: ExpandContext, step: Step, av: Value, bv: Value, ov: Value) -> None:
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
        args = bmm_args(k * e, (k if op.transpose_b else w) * e, w * eo, r1 - r0, k, w,
                        DT[av.dtype], DT[ov.dtype], op.transpose_b, 1, (r1 - r0) * k * e,
                        k * w * e, (r1 - r0) * w * eo, av.scale_exp + bv.scale_exp)
        phase.vertices.append(make_vertex(o.owners[ri * gc + ci][0], abi.BATCH_MATMUL, args,
                                          ((BMM.a, pa[ri][ci]), (BMM.b, pb[bi * gc + ci][s])),
                                          ((BMM.c, po[ri * gc + ci][0]),)))
    ctx.emit(phase)


def expand_rows(ctx: ExpandContext, step: Step) -> None:
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
    dt_x, dt_y = DT[xv.dtype], DT[ov.dtype]
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
            v = make_vertex(tile, abi.LAYERNORM,
                            layernorm_args(ldx, ldy, rows, cols, f32_bits(op.eps)),
                            ((LN.x, x), (LN.gamma, pg[0][c]), (LN.beta, pb[0][c])),
                            ((LN.y, y),))
        elif isinstance(op, Gelu):
            v = make_vertex(tile, abi.GELU, gelu_args(ldx, ldy, rows, cols), ((GE.x, x),),
                            ((GE.y, y),))
        elif isinstance(op, Softmax):
            v = make_vertex(tile, abi.SOFTMAX,
                            softmax_args(ldx, ldy, rows, cols, f32_bits(op.scale), dt_x, dt_y),
                            ((SM.x, x),), ((SM.y, y),))
        elif isinstance(op, Cast):
            v = cast_vertex(tile, xv, ov, x, y, rows, cols)
        else:  # Add
            bv = ins[1]
            pbv = ctx.locs(bv.name)
            v = make_vertex(tile, abi.ADD,
                            add_args(ldx, cols * bv.elem, ldy, rows, cols, dt_x, DT[bv.dtype],
                                     dt_y),
                            ((AD.a, x), (AD.b, pbv[c][0])), ((AD.c, y),))
        phase.vertices.append(v)
    ctx.emit(phase)


def cast_vertex(tile: int, xv: Value, yv: Value, x: Loc, y: Loc, rows: int, cols: int) -> Vertex:
    args = cast_args(cols * xv.elem, cols * yv.elem, rows, cols, DT[xv.dtype], DT[yv.dtype],
                     xv.scale_exp - yv.scale_exp)
    return make_vertex(tile, abi.CAST, args, ((CA.x, x),), ((CA.y, y),))


def expand_cast_step(ctx: ExpandContext, step: Step) -> None:
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
