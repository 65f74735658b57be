"""Rope: rotary position embedding of q or k, rotate-half form (the LLaMA /
Qwen convention): x [B·T, heads·head_dim] with tables cos, sin [T,
head_dim / 2] (parameters: row t is position t; `theta` says how
`init_params` fills them, cos(t · theta^(-2i/head_dim)), sin likewise); per
head, with x1, x2 its halves, out = [x1·cos − x2·sin, x2·cos + x1·sin]
(kernels.formulas.rope).  The ROPE kernel on blocks of whole rows, the
tables read row-periodically (row r is position r mod T)."""

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
    TABLE,
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


def rope_tables(positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) [positions, head_dim / 2] float32 of the standard rotary
    frequencies theta^(-2i / head_dim), computed in float64."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@register_op
@dataclass(frozen=True)
class Rope(RowOp):
    """Rotary embedding of x [B·T, heads·head_dim] by cos/sin [T, head_dim/2]."""

    READS: ClassVar[tuple[str, ...]] = ("x", "cos", "sin")
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW, "cos": TABLE, "sin": TABLE}

    x: str
    cos: str
    sin: str
    out: str
    head_dim: int
    theta: float = 10000.0

    def check(self, g: Graph) -> None:
        x, out, c, s = (g.tensor(n) for n in (self.x, self.out, self.cos, self.sin))
        rank(self, x, 2)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)
        same_shape(self, "sin shape", c, s)
        for t in (c, s):
            dtype_in(self, t, ACT)
        hd = self.head_dim
        if not (isinstance(hd, int) and hd >= 2 and hd % 2 == 0 and x.shape[1] % hd == 0):
            raise GraphError(self.name, f"head_dim {hd!r} must be even and divide "
                                        f"{x.name}'s {x.shape[1]} columns")
        if len(c.shape) != 2 or c.shape[1] != hd // 2 or x.shape[0] % c.shape[0]:
            raise GraphError(self.name, f"{c.name} {c.shape} must be [positions, {hd // 2}] "
                                        f"with positions dividing {x.shape[0]} rows")
        positive_float(self, "theta", self.theta)

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        x = np.asarray(env[self.x], np.float32)
        reps = x.shape[0] // np.shape(env[self.cos])[0]
        c = np.tile(np.asarray(env[self.cos], np.float32), (reps, 1))
        s = np.tile(np.asarray(env[self.sin], np.float32), (reps, 1))
        return formulas.rope(x, c, s, self.head_dim)

    def param_roles(self) -> dict[str, str]:
        return {self.cos: "rope_cos", self.sin: "rope_sin"}

    def init_values(self, g: Graph, name: str) -> Any:
        if name not in (self.cos, self.sin):
            return None
        cos, sin = rope_tables(g.tensor(self.cos).shape[0], self.head_dim, self.theta)
        return cos if name == self.cos else sin

    def row_call(self, c: RowCell) -> KernelCall:
        return call("ROPE", {"x": "x", "cos": "cos", "sin": "sin", "y": "out"},
                    ldx=c["x"].ld, ldt=c["cos"].ld, ldy=c["out"].ld, M=c.rows, N=c.cols,
                    head_dim=self.head_dim, dtype_t=c.dt("cos"))
