"""Graph IR: construction, lookups, immutability, counting, and every verifier rule."""

from __future__ import annotations

import dataclasses

import pytest

from planner.ir.graph import (
    Graph,
    Repeat,
    Tensor,
    graph_flops,
    graph_macs,
    make_graph,
    op_macs,
    parameter_count,
)
from planner.ir.ops.add import Add
from planner.ir.ops.batch_matmul import BatchMatMul
from planner.ir.ops.cast import Cast
from planner.ir.ops.gelu import Gelu
from planner.ir.ops.heads import MergeHeads, SplitHeads
from planner.ir.ops.layernorm import LayerNorm
from planner.ir.ops.matmul import MatMul
from planner.ir.ops.softmax import Softmax
from tilecommon.errors import GraphError

T = Tensor


def _mlp_tensors() -> list[Tensor]:
    return [
        T("x", (4, 8), "fp16", "input"),
        T("x8", (4, 8), "fp8", "activation", -2),
        T("w", (8, 6), "fp8", "parameter", -8),
        T("b", (6,), "fp16", "parameter"),
        T("h", (4, 6), "fp16", "activation"),
        T("y", (4, 6), "fp16", "output"),
    ]


def _mlp_ops() -> list:
    return [Cast("cast", "x", "x8"), MatMul("mm", "x8", "w", "h", bias="b"), Gelu("gelu", "h", "y")]


def _mlp() -> Graph:
    return make_graph("mlp", _mlp_tensors(), _mlp_ops(), ["x"], ["y"])


def _replace_tensor(tensors: list[Tensor], name: str, **changes: object) -> list[Tensor]:
    return [dataclasses.replace(t, **changes) if t.name == name else t for t in tensors]


def test_lookups_and_order() -> None:
    g = _mlp()
    assert [t.name for t in g.tensors] == sorted(t.name for t in _mlp_tensors())
    assert g.tensor("w").shape == (8, 6)
    assert g.producer("h") == MatMul("mm", "x8", "w", "h", bias="b")
    assert g.producer("x") is None
    assert [op.name for op in g.consumers("h")] == ["gelu"]
    assert g.parameters == ("b", "w")
    assert g.op("mm").kind == "MatMul"
    assert g.op("mm").inputs == ("x8", "w", "b")
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        g.tensor("nope")


def test_values_are_frozen_and_hashable() -> None:
    g = _mlp()
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.tensor("x").shape = (1, 1)  # type: ignore[misc]
    assert g == _mlp() and hash(g) == hash(_mlp())
    assert g != make_graph("mlp2", _mlp_tensors(), _mlp_ops(), ["x"], ["y"])


def test_counting() -> None:
    g = _mlp()
    assert op_macs(g, g.op("mm")) == 4 * 8 * 6
    assert graph_macs(g) == 192 and graph_flops(g) == 384
    assert parameter_count(g) == 8 * 6 + 6
    assert g.tensor("w").nbytes == 48 and g.tensor("b").nbytes == 12


def _expect(message: str, op: str, tensors: list[Tensor], ops: list, inputs=("x",),
            outputs=("y",)) -> None:
    with pytest.raises(GraphError, match=message) as info:
        make_graph("g", tensors, ops, inputs, outputs)
    assert info.value.op == op


def test_matmul_rules() -> None:
    ts = _mlp_tensors()
    _expect("inner dims", "mm", _replace_tensor(ts, "w", shape=(7, 6)), _mlp_ops())
    _expect("operand dtypes differ", "mm",
            _replace_tensor(ts, "w", dtype="fp16", scale_exp=0), _mlp_ops())
    _expect(r"bias \(5,\)", "mm", _replace_tensor(ts, "b", shape=(5,)), _mlp_ops())
    _expect("dtype fp8 not in", "mm", _replace_tensor(ts, "h", dtype="fp8"), _mlp_ops()[:2] +
            [Cast("gelu", "h", "y")])


def test_dataflow_rules() -> None:
    ts, ops = _mlp_tensors(), _mlp_ops()
    _expect("before it is produced", "mm", ts, [ops[1], ops[0], ops[2]])
    _expect("reads unknown tensor 'zz'", "gelu", ts, ops[:2] + [Gelu("gelu", "zz", "y")])
    _expect("second producer of 'h'", "mm2", ts + [T("h2", (4, 6), "fp16", "activation")],
            ops + [MatMul("mm2", "x8", "w", "h")])
    _expect("writes 'w' of kind parameter", "bad", ts + [T("w0", (8, 6), "fp8", "parameter")],
            ops + [Cast("bad", "w0", "w")])
    _expect("duplicate op name", "mm", ts + [T("h2", (4, 6), "fp16", "activation")],
            ops + [MatMul("mm", "x8", "w", "h2")])
    _expect("'h3' \\(activation\\) has no producer", "graph g",
            ts + [T("h3", (4, 6), "fp16", "activation")], ops)


def test_tensor_rules() -> None:
    ts, ops = _mlp_tensors(), _mlp_ops()
    _expect("scale_exp 3 on fp16", "graph g", _replace_tensor(ts, "h", scale_exp=3), ops)
    _expect("dtype 'bf16'", "graph g", _replace_tensor(ts, "h", dtype="bf16"), ops)
    _expect("bad shape", "graph g", _replace_tensor(ts, "b", shape=(0,)), ops)
    _expect("tensors of kind input", "graph g", ts, ops, inputs=())
    _expect("tensors of kind output", "graph g", ts, ops, outputs=("h",))
    _expect("tensors of kind output", "graph g", ts, ops, outputs=("y", "y"))
    _expect("tensors of kind output", "graph g", ts, ops, outputs=())


