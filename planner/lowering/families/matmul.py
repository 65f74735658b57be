"""Placement of the "matmul" family: MatMul on a grid of tiles.

Layouts (recipe `mm:<gm>x<gn>x<gk>`, on a grid of tiles from the shared
rotation, shifted by the op's tile shift): a's cell (i, l) replicated over
j, b's cell (l, j) replicated over i, out (i, j), or gk row slices of (i, j)
when K is split.  The weight's compact home: each kernel block (K slice l,
columns j; all layers) split by rows into min(gm, ceil(bytes /
HOME_SHARD_BYTES)) shards, shard i on tile (i, j, l), so the gm tiles that
read a block all-gather it before the matmul; a bias column block lives on
one of its readers (rotating).  Expansion: one MATMUL vertex per grid cell;
with K split, partials (the op's `partials` dtype) exchanged to the row-slice
owners and summed by REDUCE (+ bias).  A fused sibling group (planner.decide.fusion) is laid out
by planner.lowering.lower on one grid through `grid_layouts`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from kernels import abi
from planner.decide.layout import Layout, even_cuts, grid_tiles, pairs_rows, slice_cuts
from planner.decide.recipe import Recipe
from planner.ir.graph import DTYPE_BYTES, Graph, Op
from planner.ir.ops.matmul import MatMul
from planner.lowering.expand_ops import DT, ExpandContext, Operands, make_vertex, scalars
from planner.lowering.expand_redist import Loc
from planner.lowering.lowered import Step
from planner.lowering.placement import Layouts, register_placement
from planner.lowering.program import Phase, Xfers

# a weight block (all layers) is sharded over up to gm readers, one shard per
# this many bytes: balance where it matters, few all-gather transfers (gm² per
# block when fully sharded) where blocks are small
HOME_SHARD_BYTES = 4096
MM, RED = abi.ARGS.MATMUL, abi.ARGS.REDUCE


@register_placement("matmul")
class MatmulPlacement:
    """Layouts and expansion of the matmul family (module docstring)."""

    def layouts(self, lw: Any, g: Graph, op: Op, recipe: Recipe) -> Layouts:
        return matmul_layouts(lw, g, op, recipe)

    def expand(self, ctx: ExpandContext, step: Step) -> None:
        ctx.params(step)
        expand_matmul(ctx, step)


def matmul_layouts(lw: Any, g: Graph, op: Any, r: Recipe):
    m, k = g.tensor(op.a).shape
    n = g.tensor(op.b).shape[1]
    gm, gn, gk = r.grid
    mc, kc, nc = even_cuts(m, gm), even_cuts(k, gk), even_cuts(n, gn)
    gm, gk, gn = len(mc) - 1, len(kc) - 1, len(nc) - 1
    base = lw.rotate(gm * gn * gk, lw.qual(op.name))
    tl = grid_tiles(base + lw.op_shift, gm * gn * gk, lw.device.tiles, lw.plan)

    def tile(i: int, j: int, l: int) -> int:
        return tl[(i * gn + j) * gk + l]

    return grid_layouts(lw, g, op, mc, kc, nc, tile)


def grid_layouts(lw: Any, g: Graph, op: Any, mc: tuple[int, ...], kc: tuple[int, ...],
                 nc: tuple[int, ...], tile: Callable[[int, int, int], int]):
    """Matmul layouts (a, b, bias; out; homes) on the grid of cuts `mc` x
    `nc` x `kc` whose cell (i, j, l) runs on `tile(i, j, l)`."""
    m, k = g.tensor(op.a).shape
    n = g.tensor(op.b).shape[1]
    gm, gk, gn = len(mc) - 1, len(kc) - 1, len(nc) - 1
    a = Layout(m, k, mc, kc, tuple(tuple(tile(i, j, l) for j in range(gn))
                                   for i in range(gm) for l in range(gk)))
    b = Layout(k, n, kc, nc, tuple(tuple(tile(i, j, l) for i in range(gm))
                                   for l in range(gk) for j in range(gn)))
    if gk == 1:
        out = Layout(m, n, mc, nc, tuple((tile(i, j, 0),) for i in range(gm)
                                         for j in range(gn)))
        bias_owners = [tuple(tile(i, j, 0) for i in range(gm)) for j in range(gn)]
    else:
        # fp16 partial rows of odd width: row slices start on even rows, so
        # each slice sent to its reducer starts on a word (simulator.access)
        pair = pairs_rows(op.partials, nc)
        rc = [0]
        slices = []  # (i, l') per output row cell
        for i in range(gm):
            sub = slice_cuts(mc[i + 1] - mc[i], gk, pair)
            for s in range(len(sub) - 1):
                rc.append(mc[i] + sub[s + 1])
                slices.append((i, s))
        out = Layout(m, n, tuple(rc), nc, tuple((tile(i, j, s),) for i, s in slices
                                               for j in range(gn)))
        bias_owners = [tuple(tile(i, j, s) for i, s in slices) for j in range(gn)]
    ins = [a, b]
    w = g.tensor(op.b)
    layers = max(1, lw.params.get(lw.qual(op.b), ("", 0))[1])
    block = b.max_cell_bytes(DTYPE_BYTES[w.dtype]) * layers
    shards = min(gm, max(1, -(-block // HOME_SHARD_BYTES)))
    homes = {op.b: sharded_home(b, shards)}
    if op.bias is not None:
        bias = Layout(1, n, (0, 1), nc, tuple(bias_owners))
        ins.append(bias)
        # one replica per column block holds the home, rotating over the
        # readers: biases do not pile onto the i = 0 tiles
        homes[op.bias] = Layout(1, n, (0, 1), nc, tuple(
            (o[j % len(o)],) for j, o in enumerate(bias.owners)))
    return tuple(ins), out, homes


def sharded_home(b: Layout, gm: int) -> Layout:
    """The compact home of a matmul weight: each kernel block (K slice l,
    columns j) split by rows into `gm` shards, shard i on the tile (i, j, l)
    that reads the block — every element once, spread over the grid."""
    rc = [0]
    owners: list[tuple[int, ...]] = []
    for l in range(b.nr):
        r0, r1 = b.row_cuts[l], b.row_cuts[l + 1]
        sub = even_cuts(r1 - r0, gm)
        for s in range(len(sub) - 1):
            rc.append(r0 + sub[s + 1])
            owners.extend((b.owners[l * b.nc + j][s],) for j in range(b.nc))
    return Layout(b.rows, b.cols, tuple(rc), b.col_cuts, tuple(owners))


@lru_cache(maxsize=4096)
def matmul_args(lda: int, ldb: int, ldc: int, m: int, k: int, n: int, dt_in: int,
                dt_out: int, shift: int) -> tuple[int, ...]:
    return scalars("MATMUL", lda=lda, ldb=ldb, ldc=ldc, M=m, K=k, N=n, in_dtype=dt_in,
                   out_dtype=dt_out, scale_exp=shift)


@lru_cache(maxsize=4096)
def reduce_args(ld_parts: int, part_stride: int, k: int, ldo: int, m: int, n: int,
                dt_out: int, parts_fp16: int) -> tuple[int, ...]:
    return scalars("REDUCE", ld_parts=ld_parts, part_stride=part_stride, k=k, ldo=ldo, M=m, N=n,
                   out_dtype=dt_out, parts_fp16=parts_fp16)


def expand_matmul(ctx: ExpandContext, step: Step) -> None:
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
    # K-split: partials (fp16 or fp32), exchanged to the row-slice owners,
    # REDUCE (+ bias); partial (i, j, l) is buffer parts[(i * gn + j) * gk + l]
    assert isinstance(step.op, MatMul)  # the family's one kind
    partials = step.op.partials
    pe, dt_p = DTYPE_BYTES[partials], DT[partials]
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
                buf = new_buf(tile, m * n * pe, "scratch", f"{label}:part{i}.{j}.{l}")
                parts.append(buf)
                args = matmul_args(k * e, n * e, n * pe, m, k, n, dt_in, dt_p, shift)
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
                ld = w * pe
                block = (r1 - r0) * ld
                tile = o.owners[ri * gn + j][0]
                land = new_buf(tile, gk * block, "exchange-landing", f"{label}:land{ri}.{j}")
                sums.append(((i * gn + j) * gk, (r0 - m0) * ld, land, block))
                landed: Operands = ((RED.parts, (land, 0, 0, ())),)
                if pbias is not None:
                    landed += ((RED.bias, pbias[j][ri]),)
                args = reduce_args(ld, block, gk, w * eo, r1 - r0, w, dt_out,
                                   int(partials == "fp16"))
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
