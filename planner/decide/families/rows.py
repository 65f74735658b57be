"""The "rows" recipe family: row-parallel ops (planner.ir.opkind.RowOp).

`rows:<r>`: blocks of r whole rows of the op's leading operand, one per tile
(`rows:<canonical rows per owner>` runs where the canonical value already
is); an ELEMENTWISE op also gets `rows:<r>x<gc>`, r rows × gc column blocks
spread over the device, so every worker of a tile has a row even when rows
are fewer than tiles.  A block's compute is the cycle model of the op's own
kernel call (`op.row_call` of a dense block: planner.ir.opkind.RowCell), the
costliest block of the op (the last rows: a causal softmax's longest).
Exchange phases: the "row" and "table" operands moved in from the canonical
layout (bound by the canonical owner's bytes), the "vector" and "whole"
operands (parameters or masks, moved to every block's tile), the result moved
back to canonical.

`rows:0` (ELEMENTWISE ops only, never generated: the `inplace` proposal kind
asks for it) runs the op where its leading operand arrives: on the cells of
its producer's output layout when the boundary between them is open, else of
the canonical layout (planner.lowering.families.rows).  Its estimate knows no
producer: the elements spread evenly over the device in near-square blocks,
no input phase, the vector operands' and the result's phases as above.
"""

from __future__ import annotations

import math

from planner.decide.recipe import (
    MIN_EW_COLS,
    Recipe,
    call_cycles,
    canon_rpo,
    exchange_cycles,
    register_family,
)
from planner.ir.graph import DTYPE_BYTES, Graph, Op, view2d
from planner.ir.opkind import ROW, TABLE, VECTOR, Operand, RowCell, RowOp
from simulator.device import Device


def block_cell(g: Graph, op: RowOp, rows: int, cols: int, row0: int = 0, col0: int = 0
               ) -> RowCell:
    """The RowCell of a dense block of `rows` × `cols` at (row0, col0) of the
    leading operand: every operand laid out as the rows family lays it on a
    tile (row and table operands dense, a vector one row, a whole tensor
    whole)."""
    lead = g.tensor(getattr(op, op.READS[0]))
    total_rows, total_cols = view2d(lead.shape)
    ops = []
    for field in op.READS + op.WRITES:
        name = getattr(op, field)
        if name is None:
            continue
        t = g.tensor(name)
        e = DTYPE_BYTES[t.dtype]
        kind = op.OPERANDS.get(field, ROW)  # written fields line up with the rows
        own_rows, own_cols = view2d(t.shape)
        if kind == ROW:
            o = Operand(t.dtype, t.scale_exp, rows, cols, cols * e)
        elif kind == TABLE:
            o = Operand(t.dtype, t.scale_exp, rows, own_cols, own_cols * e)
        elif kind == VECTOR:
            o = Operand(t.dtype, t.scale_exp, 1, cols, 0)
        else:  # WHOLE
            o = Operand(t.dtype, t.scale_exp, own_rows, own_cols, own_cols * e)
        ops.append((field, o))
    return RowCell(rows, cols, row0, col0, total_rows, total_cols, tuple(ops))


def block_cycles(g: Graph, op: RowOp, rows: int, cols: int, device: Device,
                 memo: dict | None = None) -> int:
    """Cycles of the op's kernel call on its costliest dense block of
    `rows` × `cols` (the last rows of the leading operand)."""
    total = view2d(g.tensor(getattr(op, op.READS[0])).shape)[0]
    kc = op.row_call(block_cell(g, op, rows, cols, max(0, total - rows)))
    return call_cycles(kc.kernel, device, memo, **kc.named())


def _operand_bytes(g: Graph, op: RowOp, rpo: int, w: int) -> tuple[int, int, int]:
    """Per-tile bytes of a block of rpo × w: (row and table operands, of
    them the "row" operands' bytes per row of the canonical bound, vector and
    whole operands)."""
    moved = vec = per_row = 0
    for field, kind in op.OPERANDS.items():
        name = getattr(op, field)
        if name is None:
            continue
        t = g.tensor(name)
        e = DTYPE_BYTES[t.dtype]
        own_rows, own_cols = view2d(t.shape)
        if kind == ROW:
            moved += rpo * w * e
            per_row += e
        elif kind == TABLE:
            moved += rpo * own_cols * e
        elif kind == VECTOR:
            vec += w * e
        else:
            vec += own_rows * own_cols * e
    return moved, per_row, vec


