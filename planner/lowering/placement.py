"""How a recipe family lays an op out and expands it: `Placement`, by family.

An op kind names its family (planner.ir.opkind: FAMILY); lowering asks the
family's placement for the op's input layouts, output layout and parameter
homes under the chosen recipe (`layouts`), and expansion asks it for the
op's vertices and transfers (`expand`).  The built-in placements are the
modules of planner.lowering.families (matmul, bmm, rows, move); a new family
registers one with `register_placement`, as they do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from planner.decide.layout import Layout
    from planner.decide.recipe import Recipe
    from planner.ir.graph import Graph, Op
    from planner.lowering.expand_ops import ExpandContext
    from planner.lowering.lowered import Step

Layouts = tuple[tuple["Layout", ...], "Layout", dict[str, "Layout"]]


class Placement(Protocol):
    """`layouts(lw, g, op, recipe)`: the layouts of `op`'s inputs (in
    `op.inputs` order), of its output, and the homes of the parameters it
    reads (by tensor name), placed by the lowerer `lw`
    (planner.lowering.lower: its rotation, spread, canonical layouts and
    plan); `expand(ctx, step)`: the vertices and transfers of one lowered
    compute step of the op (planner.lowering.expand_ops.ExpandContext)."""

    def layouts(self, lw: Any, g: Graph, op: Op, recipe: Recipe) -> Layouts: ...

    def expand(self, ctx: ExpandContext, step: Step) -> None: ...


PLACEMENTS: dict[str, Placement] = {}


def register_placement(name: str) -> Callable[[type], type]:
    """Class decorator: an instance of the class places the family `name`."""
    def add(cls: type) -> type:
        if name in PLACEMENTS:
            raise ValueError(f"placement of family {name!r} registered twice")
        PLACEMENTS[name] = cls()
        return cls
    return add
