"""RMSNorm over the last dim of x [M, N]: y = x / sqrt(mean(x²) + eps) · gamma,
fp32 statistics (kernels.formulas.rmsnorm); the RMSNORM kernel on blocks of
whole rows (kernels/layernorm.py)."""

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
class RMSNorm(RowOp):
    """Over the last dim of x [M,N]: x / sqrt(mean(x²) + eps) * gamma."""

    READS: ClassVar[tuple[str, ...]] = ("x", "gamma")
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW, "gamma": VECTOR}

    x: str
    gamma: str
    out: str
    eps: float

    def check(self, g: Graph) -> None:
        x, out, gamma = g.tensor(self.x), g.tensor(self.out), g.tensor(self.gamma)
        rank(self, x, 2)
        same_shape(self, "out shape", x, out)
        for t in (x, out, gamma):
            dtype_in(self, t, ACT)
        if gamma.shape != (x.shape[1],):
            raise GraphError(self.name, f"{gamma.name} {gamma.shape} != {(x.shape[1],)}")
        positive_float(self, "eps", self.eps, below=1.0)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.rmsnorm(env[self.x], env[self.gamma], float(np.float32(self.eps)))

    def param_roles(self) -> dict[str, str]:
        return {self.gamma: "gamma"}

    def row_call(self, c: RowCell) -> KernelCall:
        return call("RMSNORM", {"x": "x", "gamma": "gamma", "y": "out"}, ldx=c["x"].ld,
                    ldy=c["out"].ld, M=c.rows, N=c.cols, eps=self.eps)
