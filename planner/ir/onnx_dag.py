"""Any DAG of the IR's op kinds from an ONNX file: the importer's way in for
a model that is not one of the templates (planner.ir.onnx_import tries the
templates first).

Every activation is a matrix [rows, cols] (an ONNX value [d0, ..., dn] is
[d0···dn-1, dn]); node by node, in the file's (topological) order:

- `MatMul` by a 2-D constant, or `Gemm` (alpha = beta = 1, no transA), with
  its bias `Add` -> MatMul (at precision fp8 the input is cast to fp8 once
  per value, as the templates do; weights fp8, biases fp16);
- `Add` of two activations of one shape -> Add;
- `LayerNormalization` over the last axis, or its decomposition below
  opset 17 -> LayerNorm; RMSNorm's decomposition -> RMSNorm
  (planner.ir.onnx_layers' norm patterns);
- `Softmax` over the last axis -> Softmax;
- a chain of elementwise nodes (Mul, Div, Add, Sub, Pow, Sqrt, Erf, Tanh,
  Sigmoid, Neg, with constants) that reads one activation: told apart by
  the function it computes, evaluated at 61 points in [-6, 6] against the
  kernels' own formulas (kernels.formulas) of GELU
  (erf and tanh forms), quick GELU, SiLU and tanh (1e-5) -> Gelu, Silu or
  Tanh; `Gelu` itself -> Gelu;
- `Mul` of SiLU(a) and an activation b (SwiGLU) -> SwiGLU(a, b);
- `Cast`, `Identity`, `Dropout`: the value itself; nodes of constants and
  of shapes only: not part of the graph.

Anything else that reads an activation (a MatMul of two activations, a
Reshape or Transpose of one, ...) is a ConfigError naming the node, its op
type and what a DAG import takes.  Inputs need static shapes (float); the
graph's outputs are the file's, by its names.  Parameters take our names
from the op (`w_<op>`, `b_<op>`, `<op>.gamma`): the file's initializers
are the run's weights.  `Dag.graph(precision)` builds the Graph; it counts
as one layer, batch the first input's first dim.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels import formulas
from planner.ir.builder import CAST_SCALE_EXP, WEIGHT_SCALE_EXP, Tensors
from planner.ir.graph import Graph, make_graph
from planner.ir.onnx_graph import PASS, _Graph, _linear
from planner.ir.onnx_layers import _norm_at
from planner.ir.ops.add import Add
from planner.ir.ops.gelu import Gelu
from planner.ir.ops.layernorm import LayerNorm
from planner.ir.ops.matmul import MatMul
from planner.ir.ops.rmsnorm import RMSNorm
from planner.ir.ops.silu import Silu, Tanh
from planner.ir.ops.softmax import Softmax
from planner.ir.ops.swiglu import SwiGLU
from tilecommon.errors import ConfigError

TAKES = ("MatMul or Gemm by a constant (+ bias), Add of two activations, "
         "LayerNorm (or its decomposition), RMSNorm, Softmax, GELU / quick GELU / SiLU / Tanh "
         "(as one node or elementwise chains), SwiGLU, Cast")
FLOATS = (1, 10, 11, 16)  # onnx.TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
ELEMENTWISE = ("Mul", "Div", "Add", "Sub", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Neg")


@dataclass
class Dag:
    """A DAG import: its steps in order (precision-free), shapes, weights
    under our names, the file's inputs and outputs and their names here."""

    name: str
    inputs: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (file's, ours)
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    provenance: dict[str, list[str]] = field(default_factory=dict)
    batch: int = 1

    def graph(self, precision: str) -> Graph:
        """The Graph at `precision` (planner.ir.models' policies)."""
        b = Tensors(precision)
        outs = {ours for _, ours in self.outputs}

        def act(name: str) -> str:
            return b.t(name, self.shapes[name], "fp16",
                       "output" if name in outs else "activation")

        for _, ours, _ in self.inputs:
            b.t(ours, self.shapes[ours], "fp16", "input")
        cast: dict[str, str] = {}
        for step in self.steps:
            kind, name = step[0], step[1]
            if kind == "linear":
                _, _, x, out, w, bias = step
                if x not in cast:
                    cast[x] = b.cast8(x, self.shapes[x], CAST_SCALE_EXP["ln"])
                k, n = self.weights[w].shape
                b.t(w, (k, n), "fp8", "parameter", WEIGHT_SCALE_EXP)
                if bias is not None:
                    b.t(bias, (n,), "fp16", "parameter")
                b.op(MatMul(name, cast[x], w, act(out), bias=bias))
            elif kind == "add":
                b.op(Add(name, step[2], step[3], act(step[4])))
            elif kind == "layernorm":
                _, _, x, out, gamma, beta, eps = step
                n = self.shapes[x][1]
                b.t(gamma, (n,), "fp16", "parameter")
                b.t(beta, (n,), "fp16", "parameter")
                b.op(LayerNorm(name, x, gamma, beta, act(out), eps))
            elif kind == "rmsnorm":
                _, _, x, out, gamma, eps = step
                b.t(gamma, (self.shapes[x][1],), "fp16", "parameter")
                b.op(RMSNorm(name, x, gamma, act(out), eps))
            elif kind == "softmax":
                b.op(Softmax(name, step[2], act(step[3]), 1.0))
            elif kind == "swiglu":
                b.op(SwiGLU(name, step[2], step[3], act(step[4])))
            else:  # an activation: gelu_<form>, silu, tanh
                x, out = step[2], step[3]
                if kind.startswith("gelu_"):
                    b.op(Gelu(name, x, act(out), kind.removeprefix("gelu_")))
                else:
                    b.op((Silu if kind == "silu" else Tanh)(name, x, act(out)))
        first = self.inputs[0][1]
        rows = self.shapes[first][0]
        attrs = [("model", self.name), ("layers", 1), ("batch", self.batch),
                 ("tokens", rows // self.batch), ("hidden", self.shapes[first][1]),
                 ("precision", precision), ("source", "onnx-dag")]
        return make_graph(self.name, b.tensors, b.ops, [i[1] for i in self.inputs],
                          [o[1] for o in self.outputs], attrs)


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return np.asarray(erf(x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# the step kind each activation becomes, by the kernels' own formula of it
FUNCTIONS = {"gelu_erf": formulas.ACT_GELU_ERF, "gelu_tanh": formulas.ACT_GELU_TANH,
             "gelu_quick": formulas.ACT_QUICK_GELU, "silu": formulas.ACT_SILU,
             "tanh": formulas.ACT_TANH}
# what each elementwise node computes from its operands
NODE_FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "Mul": np.multiply, "Div": np.divide, "Add": np.add, "Sub": np.subtract,
    "Pow": np.power, "Sqrt": np.sqrt, "Erf": _erf, "Tanh": np.tanh, "Sigmoid": _sigmoid,
    "Neg": np.negative}


def _run_chain(g: _Graph, x: str, nodes: list[Any], at: np.ndarray) -> dict[str, np.ndarray]:
    """The values of `nodes` (in order) with `x` = `at`."""
    env = {x: at}
    for n in nodes:
        args = [env[i] if i in env else g.value(i) for i in n.input]
        if any(v is None for v in args):
            return {}
        with np.errstate(all="ignore"):
            env[n.output[0]] = np.asarray(NODE_FUNCTIONS[n.op_type](*args), np.float64)
    return env


def _scalar(c: np.ndarray | None) -> bool:
    return c is not None and c.size == 1


def _chain(g: _Graph, x: str, done: set[int]) -> tuple[str, list[Any], str] | None:
    """The elementwise chain reading only `x` (and its own values and
    constants) from x: (the step kind, its nodes in order, its output), or None."""
    members: list[Any] = []
    inside = {x}
    changed = True
    while changed:
        changed = False
        for v in list(inside):
            for u in g.users(v):
                if id(u) in done or u in members or u.op_type not in ELEMENTWISE:
                    continue
                if all(i in inside or _scalar(g.value(i)) for i in u.input if i):
                    members.append(u)
                    inside.add(u.output[0])
                    changed = True
    if not members:
        return None
    order = {id(n): i for i, n in enumerate(g.nodes)}
    members.sort(key=lambda n: order[id(n)])
    ends = [n for n in members
            if n.output[0] in g.outputs or any(u not in members for u in g.users(n.output[0]))]
    if len(ends) != 1:
        return None
    at = np.linspace(-6.0, 6.0, 61)
    env = _run_chain(g, x, members, at)
    y = env.get(ends[0].output[0])
    if y is None:
        return None
    for kind, form in FUNCTIONS.items():
        if np.allclose(y, formulas.activation(form, at), rtol=1e-5, atol=1e-5):
            return kind, members, ends[0].output[0]
    return None


def _ident(name: str, taken: set[str]) -> str:
    """`name` as one of our names (letters, digits, `_` and `.`), unique."""
    base = re.sub(r"[^A-Za-z0-9_.]+", "_", name).strip("_.") or "v"
    out, i = base, 1
    while out in taken:
        i += 1
        out = f"{base}_{i}"
    taken.add(out)
    return out


def dag_import(g: _Graph, name: str) -> Dag:
    """The DAG of IR ops the file computes (module docstring); ConfigError
    naming the first node it cannot take."""
    dag = Dag(name)
    taken: set[str] = set()
    val: dict[str, str] = {}  # the file's value -> ours
    for inp in g.inputs:
        if g.elem_types.get(inp) not in FLOATS:
            raise ConfigError(g.source, f"input {inp}", "a DAG import takes float inputs "
                                                        "(token ids need a model template)")
        dims = g.shapes.get(inp, [])
        if not dims or any(d <= 0 for d in dims):
            raise ConfigError(g.source, f"input {inp}", f"needs a static shape, got {dims} "
                                                        "(export with fixed sizes)")
        ours = _ident(inp, taken)
        rows = int(np.prod(dims[:-1])) if len(dims) > 1 else 1
        dag.shapes[ours] = (rows, int(dims[-1]))
        dag.inputs.append((inp, ours, tuple(dims)))
        val[inp] = ours
        if len(dag.inputs) == 1:
            dag.batch = int(dims[0]) if len(dims) > 1 else 1
    done: set[int] = set()
    producer_step: dict[str, int] = {}  # ours -> index of the step making it

    counts: dict[str, int] = {}

    def fresh(kind: str) -> str:
        """An op's name: its kind and a count (the exporter's node names
        differ, the package does not)."""
        counts[kind] = counts.get(kind, -1) + 1
        return _ident(f"{kind}{counts[kind]}", taken)

    def out(onnx_name: str, shape: tuple[int, int], op: str) -> str:
        """Our value for the file's `onnx_name`, made by `op`: the file's own
        name for a graph output, else y_<op>."""
        ours = _ident(onnx_name if onnx_name in g.outputs else f"y_{op}", taken)
        val[onnx_name] = ours
        dag.shapes[ours] = shape
        return ours

    def step(st: tuple[Any, ...], nodes: list[Any]) -> None:
        dag.steps.append(st)  # its output: st[4] for the two-operand kinds, else st[3]
        producer_step[st[4] if st[0] in ("add", "swiglu") else st[3]] = len(dag.steps) - 1
        dag.provenance[st[1]] = [n.name or n.output[0] for n in nodes]
        done.update(id(n) for n in nodes)

    for n in g.nodes:
        if id(n) in done:
            continue
        reads = [i for i in n.input if i in val]
        if not reads or n.op_type == "Shape":
            continue  # constants, shapes: not part of the graph
        x = reads[0]
        if n.op_type in (*PASS, "Cast"):
            val[n.output[0]] = val[x]
            done.add(id(n))
            continue
        if n.op_type in ("MatMul", "Gemm"):
            lin = _linear(g, n)
            attrs = {a.name: a for a in n.attribute}
            if lin is None or n.input[0] != x or any(
                    k in attrs and attrs[k].f != 1.0 for k in ("alpha", "beta")) or (
                    "transA" in attrs and attrs["transA"].i):
                raise g.bad(n, f"a DAG import takes {TAKES}; this {n.op_type} multiplies "
                               "two activations or has alpha, beta or transA")
            op = fresh("mm")
            w = _ident(f"w_{op}", taken)
            bias = _ident(f"b_{op}", taken) if lin[1] is not None else None
            dag.weights[w] = np.asarray(lin[0], np.float32)
            if lin[1] is not None:
                assert bias is not None
                if lin[1].size != lin[0].shape[1]:  # a Gemm's C broadcast over rows only
                    raise g.bad(n, f"a bias of shape {lin[1].shape}: a DAG import takes one "
                                   f"value per output column ({lin[0].shape[1]})")
                dag.weights[bias] = np.asarray(lin[1], np.float32).reshape(-1)
            rows, k = dag.shapes[val[x]]
            if lin[0].shape[0] != k:
                raise g.bad(n, f"inner dims differ: {k} against the weight's {lin[0].shape}")
            step(("linear", op, val[x], out(lin[2], (rows, lin[0].shape[1]), op), w, bias),
                 lin[3])
            continue
        if n.op_type in ("LayerNormalization", "Softmax"):
            axis = next((a.i for a in n.attribute if a.name == "axis"), -1)
            if axis not in (-1, len(g.shapes.get(x, [0, 0])) - 1):
                raise g.bad(n, f"a DAG import takes a {n.op_type} over the last axis only")
        norm = _norm_at(g, x, n)  # LayerNormalization, its decomposition, or RMSNorm's
        if norm is not None:
            op = fresh("ln" if norm.kind == "layernorm" else "rms")
            y = out(norm.out, dag.shapes[val[x]], op)
            gn = _ident(f"{op}.gamma", taken)
            dag.weights[gn] = norm.gamma
            if norm.kind == "layernorm":
                assert norm.beta is not None
                bn = _ident(f"{op}.beta", taken)
                dag.weights[bn] = norm.beta
                step(("layernorm", op, val[x], y, gn, bn, norm.eps), norm.nodes)
            else:
                step(("rmsnorm", op, val[x], y, gn, norm.eps), norm.nodes)
            continue
        if n.op_type == "Softmax":
            op = fresh("softmax")
            step(("softmax", op, val[x], out(n.output[0], dag.shapes[val[x]], op)), [n])
            continue
        if n.op_type == "Gelu":
            approx = next((a.s.decode() for a in n.attribute if a.name == "approximate"),
                          "none")
            kind = "gelu_tanh" if approx == "tanh" else "gelu_erf"
            op = fresh("gelu")
            step((kind, op, val[x], out(n.output[0], dag.shapes[val[x]], op)), [n])
            continue
        if n.op_type == "Add" and len(set(reads)) == 2:
            a, b = val[reads[0]], val[reads[1]]
            if dag.shapes[a] != dag.shapes[b]:
                raise g.bad(n, f"adds {dag.shapes[a]} and {dag.shapes[b]}: a DAG import "
                               "adds activations of one shape")
            op = fresh("add")
            step(("add", op, a, b, out(n.output[0], dag.shapes[a], op)), [n])
            continue
        if n.op_type == "Mul" and len(set(reads)) == 2:
            a, b = val[reads[0]], val[reads[1]]
            for gate_out, up in ((a, b), (b, a)):
                i = producer_step.get(gate_out)
                if i is not None and dag.steps[i][0] == "silu" and \
                        len(g.users(reads[0 if gate_out == a else 1])) == 1:
                    silu = dag.steps[i]  # becomes SwiGLU here, after `up` exists
                    dag.steps[i] = ()
                    prov = dag.provenance.pop(silu[1])
                    op = fresh("swiglu")
                    step(("swiglu", op, silu[2], up, out(n.output[0], dag.shapes[up], op)), [])
                    dag.provenance[op] = [*prov, n.name or n.output[0]]
                    done.add(id(n))
                    break
            else:
                raise g.bad(n, f"a DAG import takes {TAKES}; an elementwise Mul of two "
                               "activations only as SwiGLU's silu(gate) * up")
            continue
        if n.op_type in ("Add", "Sub", "Mul", "Div") and len(set(reads)) == 1 and any(
                (c := g.value(i)) is not None and c.size > 1 for i in n.input):
            raise g.bad(n, f"{n.op_type} by a constant tensor: a DAG import takes one only as "
                           "a linear's bias (MatMul + Add) or a norm's scale")
        if n.op_type in ELEMENTWISE and len(set(reads)) == 1:
            hit = _chain(g, x, done)
            if hit is not None:
                kind, nodes, end = hit
                op = fresh(kind.split("_")[0])
                step((kind, op, val[x], out(end, dag.shapes[val[x]], op)), nodes)
                continue
            raise g.bad(n, "an elementwise chain that computes none of GELU (erf or tanh), "
                           "quick GELU, SiLU or tanh")
        raise g.bad(n, f"a DAG import takes {TAKES}")
    for o in g.outputs:
        if o not in val or val[o] in {i[1] for i in dag.inputs}:
            raise ConfigError(g.source, f"output {o}", "is not computed from the inputs by "
                                                       "the graph's ops")
        dag.outputs.append((o, val[o]))
    dag.steps = [st for st in dag.steps if st]  # less the SiLUs that became SwiGLUs
    if not dag.steps:
        raise ConfigError(g.source, "onnx", "no op reads the inputs")
    return dag
