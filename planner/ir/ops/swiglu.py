"""SwiGLU: the gated MLP's product, out = silu(gate) · up in fp32, one
rounding (kernels.formulas.gated): the GELU kernel with form SiLU and its
gate operand, elementwise.  Its inputs are the gate and up projections, two
sibling matmuls of one input that planner.decide.fusion can run as one
recipe, as it does q, k and v."""

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
class SwiGLU(RowOp):
    """out = silu(gate) * up (fp16 operands, fp32 inside)."""

    READS: ClassVar[tuple[str, ...]] = ("gate", "up")
    OPERANDS: ClassVar[dict[str, str]] = {"gate": ROW, "up": ROW}
    ELEMENTWISE: ClassVar[bool] = True

    gate: str
    up: str
    out: str

    def check(self, g: Graph) -> None:
        gate, up, out = g.tensor(self.gate), g.tensor(self.up), g.tensor(self.out)
        same_shape(self, "up shape", gate, up)
        same_shape(self, "out shape", gate, out)
        for t in (gate, up, out):
            dtype_in(self, t, ACT)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.gated(formulas.ACT_SILU, env[self.gate], env[self.up])

    def row_call(self, c: RowCell) -> KernelCall:
        return call("GELU", {"x": "gate", "b": "up", "y": "out"}, ldx=c["gate"].ld,
                    ldb=c["up"].ld, ldy=c["out"].ld, M=c.rows, N=c.cols,
                    form=formulas.ACT_SILU)
