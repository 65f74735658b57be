"""Rows: out [len(rows), N] = x [R, N] rows `rows` (static indices, any order,
repeats allowed), a pure move: the first token of each image (a ViT's class
token, BERT's [CLS]), the last position of each sequence (an LLM's next-token
logits), a slice of a position table, one row of a token-type table."""

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
class Rows(MoveOp):
    """out[i] = x[rows[i]] (row gather with static indices)."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str
    rows: tuple[int, ...]

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        rank(self, x, 2)
        rank(self, out, 2)
        if (x.dtype, x.scale_exp) != (out.dtype, out.scale_exp):
            raise GraphError(self.name, f"format changes {x.dtype} -> {out.dtype}")
        if not isinstance(self.rows, tuple) or not all(
                isinstance(r, int) and 0 <= r < x.shape[0] for r in self.rows):
            raise GraphError(self.name, f"rows must be a tuple of row indices of {x.name} "
                                        f"{x.shape}")
        if out.shape != (len(self.rows), x.shape[1]):
            raise GraphError(self.name, f"out {out.shape} != {(len(self.rows), x.shape[1])}")

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return np.asarray(env[self.x])[list(self.rows)]

    def segments(self, g: Graph) -> tuple[Segment, ...]:
        cols = g.tensor(self.x).shape[1]
        out: list[Segment] = []
        i = 0
        while i < len(self.rows):  # runs of consecutive source rows are one segment
            j = i + 1
            while j < len(self.rows) and self.rows[j] == self.rows[j - 1] + 1:
                j += 1
            out.append((i, j, 0, self.rows[i], 0, cols))
            i = j
        return tuple(out)
