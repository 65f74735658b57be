"""Gelu: the tanh-form GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
in fp32 (kernels.formulas.gelu); the GELU kernel, elementwise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kernels import formulas
from planner.ir.graph import Graph
from planner.ir.opkind import (
    ACT,
    ROW,
    KernelCall,
    RowCell,
    RowOp,
    call,
    dtype_in,
    register_op,
    same_shape,
)


@register_op
@dataclass(frozen=True)
class Gelu(RowOp):
    """Tanh-form GELU in fp32."""

    READS: ClassVar[tuple[str, ...]] = ("x",)
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW}
    ELEMENTWISE: ClassVar[bool] = True

    x: str
    out: str

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.gelu(env[self.x])

    def row_call(self, c: RowCell) -> KernelCall:
        return call("GELU", {"x": "x", "y": "out"}, ldx=c["x"].ld, ldy=c["out"].ld, M=c.rows,
                    N=c.cols)
