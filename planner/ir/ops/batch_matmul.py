"""BatchMatMul: the attention products, out[Bt, M, N] = a[Bt, M, K] @ b[Bt, K, N]
(b is [Bt, N, K] when `transpose_b`), fp32 accumulation, one rounding.

Grouped-query attention: with `kv_group` = g > 1, b has Bt / g batches and a's
batch t multiplies b's batch t // g (q heads h·g ... h·g + g - 1 of a
sequence share kv head h: batches are sequence-major, heads within), so k
and v are never copied per q head in the graph; the tiles of the q heads of
one group each receive that kv head.  The "bmm" family places it (batches
or row blocks of one batch per tile).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from planner.ir.graph import DTYPES, Graph, OpBase
from planner.ir.opkind import ACT, dtype_in, rank, register_op
from tilecommon.errors import GraphError


@register_op
@dataclass(frozen=True)
class BatchMatMul(OpBase):
    """out[Bt,M,N] = a[Bt,M,K] @ b[Bt,K,N] (b is [Bt,N,K] when transpose_b)."""

    READS: ClassVar[tuple[str, ...]] = ("a", "b")
    FAMILY: ClassVar[str] = "bmm"
    NARROW_OPERAND: ClassVar[str | None] = "a"

    a: str
    b: str
    out: str
    transpose_b: bool = False
    kv_group: int = 1

    def check(self, g: Graph) -> None:
        a, b, out = g.tensor(self.a), g.tensor(self.b), g.tensor(self.out)
        for t in (a, b, out):
            rank(self, t, 3)
        dtype_in(self, a, DTYPES)
        if a.dtype != b.dtype:
            raise GraphError(self.name, f"operand dtypes differ: {a.dtype} vs {b.dtype}")
        dtype_in(self, out, ACT)
        grp = self.kv_group
        if not isinstance(grp, int) or grp < 1 or a.shape[0] % grp:
            raise GraphError(self.name, f"kv_group {grp!r} must divide {a.shape[0]} batches")
        k_b, n = (b.shape[2], b.shape[1]) if self.transpose_b else (b.shape[1], b.shape[2])
        if a.shape[0] != b.shape[0] * grp or a.shape[2] != k_b:
            raise GraphError(self.name, f"shapes {a.shape} @ {b.shape} (transpose_b="
                                        f"{self.transpose_b}) mismatch")
        if out.shape != (a.shape[0], a.shape[1], n):
            raise GraphError(self.name, f"out {out.shape} != {(a.shape[0], a.shape[1], n)}")

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        b = env[self.b]
        if self.kv_group > 1:
            b = np.repeat(b, self.kv_group, axis=0)
        return env[self.a] @ (np.swapaxes(b, 1, 2) if self.transpose_b else b)

    def macs(self, g: Graph) -> int:
        bt, m, k = g.tensor(self.a).shape
        return bt * m * k * g.tensor(self.out).shape[2]
