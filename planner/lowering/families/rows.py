"""Placement of the "rows" family: row-parallel ops (planner.ir.opkind.RowOp).

Layouts: the leading operand and the output in row blocks (`rows:<r>`, from
the shared row layout, shifted by the op's tile shift) or, for an
ELEMENTWISE op, in row × column blocks spread over the device
(`rows:<r>x<gc>`) or in the cells its leading operand arrives in (`rows:0`:
the producer's output layout when the boundary is open, else the canonical
one; each cell on its first owner).  Each other operand by its kind (RowOp.OPERANDS): a "row"
operand in the very layout of the leading one (read row-periodically when
it has fewer rows), a "table" operand in the same row blocks at its own
width, a "vector" one as one row replicated on the tiles of each column
block, a "whole" one whole on every tile of the op.  Parameter homes: a
vector in chunks of VECTOR_CHUNK_BYTES over rotating tiles
(planner.lowering.lower), any other parameter in whole rows over as many
tiles as possible, moved into the op's blocks each time it runs.

Expansion: one vertex per block, the kernel call the op declares for it
(`op.row_call`), with the operands' addresses filled in.  An absorbed Cast
(a conversion, planner.lowering.lower) is expanded by `expand_cast_step`:
one CAST vertex per cell and replica of the value it converts.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kernels import abi
from planner.decide.layout import Layout, even_cuts, row_layout, step_cuts
from planner.decide.recipe import Recipe
from planner.ir.graph import DTYPE_BYTES, Graph, Op, view2d
from planner.ir.opkind import ROW, TABLE, VECTOR, Operand, RowCell, RowOp, Segment
from planner.lowering.expand_ops import ExpandContext, Operands, make_vertex, scalars
from planner.lowering.expand_redist import Loc
from planner.lowering.lowered import Step, Value
from planner.lowering.placement import Layouts, register_placement
from planner.lowering.program import Phase, Vertex


@register_placement("rows")
class RowsPlacement:
    """Layouts and expansion of the rows family (module docstring)."""

    def layouts(self, lw: Any, g: Graph, op: Op, recipe: Recipe) -> Layouts:
        assert isinstance(op, RowOp)
        return row_layouts(lw, g, op, recipe)

    def expand(self, ctx: ExpandContext, step: Step) -> None:
        ctx.params(step)
        expand_rows(ctx, step)


def operand_fields(op: Op) -> tuple[str, ...]:
    """The read fields of `op` that name a tensor, in READS order (the order
    of `op.inputs`)."""
    return tuple(f for f in op.READS if getattr(op, f) is not None)


def row_layouts(lw: Any, g: Graph, op: RowOp, r: Recipe) -> Layouts:
    """Input layouts (op.inputs order), output layout, parameter homes."""
    rows, cols = view2d(g.tensor(getattr(op, op.READS[0])).shape)
    tiles = lw.device.tiles
    if r.grid == (0,):  # in place: the cells the leading operand arrives in
        src = lw.arriving_layout(getattr(op, op.READS[0]))
        lay = Layout(rows, cols, src.row_cuts, src.col_cuts,
                     tuple((o[0],) for o in src.owners))
    elif len(r.grid) == 2:  # elementwise grid: row blocks × column blocks, spread
        rc, cc = step_cuts(rows, r.grid[0]), even_cuts(cols, r.grid[1])
        n = (len(rc) - 1) * (len(cc) - 1)
        lay = Layout(rows, cols, rc, cc, tuple((t,) for t in lw.spread(n)))
    else:
        lay = row_layout(rows, cols, r.grid[0], tiles, lw.plan, lw.op_shift)
    nr, nc = lay.nr, lay.nc
    ins: list[Layout] = []
    homes: dict[str, Layout] = {}
    for f in operand_fields(op):
        name = getattr(op, f)
        t = g.tensor(name)
        kind = op.OPERANDS[f]
        own_rows, own_cols = view2d(t.shape)
        if kind == ROW:
            ins.append(lay)
        elif kind == VECTOR:
            ins.append(Layout(1, cols, (0, 1), lay.col_cuts, tuple(
                tuple(lay.owners[ri * nc + ci][0] for ri in range(nr)) for ci in range(nc))))
        elif kind == TABLE:
            ins.append(Layout(rows, own_cols, lay.row_cuts, (0, own_cols), tuple(
                tuple(lay.owners[ri * nc + ci][0] for ci in range(nc)) for ri in range(nr))))
        else:  # WHOLE: on every tile of the op
            on = tuple(dict.fromkeys(o[0] for o in lay.owners))
            ins.append(Layout(own_rows, own_cols, (0, own_rows), (0, own_cols), (on,)))
        if t.kind != "parameter":
            continue
        if kind == VECTOR:
            homes[name] = lw.vector_home(own_cols, DTYPE_BYTES[t.dtype], lw.qual(name))
        else:  # whole rows over as many tiles as possible (balanced homes)
            homes[name] = row_layout(own_rows, own_cols, -(-own_rows // tiles), tiles, lw.plan)
    return tuple(ins), lay, homes


def operand_segments(g: Graph, op: Op, name: str) -> tuple[Segment, ...]:
    """Segments moving tensor `name` into `op`'s layout of it: row-periodic
    for a "row" or "table" operand with fewer rows than the leading operand
    (row r of the layout is row r mod rows of the tensor), else identity."""
    rows, cols = view2d(g.tensor(name).shape)
    if isinstance(op, RowOp):
        kinds = [op.OPERANDS[f] for f in operand_fields(op) if getattr(op, f) == name]
        total = view2d(g.tensor(getattr(op, op.READS[0])).shape)[0]
        if kinds and kinds[0] in (ROW, TABLE) and rows < total:
            return tuple((s, s + rows, 0, 0, 0, cols) for s in range(0, total, rows))
    return ((0, rows, 0, 0, 0, cols),)


def _operand(v: Value, kind: str, rows: int, cols: int) -> Operand:
    """How operand value `v` lies on the tile for a block of rows × cols."""
    lay = v.layout
    if kind == VECTOR:
        return Operand(v.dtype, v.scale_exp, 1, cols, 0)
    if kind == ROW:
        return Operand(v.dtype, v.scale_exp, rows, cols, cols * v.elem)
    width = lay.col_cuts[-1]
    if kind == TABLE:
        return Operand(v.dtype, v.scale_exp, rows, width, width * v.elem)
    return Operand(v.dtype, v.scale_exp, lay.row_cuts[-1], width, width * v.elem)


@lru_cache(maxsize=8192)
def block_args(op: RowOp, cell: RowCell
               ) -> tuple[int, tuple[int, ...], tuple[tuple[int, str], ...]]:
    """(kernel id, argument slots, (address slot, field) pairs) of the op's
    kernel call on `cell` (memoised: the blocks of one op share a few shapes)."""
    kc = op.row_call(cell)
    names = abi.KERNEL_ARGS[kc.kernel]
    return (abi.KERNEL_IDS[kc.kernel], scalars(kc.kernel, **kc.scalar_slots()),
            tuple((names.index(arg), field) for arg, field in kc.operands))


def expand_rows(ctx: ExpandContext, step: Step) -> None:
    """One vertex per block of the leading operand's layout (module docstring)."""
    op = step.op
    assert isinstance(op, RowOp)
    fields = operand_fields(op)
    ins = dict(zip(fields, (ctx.value(v) for v in step.inputs), strict=True))
    ov = ctx.value(step.outputs[0])
    lay = ins[fields[0]].layout
    if lay.nc > 1 and not op.ELEMENTWISE:
        raise AssertionError(f"{step.label}: row kernel on column blocks")
    ctx.materialise(ov)
    locs = {f: ctx.locs(v.name) for f, v in ins.items()}
    po = ctx.locs(ov.name)
    out_field = op.WRITES[0]
    total_rows, total_cols = lay.row_cuts[-1], lay.col_cuts[-1]
    positional = op.positional()
    phase = Phase("compute", step.label)
    for ri, ci in lay.cells():
        c = ri * lay.nc + ci
        tile = lay.owners[c][0]
        r0, r1, c0, c1 = lay.rect(ri, ci)
        rows, cols = r1 - r0, c1 - c0
        operands = tuple((f, _operand(ins[f], op.OPERANDS[f], rows, cols)) for f in fields)
        at = (r0, c0) if positional else (0, 0)  # blocks of one shape share their args
        cell = RowCell(rows, cols, *at, total_rows, total_cols,
                       operands + ((out_field, _operand(ov, ROW, rows, cols)),))
        kid, args, slots = block_args(op, cell)
        reads: Operands = ()
        writes: Operands = ()
        for slot, f in slots:
            if f == out_field:
                writes += ((slot, po[c][0]),)
                continue
            kind = op.OPERANDS[f]
            p = locs[f]
            if kind == ROW:
                loc: Loc = p[c][0]
            elif kind == VECTOR:
                loc = p[ci][ri]
            elif kind == TABLE:
                loc = p[ri][ci]
            else:
                loc = p[0][ins[f].layout.owners[0].index(tile)]
            reads += ((slot, loc),)
        phase.vertices.append(make_vertex(tile, kid, args, reads, writes))
    ctx.emit(phase)


