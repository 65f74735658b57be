"""Gelu in one of three forms, fp32 inside, one rounding: `form` "tanh" (the
tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), ViT and
SigLIP), "erf" (the exact 0.5 x (1 + erf(x / sqrt(2))), BERT and
DeiT) or "quick" (CLIP's x · sigmoid(1.702 x)); kernels.formulas.  The GELU
kernel with that form, elementwise."""

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
    one_of,
    register_op,
    same_shape,
)

FORMS = {"tanh": formulas.ACT_GELU_TANH, "erf": formulas.ACT_GELU_ERF,
         "quick": formulas.ACT_QUICK_GELU}


@register_op
@dataclass(frozen=True)
class Gelu(RowOp):
    """GELU in fp32, `form` "tanh" | "erf" | "quick" (module docstring)."""

    READS: ClassVar[tuple[str, ...]] = ("x",)
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW}
    ELEMENTWISE: ClassVar[bool] = True

    x: str
    out: str
    form: str = "tanh"

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)
        one_of(self, "form", self.form, tuple(FORMS))

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.activation(FORMS[self.form], env[self.x])

    def row_call(self, c: RowCell) -> KernelCall:
        extra = {"form": FORMS[self.form]} if self.form != "tanh" else {}
        return call("GELU", {"x": "x", "y": "out"}, ldx=c["x"].ld, ldy=c["out"].ld, M=c.rows,
                    N=c.cols, **extra)