def row_recipes(g: Graph, op: RowOp, device: Device, packing: str, memo: dict,
                extra: tuple[int, ...] = ()) -> list[Recipe]:
    """Row-parallel recipes (module docstring).  With `extra`, only that grid."""
    x_name = getattr(op, op.READS[0])
    x, out = g.tensor(x_name), g.tensor(op.outputs[0])
    rows, cols = view2d(x.shape)
    e_out = DTYPE_BYTES[out.dtype]
    canon_in = canon_rpo(g, x_name, device, packing)
    canon_out = canon_rpo(g, op.outputs[0], device, packing)
    fastest = math.ceil(rows / device.tiles)
    options = {(canon_in, 1), (canon_out, 1), (fastest, 1)}
    r = fastest
    while r < canon_in:
        options.add((r, 1))
        r *= 2
    if op.ELEMENTWISE:
        for rpo in sorted({min(rows, device.workers), min(rows, 2 * device.workers)}):
            owners = math.ceil(rows / rpo)
            gc = min(cols // MIN_EW_COLS, device.tiles // owners)
            if gc > 1:
                options.add((rpo, gc))
    if extra:
        options = {extra if len(extra) == 2 else (extra[0], 1)}
    recipes = []
    for rpo, gc in sorted(options):
        w = math.ceil(cols / gc)
        compute = block_cycles(g, op, rpo, w, device, memo)
        in_b, per_row, pbytes = _operand_bytes(g, op, rpo, w)
        out_b = rpo * w * e_out
        phases = []
        if (rpo, gc) != (canon_in, 1):
            phases.append(max(in_b, canon_in * cols * per_row))
        if pbytes:
            phases.append(pbytes)
        if (rpo, gc) != (canon_out, 1):
            phases.append(max(out_b, canon_out * cols * e_out))
        xcyc = sum(exchange_cycles(p, device) for p in phases)
        recipes.append(Recipe(
            cycles=compute + xcyc, mem_bytes=in_b + out_b + pbytes,
            key=f"rows:{rpo}" if gc == 1 else f"rows:{rpo}x{gc}",
            family="rows", grid=(rpo,) if gc == 1 else (rpo, gc), compute_cycles=compute,
            exchange_cycles=xcyc, syncs=len(phases), in_bytes=max(phases, default=0),
            out_bytes=out_b if (rpo, gc) != (canon_out, 1) else 0,
            xbytes=(in_b if (rpo, gc) != (canon_in, 1) else 0) + pbytes,
            tiles=math.ceil(rows / rpo) * gc,
        ))
    return recipes


def in_place_recipe(g: Graph, op: RowOp, device: Device, packing: str, memo: dict) -> Recipe:
    """`rows:0` (module docstring)."""
    rows, cols = view2d(g.tensor(getattr(op, op.READS[0])).shape)
    out = g.tensor(op.outputs[0])
    e_out = DTYPE_BYTES[out.dtype]
    gr = min(rows, max(1, round(math.sqrt(device.tiles * rows / cols))))
    gc = max(1, min(cols, device.tiles // gr))
    rb, w = math.ceil(rows / gr), math.ceil(cols / gc)
    compute = block_cycles(g, op, rb, w, device, memo)
    in_b, _per_row, pbytes = _operand_bytes(g, op, rb, w)
    out_b = rb * w * e_out
    canon_out = canon_rpo(g, op.outputs[0], device, packing)
    phases = [p for p in (pbytes, max(out_b, canon_out * cols * e_out)) if p]
    xcyc = sum(exchange_cycles(p, device) for p in phases)
    return Recipe(cycles=compute + xcyc, mem_bytes=in_b + out_b + pbytes, key="rows:0",
                  family="rows", grid=(0,), compute_cycles=compute, exchange_cycles=xcyc,
                  syncs=len(phases), in_bytes=max(phases, default=0), out_bytes=out_b,
                  xbytes=pbytes, tiles=gr * gc)


@register_family("rows")
class RowsFamily:
    """Recipes of the rows family (module docstring)."""

    def generate(self, g: Graph, op: Op, device: Device, packing: str, memo: dict,
                 narrow: bool) -> list[Recipe]:
        assert isinstance(op, RowOp)
        return row_recipes(g, op, device, packing, memo)

    def from_key(self, g: Graph, op: Op, device: Device, key: str, packing: str, memo: dict,
                 narrow: bool) -> Recipe | None:
        assert isinstance(op, RowOp)
        family, _, rest = key.partition(":")
        try:
            grid = tuple(int(x) for x in rest.split("x")) if rest else ()
        except ValueError:
            return None
        if family != "rows" or len(grid) not in (1, 2):
            return None
        if grid == (0,):
            return in_place_recipe(g, op, device, packing, memo) if op.ELEMENTWISE else None
        rows, cols = view2d(g.tensor(getattr(op, op.READS[0])).shape)
        gc = grid[1] if len(grid) == 2 else 1
        if 1 <= grid[0] <= rows and 1 <= gc <= cols and (gc == 1 or op.ELEMENTWISE) \
                and math.ceil(rows / grid[0]) * gc <= device.tiles:
            return row_recipes(g, op, device, packing, memo, extra=grid)[-1]
        return None