def test_add_row_periodic_broadcast() -> None:
    base = [T("a", (6, 4), "fp16", "input"), T("out", (6, 4), "fp16", "output")]
    ok = make_graph("g", base + [T("p", (3, 4), "fp16", "parameter")],
                    [Add("add", "a", "p", "out")], ["a"], ["out"])
    assert ok.op("add").inputs == ("a", "p")
    _expect("nor divides", "add", base + [T("p", (4, 4), "fp16", "parameter")],
            [Add("add", "a", "p", "out")], inputs=("a",), outputs=("out",))
    _expect("nor divides", "add", base + [T("p", (3, 2), "fp16", "parameter")],
            [Add("add", "a", "p", "out")], inputs=("a",), outputs=("out",))


def _attention(heads: int = 2, out_shape: tuple[int, ...] = (4, 3, 4)) -> list:
    ts = [
        T("x", (6, 8), "fp16", "input"),
        T("xh", out_shape, "fp16", "activation"),
        T("s", (4, 3, 3), "fp16", "activation"),
        T("p", (4, 3, 3), "fp16", "activation"),
        T("c", (4, 3, 4), "fp16", "activation"),
        T("y", (6, 8), "fp16", "output"),
    ]
    ops = [
        SplitHeads("split", "x", "xh", heads),
        BatchMatMul("qk", "xh", "xh", "s", transpose_b=True),
        Softmax("sm", "s", "p", 0.5),
        BatchMatMul("pv", "p", "xh", "c"),
        MergeHeads("merge", "c", "y", heads),
    ]
    return [ts, ops]


def test_attention_ops() -> None:
    ts, ops = _attention()
    g = make_graph("att", ts, ops, ["x"], ["y"])
    assert op_macs(g, g.op("qk")) == 4 * 3 * 4 * 3
    assert op_macs(g, g.op("pv")) == 4 * 3 * 3 * 4
    ts3, ops3 = _attention(heads=3)
    _expect("heads 3 does not divide", "split", ts3, ops3)
    ts4, ops4 = _attention(out_shape=(4, 3, 5))
    _expect(r"x \(6, 8\) != \(6, 10\)", "split", ts4, ops4)
    _expect("positive float", "sm", ts, ops[:2] + [Softmax("sm", "s", "p", 0.0)] + ops[3:])
    _expect("mismatch", "pv", ts, ops[:3] + [BatchMatMul("pv", "p", "xh", "c", True)] + ops[4:])


def _body(trips_dim: bool = True) -> Graph:
    ts = [
        T("x", (4, 8), "fp16", "input"),
        T("g", (8,), "fp16", "parameter"),
        T("be", (8,), "fp16", "parameter"),
        T("y", (4, 8), "fp16", "output"),
    ]
    return make_graph("body", ts, [LayerNorm("ln", "x", "g", "be", "y", 1e-6)], ["x"], ["y"])


def _repeat_graph(**changes: object) -> tuple[list[Tensor], list]:
    body = _body()
    ts = [
        T("x", (4, 8), "fp16", "input"),
        T("L.g", (3, 8), "fp16", "parameter"),
        T("beta", (8,), "fp16", "parameter"),
        T("y", (4, 8), "fp16", "output"),
    ]
    fields: dict = dict(name="rep", body=body, trips=3, init=("x",), final=("y",),
                        arguments=("x",), yields=("y",), iterated=(("L.g", "g"),),
                        invariant=(("beta", "be"),))
    fields.update(changes)
    return ts, [Repeat(**fields)]


def test_repeat_valid() -> None:
    ts, ops = _repeat_graph()
    g = make_graph("g", ts, ops, ["x"], ["y"])
    rep = g.op("rep")
    assert rep.inputs == ("x", "L.g", "beta") and rep.outputs == ("y",)
    assert parameter_count(g) == 3 * 8 + 8


def test_repeat_rules() -> None:
    ts, ops = _repeat_graph(trips=2)
    _expect(r"iterated L.g \(3, 8\) != \(2, 8\)", "rep", ts, ops)
    ts, ops = _repeat_graph(invariant=())
    _expect("bound body parameters", "rep", ts, ops)
    ts, ops = _repeat_graph(arguments=("y",))
    _expect("arguments", "rep", ts, ops)
    ts, ops = _repeat_graph(trips=0)
    _expect("trips 0", "rep", ts, ops)
    ts, ops = _repeat_graph(iterated=(("L.g", "nope"),))
    _expect("unknown body tensor 'nope'", "rep", ts, ops)
    ts, ops = _repeat_graph()
    _expect("init/argument 0", "rep", _replace_tensor(ts, "x", dtype="fp32"), ops)
    ts, ops = _repeat_graph()
    _expect("invariant beta", "rep", _replace_tensor(ts, "beta", shape=(3, 8)), ops)
    # argument and yield formats must be equal
    bad_body = make_graph(
        "body",
        [T("x", (4, 8), "fp16", "input"), T("g", (8,), "fp16", "parameter"),
         T("be", (8,), "fp16", "parameter"), T("y", (4, 8), "fp32", "output")],
        [LayerNorm("ln", "x", "g", "be", "y", 1e-6)], ["x"], ["y"],
    )
    ts, ops = _repeat_graph(body=bad_body)
    _expect("argument/yield 0", "rep", ts, ops)
