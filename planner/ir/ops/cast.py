"""Cast: out = convert(x) to out.dtype with out.scale_exp (docs/contracts.md
§1); the CAST kernel, elementwise.  A conversion: where its result need not
be materialised, lowering absorbs it into its consumers' moves (cast order
"after": move the wide value, cast on the consumer's tiles) unless the plan
casts it "before" (planner.decide.plan)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from planner.ir.graph import Graph
from planner.ir.opkind import ROW, KernelCall, RowCell, RowOp, call, register_op, same_shape


@register_op
@dataclass(frozen=True)
class Cast(RowOp):
    """out = convert(x) to out.dtype with out.scale_exp (contracts §1)."""

    READS: ClassVar[tuple[str, ...]] = ("x",)
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW}
    ELEMENTWISE: ClassVar[bool] = True
    CONVERSION: ClassVar[bool] = True

    x: str
    out: str

    def check(self, g: Graph) -> None:
        same_shape(self, "out shape", g.tensor(self.x), g.tensor(self.out))

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return env[self.x]

    def row_call(self, c: RowCell) -> KernelCall:
        x, y = c["x"], c["out"]
        return call("CAST", {"x": "x", "y": "out"}, ldx=x.ld, ldy=y.ld, M=c.rows, N=c.cols,
                    dtype_x=c.dt("x"), dtype_y=c.dt("out"), shift=x.scale_exp - y.scale_exp)
