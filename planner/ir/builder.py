"""Building a graph at a precision: `Tensors` (tensors and ops in order,
fp8 tensors and casts as the precision has them) and the fixed fp8 scales
the graphs start from (data-derived scales replace them at run time:
planner.ir.scales).  The templates (planner.ir.models) and the DAG import
(planner.ir.onnx_dag) build with it."""

from __future__ import annotations

from planner.ir.graph import Op, Tensor
from planner.ir.ops.cast import Cast

WEIGHT_SCALE_EXP = -8  # weight codes have std 0.02·2**8 ≈ 5 (fp8 e4m3 max 448)
CAST_SCALE_EXP = {"patches": -4, "ln": -2, "attn": -6, "gelu": -2,
                  # attention operands in fp8 (qk_dtype / pv_dtype): q, k, v
                  # have std ~0.7, probabilities lie in [0, 1]; the probe N(0, 0.02)
                  "qkv": -4, "probs": -8, "probe": -8}


class Tensors:
    """Collects tensors and ops of one graph in order, at a precision: "fp8"
    (tensors as asked), "fp16" (fp8 tensors become fp16, casts vanish) or
    "fp32" (every tensor fp32)."""

    def __init__(self, precision: str) -> None:
        self.fp32 = precision == "fp32"
        self.fp16 = precision == "fp16"
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def t(self, name: str, shape: tuple[int, ...], dtype: str, kind: str = "activation",
          scale_exp: int = 0) -> str:
        if self.fp32:
            dtype, scale_exp = "fp32", 0
        elif self.fp16 and dtype == "fp8":
            dtype, scale_exp = "fp16", 0
        self.tensors.append(Tensor(name, shape, dtype, kind, scale_exp))
        return name

    def op(self, op: Op) -> None:
        self.ops.append(op)

    def cast8(self, x: str, shape: tuple[int, ...], scale_exp: int) -> str:
        """`x` cast to fp8 at `scale_exp` (at precision fp16: `x` itself)."""
        if self.fp16:
            return x
        out = self.t(f"{x}_fp8", shape, "fp8", scale_exp=scale_exp)
        self.op(Cast(f"cast_{x}", x, out))
        return out
