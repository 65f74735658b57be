"""MatMul: out[M, N] = a[M, K] @ b[K, N] (+ bias[N]), fp32 accumulation, one rounding.

The "matmul" family (planner.decide.families.matmul, planner.lowering.families.matmul)
places it on a grid of tiles; `b` is the weight, `bias` its bias.  An fp8 `a`
whose Cast runs before the move arrives narrow (NARROW_OPERAND).

`partials` is the dtype of the partial sums a K-split recipe exchanges and
reduces: "fp16" (default; what the published IPU21 runs reduce, the vendor
matmul's "half" partials type: half the partial-sum exchange, each partial
rounded once to fp16 before the fp32 sum) or "fp32" (exact fp32 partials).
A recipe that does not split K has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from planner.ir.graph import DTYPES, Graph, OpBase
from planner.ir.opkind import ACT, dtype_in, rank, register_op
from tilecommon.errors import GraphError

PARTIALS = ("fp16", "fp32")  # dtypes of K-split partial sums


@register_op
@dataclass(frozen=True)
class MatMul(OpBase):
    """out[M,N] = a[M,K] @ b[K,N] (+ bias[N]), fp32 accumulation, one rounding."""

    READS: ClassVar[tuple[str, ...]] = ("a", "b", "bias")
    FAMILY: ClassVar[str] = "matmul"
    NARROW_OPERAND: ClassVar[str | None] = "a"

    a: str
    b: str
    out: str
    bias: str | None = None
    partials: str = "fp16"

    def check(self, g: Graph) -> None:
        if self.partials not in PARTIALS:
            raise GraphError(self.name, f"partials {self.partials!r} not in {PARTIALS}")
        a, b, out = g.tensor(self.a), g.tensor(self.b), g.tensor(self.out)
        for t in (a, b, out):
            rank(self, t, 2)
        dtype_in(self, a, DTYPES)
        if a.dtype != b.dtype:
            raise GraphError(self.name, f"operand dtypes differ: {a.dtype} vs {b.dtype}")
        dtype_in(self, out, ACT)
        if a.shape[1] != b.shape[0]:
            raise GraphError(self.name, f"inner dims differ: {self.a} {a.shape} @ {self.b} "
                                        f"{b.shape}")
        if out.shape != (a.shape[0], b.shape[1]):
            raise GraphError(self.name, f"out {out.shape} != {(a.shape[0], b.shape[1])}")
        if self.bias is not None:
            bias = g.tensor(self.bias)
            dtype_in(self, bias, ACT)
            if bias.shape != (b.shape[1],):
                raise GraphError(self.name, f"bias {bias.shape} != {(b.shape[1],)}")

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        y = env[self.a] @ env[self.b]
        return y if self.bias is None else y + env[self.bias]

    def macs(self, g: Graph) -> int:
        m, k = g.tensor(self.a).shape
        return m * k * g.tensor(self.b).shape[1]

    def param_roles(self) -> dict[str, str]:
        roles = {self.b: "weight"}
        if self.bias is not None:
            roles[self.bias] = "bias"
        return roles
