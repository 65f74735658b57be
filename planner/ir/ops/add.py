"""Add: out = a + b in fp32, one rounding; `b` may have fewer rows than `a`
when its rows divide a's (row-periodic broadcast: the position embedding
[T, H] added to [B·T, H]; out[r] = a[r] + b[r mod rows(b)]).  The ADD
kernel, elementwise."""

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
    register_op,
    same_shape,
)
from tilecommon.errors import GraphError


def periodic_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Unrounded `a + b` in float32; `b` may have fewer rows than `a`, repeated
    row-periodically (`out[r] = a[r] + b[r mod rows(b)]`)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.shape == b.shape:
        return formulas.add(a, b)
    return formulas.add(a.reshape(-1, *b.shape), b).reshape(a.shape)


@register_op
@dataclass(frozen=True)
class Add(RowOp):
    """out = a + b in fp32, one rounding; b may be row-periodic (module docstring)."""

    READS: ClassVar[tuple[str, ...]] = ("a", "b")
    OPERANDS: ClassVar[dict[str, str]] = {"a": ROW, "b": ROW}
    ELEMENTWISE: ClassVar[bool] = True

    a: str
    b: str
    out: str

    def check(self, g: Graph) -> None:
        a, b, out = g.tensor(self.a), g.tensor(self.b), g.tensor(self.out)
        same_shape(self, "out shape", a, out)
        for t in (a, b, out):
            dtype_in(self, t, ACT)
        if a.shape == b.shape:
            return
        if len(a.shape) != len(b.shape) or a.shape[1:] != b.shape[1:] or a.shape[0] % b.shape[0]:
            raise GraphError(self.name, f"b {b.shape} neither equals a {a.shape} nor divides "
                                        f"its rows")

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return periodic_add(env[self.a], env[self.b])

    def row_call(self, c: RowCell) -> KernelCall:
        return call("ADD", {"a": "a", "b": "b", "c": "out"}, lda=c["a"].ld, ldb=c["b"].ld,
                    ldc=c["out"].ld, M=c.rows, N=c.cols, dtype_a=c.dt("a"), dtype_b=c.dt("b"),
                    dtype_c=c.dt("out"))
