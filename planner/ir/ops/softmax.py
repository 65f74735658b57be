"""Softmax over the last dim of x * scale, max-subtracted, fp32 inside
(kernels.formulas.softmax); the SOFTMAX kernel on blocks of whole rows.

Attention masks (x is the scores [B·heads, Tq, Tk], seen as rows of Tk):
- `mask`: an additive mask [R, Tk] (an input or parameter, fp16), row r of
  the scores adding mask row (r // mask_rep) % R: a key-padding mask [B, Tk]
  has mask_rep = heads·Tq, a [Tq, Tk] mask mask_rep = 1;
- `causal` = Tq (0: bidirectional): query q = r mod Tq sees keys 0 ..
  q + (Tk - Tq); the masked triangle's work is skipped (the kernel computes
  max, exp and sum over the visible keys and writes zeros, its cost counts
  the visible keys: kernels/softmax.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from kernels import formulas
from planner.ir.graph import Graph, view2d
from planner.ir.opkind import (
    ACT,
    ROW,
    WHOLE,
    KernelCall,
    RowCell,
    RowOp,
    call,
    dtype_in,
    positive_float,
    register_op,
    same_shape,
)
from tilecommon.errors import GraphError


@register_op
@dataclass(frozen=True)
class Softmax(RowOp):
    """Softmax over the last dim of x*scale, max-subtracted, fp32 inside; an
    additive `mask` and a `causal` mask optional (module docstring)."""

    READS: ClassVar[tuple[str, ...]] = ("x", "mask")
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW, "mask": WHOLE}

    x: str
    out: str
    scale: float
    mask: str | None = None
    mask_rep: int = 1
    causal: int = 0

    def check(self, g: Graph) -> None:
        x, out = g.tensor(self.x), g.tensor(self.out)
        same_shape(self, "out shape", x, out)
        dtype_in(self, x, ACT)
        dtype_in(self, out, ACT)
        positive_float(self, "scale", self.scale)
        rows, keys = view2d(x.shape)
        if not isinstance(self.causal, int) or self.causal < 0 or self.causal > keys or (
                self.causal and rows % self.causal):
            raise GraphError(self.name, f"causal {self.causal!r} must be 0 or the queries per "
                                        f"sequence (at most {keys}, dividing {rows} rows)")
        if self.causal and len(x.shape) == 3 and self.causal != x.shape[1]:
            raise GraphError(self.name, f"causal {self.causal} != {x.name}'s {x.shape[1]} "
                                        f"queries")
        if self.mask is None:
            return
        m = g.tensor(self.mask)
        dtype_in(self, m, ACT)
        if len(m.shape) != 2 or m.shape[1] != keys:
            raise GraphError(self.name, f"mask {m.shape} must be [rows, {keys}]")
        if not isinstance(self.mask_rep, int) or self.mask_rep < 1 or \
                rows % (self.mask_rep * m.shape[0]):
            raise GraphError(self.name, f"mask_rep {self.mask_rep!r} x {m.shape[0]} mask rows "
                                        f"must divide {rows} rows")

    def _row_terms(self, rows: int, keys: int, env: Mapping[str, Any]
                   ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(additive mask per row, visible keys per row) of the whole softmax."""
        r = np.arange(rows)
        add = None
        if self.mask is not None:
            m = np.asarray(env[self.mask], dtype=np.float32)
            add = m[(r // self.mask_rep) % m.shape[0]]
        valid = None
        if self.causal:
            valid = np.minimum(keys, r % self.causal + 1 + keys - self.causal)
        return add, valid

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        x = np.asarray(env[self.x], dtype=np.float32)
        rows, keys = view2d(x.shape)
        add, valid = self._row_terms(rows, keys, env)
        y = formulas.softmax(x.reshape(rows, keys), float(np.float32(self.scale)), add, valid)
        return y.reshape(x.shape)

    def param_roles(self) -> dict[str, str]:
        return {self.mask: "mask"} if self.mask is not None else {}

    def positional(self) -> bool:
        return self.causal > 0 or self.mask is not None

    def row_call(self, c: RowCell) -> KernelCall:
        masks: dict[str, int] = {}
        operands = {"x": "x", "y": "out"}
        if self.mask is not None:
            operands["mask"] = "mask"
            masks.update(ldm=c["mask"].ld, mask_rep=self.mask_rep, mask_rows=c["mask"].rows)
        if self.causal:
            masks["causal"] = self.causal
        if masks:
            masks["row0"] = c.row0
        return call("SOFTMAX", operands, ldx=c["x"].ld, ldy=c["out"].ld, M=c.rows, N=c.cols,
                    scale=self.scale, dtype_x=c.dt("x"), dtype_y=c.dt("out"), **masks)
