"""The "move" recipe family: a move op (SplitHeads, MergeHeads, Broadcast,
...) is one redistribution into its output's canonical layout, recipe
`heads`: one exchange phase bound by the canonical owner's bytes."""

from __future__ import annotations

import math

from planner.decide.recipe import Recipe, canon_rpo, exchange_cycles, register_family
from planner.ir.graph import DTYPE_BYTES, Graph, Op, view2d
from simulator.device import Device


@register_family("move")
class MoveFamily:
    """The one recipe of a move op (module docstring)."""

    def generate(self, g: Graph, op: Op, device: Device, packing: str, memo: dict,
                 narrow: bool) -> list[Recipe]:
        return [move_recipe(g, op, device, packing)]

    def from_key(self, g: Graph, op: Op, device: Device, key: str, packing: str, memo: dict,
                 narrow: bool) -> Recipe | None:
        return move_recipe(g, op, device, packing) if key == "heads" else None


def move_recipe(g: Graph, op: Op, device: Device,
                  packing: str) -> Recipe:
    out = g.tensor(op.outputs[0])
    rpo = canon_rpo(g, op.outputs[0], device, packing)
    cols = view2d(out.shape)[1]
    nbytes = rpo * cols * DTYPE_BYTES[out.dtype]
    xcyc = exchange_cycles(nbytes, device)
    return Recipe(cycles=xcyc, mem_bytes=nbytes, key="heads", family="heads", grid=(),
                  compute_cycles=0, exchange_cycles=xcyc, syncs=1, in_bytes=nbytes,
                  out_bytes=nbytes,
                  xbytes=nbytes, tiles=math.ceil(view2d(out.shape)[0] / rpo))
