"""Broadcast: x [R, N] -> out [B·R, N] with out[r] = x[r mod R], a row-periodic
copy (the MAP head's learned probe repeated over the batch); a pure move."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from planner.ir.graph import Graph
from planner.ir.opkind import MoveOp, Segment, rank, register_op
from tilecommon.errors import GraphError


@register_op
@dataclass(frozen=True)
class Broadcast(MoveOp):
    """x [R, N] -> out [B·R, N] with out[r] = x[r mod R] (row-periodic copy)."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        rank(self, x, 2)
        rank(self, out, 2)
        if (x.dtype, x.scale_exp) != (out.dtype, out.scale_exp):
            raise GraphError(self.name, f"format changes {x.dtype} -> {out.dtype}")
        if x.shape[1] != out.shape[1] or out.shape[0] % x.shape[0]:
            raise GraphError(self.name, f"out {out.shape} is not a whole number of copies of "
                                        f"{x.name} {x.shape}")

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        x = env[self.x]
        return np.tile(x, (g.tensor(self.out).shape[0] // x.shape[0], 1))

    def segments(self, g: Graph) -> tuple[Segment, ...]:
        xr, cols = g.tensor(self.x).shape
        total = g.tensor(self.out).shape[0]
        return tuple((r, r + xr, 0, 0, 0, cols) for r in range(0, total, xr))
