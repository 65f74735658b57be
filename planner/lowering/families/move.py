"""Placement of the "move" family (SplitHeads, MergeHeads, Broadcast, ...):
the redistribution itself is the op.  It reads its input where the source
value is (canonical, or the producer's layout when that boundary is open; a
parameter from its canonical home) and writes the canonical layout of its
output; expansion is one redistribution by the op's segments (`op.segments`,
recorded in the lowered step)."""

from __future__ import annotations

from typing import Any

from planner.decide.recipe import Recipe
from planner.ir.graph import Graph, Op
from planner.lowering.expand_ops import ExpandContext
from planner.lowering.lowered import Step
from planner.lowering.placement import Layouts, register_placement
from tilecommon.errors import BuildFailure


@register_placement("move")
class MovePlacement:
    """Layouts and expansion of the move family (module docstring)."""

    def layouts(self, lw: Any, g: Graph, op: Op, recipe: Recipe) -> Layouts:
        if lw.op_shift:
            raise BuildFailure("lower", -1, 0, 0, f"tile shift of {lw.qual(op.name)}: a "
                                                  f"move op has no placement of its own")
        x = lw.qual(op.inputs[0])
        src = lw.source.get(x)
        lay = lw.out.values[src].layout if src else lw.canonical(x)
        homes = {op.inputs[0]: lay} if x in lw.params else {}
        return (lay,), lw.canonical(lw.qual(op.outputs[0])), homes

    def expand(self, ctx: ExpandContext, step: Step) -> None:
        ctx.redistribute(step.inputs[0], step.outputs[0], step.segments, step.label,
                         step.row_moves)
