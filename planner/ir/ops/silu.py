"""Silu and Tanh: the other activations, fp32 inside, one rounding
(kernels.formulas: silu(x) = x · sigmoid(x), the LLaMA-family MLP's; tanh,
BERT's pooler); the GELU (activation) kernel with form SiLU or tanh,
elementwise."""

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


@dataclass(frozen=True)
class _Activation(RowOp):
    """An fp16/fp32 elementwise activation of the GELU kernel's `FORM`."""

    READS: ClassVar[tuple[str, ...]] = ("x",)
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW}
    ELEMENTWISE: ClassVar[bool] = True
    FORM: ClassVar[int] = formulas.ACT_SILU

    x: str
    out: str

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.activation(self.FORM, env[self.x])

    def row_call(self, c: RowCell) -> KernelCall:
        return call("GELU", {"x": "x", "y": "out"}, ldx=c["x"].ld, ldy=c["out"].ld, M=c.rows,
                    N=c.cols, form=self.FORM)


@register_op
@dataclass(frozen=True)
class Silu(_Activation):
    """out = x · sigmoid(x) in fp32."""

    FORM: ClassVar[int] = formulas.ACT_SILU


@register_op
@dataclass(frozen=True)
class Tanh(_Activation):
    """out = tanh(x) in fp32."""

    FORM: ClassVar[int] = formulas.ACT_TANH