def conversion_vertex(op: RowOp, tile: int, xv: Value, yv: Value, x: Loc, y: Loc, rows: int,
                      cols: int) -> Vertex:
    """The vertex of conversion `op` (a Cast) of one rows × cols cell from
    `xv` at `x` into `yv` at `y` on `tile`."""
    cell = RowCell(rows, cols, 0, 0, rows, cols,
                   ((op.READS[0], _operand(xv, ROW, rows, cols)),
                    (op.WRITES[0], _operand(yv, ROW, rows, cols))))
    kid, args, slots = block_args(op, cell)
    reads = tuple((s, x) for s, f in slots if f != op.WRITES[0])
    writes = tuple((s, y) for s, f in slots if f == op.WRITES[0])
    return make_vertex(tile, kid, args, reads, writes)


def expand_cast_step(ctx: ExpandContext, step: Step) -> None:
    """An absorbed conversion: every cell and replica of a value, in its layout."""
    op = step.op
    assert isinstance(op, RowOp)
    xv, yv = ctx.value(step.inputs[0]), ctx.value(step.outputs[0])
    ctx.materialise(yv, kind="exchange-landing")
    px, py = ctx.locs(xv.name), ctx.locs(yv.name)
    lay = xv.layout
    phase = Phase("compute", f"cast {step.label}")
    for ri, ci in lay.cells():
        r0, r1, c0, c1 = lay.rect(ri, ci)
        cell = ri * lay.nc + ci
        for k, tile in enumerate(lay.owners[cell]):
            phase.vertices.append(conversion_vertex(op, tile, xv, yv, px[cell][k], py[cell][k],
                                                    r1 - r0, c1 - c0))
    ctx.emit(phase)
