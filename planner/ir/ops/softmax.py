"""Softmax over the last dim of x * scale, max-subtracted, fp32 inside
(kernels.formulas.softmax); the SOFTMAX kernel on blocks of whole rows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

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
    positive_float,
    register_op,
    same_shape,
)


@register_op
@dataclass(frozen=True)
class Softmax(RowOp):
    """Softmax over the last dim of x*scale, max-subtracted, fp32 inside."""

    READS: ClassVar[tuple[str, ...]] = ("x",)
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW}

    x: str
    out: str
    scale: float

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)
        positive_float(self, "scale", self.scale)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.softmax(env[self.x], float(np.float32(self.scale)))

    def row_call(self, c: RowCell) -> KernelCall:
        return call("SOFTMAX", {"x": "x", "y": "out"}, ldx=c["x"].ld, ldy=c["out"].ld,
                    M=c.rows, N=c.cols, scale=self.scale, dtype_x=c.dt("x"),
                    dtype_y=c.dt("out"))
