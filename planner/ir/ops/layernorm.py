"""LayerNorm over the last dim of x [M, N]: fp32 statistics (two-pass, biased
variance), y = (x - mean) / sqrt(var + eps) * gamma + beta; the LAYERNORM
kernel on blocks of whole rows (kernels/layernorm.py)."""

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
    VECTOR,
    KernelCall,
    RowCell,
    RowOp,
    call,
    dtype_in,
    positive_float,
    rank,
    register_op,
    same_shape,
)
from tilecommon.errors import GraphError


@register_op
@dataclass(frozen=True)
class LayerNorm(RowOp):
    """Over the last dim of x [M,N]; fp32 statistics (two-pass, biased variance)."""

    READS: ClassVar[tuple[str, ...]] = ("x", "gamma", "beta")
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW, "gamma": VECTOR, "beta": VECTOR}

    x: str
    gamma: str
    beta: str
    out: str
    eps: float

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        rank(self, x, 2)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)
        for p in (g.tensor(self.gamma), g.tensor(self.beta)):
            dtype_in(self, p, ACT)
            if p.shape != (x.shape[1],):
                raise GraphError(self.name, f"{p.name} {p.shape} != {(x.shape[1],)}")
        positive_float(self, "eps", self.eps, below=1.0)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.layernorm(env[self.x], env[self.gamma], env[self.beta],
                                  float(np.float32(self.eps)))

    def param_roles(self) -> dict[str, str]:
        return {self.gamma: "gamma", self.beta: "beta"}

    def row_call(self, c: RowCell) -> KernelCall:
        return call("LAYERNORM", {"x": "x", "gamma": "gamma", "beta": "beta", "y": "out"},
                    ldx=c["x"].ld, ldy=c["out"].ld, M=c.rows, N=c.cols, eps=self.eps)
