"""planner.ir.opkind: an op kind is one declaration.  `Scale2` below is a new
op kind defined in this file alone — its shape rule, reference formula and
the kernel call of a block of rows — and it plans, builds, verifies and
simulates like a built-in one, bit for bit against the reference."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

import planner
import simulator
from kernels import formulas
from planner.ir.graph import Graph, Tensor, make_graph
from planner.ir.opkind import (
    OPS,
    ROW,
    KernelCall,
    RowCell,
    RowOp,
    call,
    register_op,
    same_shape,
)
from planner.ir.ops.cast import Cast
from planner.ir.ops.layernorm import LayerNorm
from planner.ir.ops.matmul import MatMul
from planner.ir.reference import init_inputs, init_params, reference
from tilecommon.errors import GraphError

TINY = simulator.load_device("tiny")


@register_op
@dataclass(frozen=True)
class Scale2(RowOp):
    """out = x + x (twice x, one rounding): the ADD kernel with both operands
    on x, on blocks of rows or column blocks."""

    READS: ClassVar[tuple[str, ...]] = ("x",)
    OPERANDS: ClassVar[dict[str, str]] = {"x": ROW}
    ELEMENTWISE: ClassVar[bool] = True

    x: str
    out: str

    def check(self, g: Graph) -> None:
        same_shape(self, "out shape", g.tensor(self.x), g.tensor(self.out))

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        return formulas.add(env[self.x], env[self.x])

    def row_call(self, c: RowCell) -> KernelCall:
        x = c["x"]
        return call("ADD", {"a": "x", "b": "x", "c": "out"}, lda=x.ld, ldb=x.ld,
                    ldc=c["out"].ld, M=c.rows, N=c.cols, dtype_a=c.dt("x"), dtype_b=c.dt("x"),
                    dtype_c=c.dt("out"))


def _graph(rows: int = 24, cols: int = 96) -> Graph:
    t = [Tensor("x", (rows, cols), "fp16", "input"),
         Tensor("x8", (rows, cols), "fp8", "activation", -4),
         Tensor("w", (cols, cols), "fp8", "parameter", -8),
         Tensor("h", (rows, cols), "fp16", "activation"),
         Tensor("d", (rows, cols), "fp16", "activation"),
         Tensor("g", (cols,), "fp16", "parameter"), Tensor("b", (cols,), "fp16", "parameter"),
         Tensor("out", (rows, cols), "fp16", "output")]
    ops = [Cast("cast_x", "x", "x8"), MatMul("mm", "x8", "w", "h"), Scale2("twice", "h", "d"),
           LayerNorm("ln", "d", "g", "b", "out", 1e-5)]
    return make_graph("scale2", t, ops, ["x"], ["out"],
                      (("layers", 1), ("batch", 1), ("model", "scale2")))


def test_a_new_op_kind_plans_and_runs_end_to_end() -> None:
    g = _graph()
    assert OPS.get("Scale2") is Scale2
    res = planner.plan(g, TINY, planner.PipelineConfig(optimization_steps=2))
    step_ops = {o for labels in res.package.provenance for o, _, _ in labels}
    assert "twice" in step_ops
    params, inputs = init_params(g, seed=3), init_inputs(g, seed=4)
    sim = simulator.run(res.package, params=params, inputs=inputs)
    assert sim.n_faults == 0
    want = reference(g, params, inputs)["out"]
    assert np.array_equal(sim.outputs["out"], want)  # no K split on 96 columns: exact


def test_the_declaration_is_checked() -> None:
    with pytest.raises(GraphError, match="out shape"):
        make_graph("bad", [Tensor("x", (4, 8), "fp16", "input"),
                           Tensor("y", (4, 9), "fp16", "output")],
                   [Scale2("twice", "x", "y")], ["x"], ["y"])
    with pytest.raises(ValueError, match="OPERANDS"):
        @register_op
        @dataclass(frozen=True)
        class NoOperands(RowOp):
            READS: ClassVar[tuple[str, ...]] = ("x",)
            x: str
            out: str
    assert "NoOperands" not in OPS


def test_builtin_kinds_are_registered() -> None:
    import planner.ir.ops  # noqa: F401  (every built-in kind)

    names = set(OPS.names())
    assert {"MatMul", "BatchMatMul", "LayerNorm", "Gelu", "Softmax", "Add", "Cast",
            "SplitHeads", "MergeHeads", "Broadcast"} <= names
    for name in names:
        cls = OPS.get(name)
        assert cls.FAMILY in ("matmul", "bmm", "rows", "move"), name
