"""SplitHeads and MergeHeads: the attention's head split and merge, pure moves.

SplitHeads: x [B·T, H] -> out [B·heads, T, H/heads] with
out[b·heads + h, t, d] = x[b·T + t, h·dh + d]; MergeHeads is its inverse.
Both are one redistribution from the source's layout into the output's
canonical layout (the "move" family).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from planner.ir.graph import Graph, Tensor
from planner.ir.opkind import MoveOp, Segment, rank, register_op
from tilecommon.errors import GraphError


def _check_heads(op: SplitHeads | MergeHeads, x: Tensor, out: Tensor, flat: Tensor,
                 split: Tensor) -> None:
    rank(op, flat, 2)
    rank(op, split, 3)
    if x.dtype != out.dtype:
        raise GraphError(op.name, f"dtype changes {x.dtype} -> {out.dtype}")
    if op.heads <= 0 or split.shape[0] % op.heads:
        raise GraphError(op.name, f"heads {op.heads} does not divide {split.name} "
                                  f"{split.shape}")
    batch, tokens, dh = split.shape[0] // op.heads, split.shape[1], split.shape[2]
    if flat.shape != (batch * tokens, op.heads * dh):
        raise GraphError(op.name, f"{flat.name} {flat.shape} != {(batch * tokens, op.heads * dh)}"
                                  f" for {split.name} {split.shape} with {op.heads} heads")


@register_op
@dataclass(frozen=True)
class SplitHeads(MoveOp):
    """x [B·T, H] -> out [B·heads, T, H/heads]; out[b·heads+h, t, d] = x[b·T+t, h·dh+d]."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str
    heads: int

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        _check_heads(self, x, out, x, out)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        bh, t, dh = g.tensor(self.out).shape
        x = env[self.x]
        return x.reshape(bh // self.heads, t, self.heads, dh).transpose(0, 2, 1, 3).reshape(
            bh, t, dh)

    def segments(self, g: Graph) -> tuple[Segment, ...]:
        bt, t, dh = g.tensor(self.out).shape
        heads = self.heads
        return tuple(((b * heads + h) * t, (b * heads + h + 1) * t, 0, b * t, h * dh, dh)
                     for b in range(bt // heads) for h in range(heads))


@register_op
@dataclass(frozen=True)
class MergeHeads(MoveOp):
    """Inverse of SplitHeads: x [B·heads, T, dh] -> out [B·T, heads·dh]."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str
    heads: int

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        _check_heads(self, x, out, out, x)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        x = env[self.x]
        bh, t, dh = x.shape
        return x.reshape(bh // self.heads, self.heads, t, dh).transpose(0, 2, 1, 3).reshape(
            -1, self.heads * dh)

    def segments(self, g: Graph) -> tuple[Segment, ...]:
        bt, t, dh = g.tensor(self.x).shape
        heads = self.heads
        return tuple((b * t, (b + 1) * t, h * dh, (b * heads + h) * t, 0, dh)
                     for b in range(bt // heads) for h in range(heads))
