"""The graph IR: immutable tensors and ops, a Repeat op, and the verifier.

Exactly docs/contracts.md §4.  Every value is a frozen dataclass with tuple
fields; a transform returns a new `Graph` made with `make_graph`, which runs
`verify_graph`.  The verifier defines what a valid graph is:

- tensor names are unique, `tensors` is sorted by name; dtype ∈ fp8/fp16/fp32,
  kind ∈ activation/parameter/input/output, dims positive, a non-zero
  `scale_exp` only on fp8 tensors;
- `inputs` lists exactly the tensors of kind "input" and `outputs` exactly
  those of kind "output" (each once, in the given order), each output
  produced by an op;
- every tensor an op reads exists and is an input, a parameter, or produced by
  an earlier op (ops are in topological order, so there are no cycles); every
  tensor has at most one producer; inputs and parameters have none; every
  activation/output tensor has one;
- each op's own shape and dtype rule (`op.check(g)`: the op kinds of
  planner.ir.ops, declared in planner.ir.opkind);
- a Repeat's body is itself a valid graph whose `inputs` are the arguments
  (kind "input") and `outputs` the yields (kind "output"); argument k, yield k,
  init k and final k have equal shape, dtype and scale_exp; an iterated
  parameter's outer tensor has shape `(trips, *body_shape)`, invariant ones the
  body shape (an invariant binding may bind a graph input, such as an
  attention mask every layer reads); every body parameter is bound exactly
  once.

The reference-only precision variant (`load_model(..., precision="fp32")`) has
fp32 MatMul operands; the verifier accepts that, the planner need not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from kernels.abi import DTYPE_SIZE
from tilecommon.errors import GraphError

DTYPES = ("fp8", "fp16", "fp32")
KINDS = ("activation", "parameter", "input", "output")
DTYPE_BYTES = DTYPE_SIZE  # dtype name -> bytes (kernels.abi)


def view2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols) of a tensor seen as a matrix: the last dim is the columns."""
    if len(shape) == 1:
        return 1, shape[0]
    return math.prod(shape[:-1]), shape[-1]


@dataclass(frozen=True)
class Tensor:
    """A named value.  fp8 tensors mean `code * 2**scale_exp`."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    scale_exp: int = 0

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class OpBase:
    """Common part of every op; `kind` is the class name.  An op names the
    fields that hold the tensors it reads (`READS`, in order; a field that is
    None is left out) and writes (`WRITES`).  The hooks below are what an op
    kind declares (planner.ir.opkind; the built-in kinds are planner.ir.ops)."""

    READS: ClassVar[tuple[str, ...]] = ()
    WRITES: ClassVar[tuple[str, ...]] = ("out",)
    # the recipe family that places the op (planner.ir.opkind.FAMILIES)
    FAMILY: ClassVar[str] = ""
    # a conversion redistributions may absorb (Cast)
    CONVERSION: ClassVar[bool] = False
    # the read field whose fp8 cast may run before the move (matmul operands)
    NARROW_OPERAND: ClassVar[str | None] = None

    name: str

    @property
    def kind(self) -> str:
        return type(self).__name__

    @property
    def inputs(self) -> tuple[str, ...]:
        """Tensor names read, parameters included, in a fixed order."""
        return tuple(v for v in (getattr(self, f) for f in self.READS) if v is not None)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Tensor names written."""
        return tuple(getattr(self, f) for f in self.WRITES)

    def check(self, g: Graph) -> None:
        """The op's shape and dtype rule in graph `g` (GraphError)."""
        raise GraphError(self.name, f"op kind {self.kind} declares no shape rule")

    def compute(self, g: Graph, env: Mapping[str, Any]) -> Any:
        """The unrounded float32 result (a numpy array) from the values of
        its inputs in `env` (planner.ir.reference rounds it)."""
        raise TypeError(f"op {self.name}: op kind {self.kind} has no reference formula")

    def macs(self, g: Graph) -> int:
        """Multiply-accumulates of one execution (matmuls; 0 for the rest)."""
        return 0

    def param_roles(self) -> dict[str, str]:
        """Init role (weight, bias, gamma, beta, mask, ...) of the tensors it
        reads, by tensor name; a parameter no op names is "other", an input
        "input" (planner.ir.reference.init_params / init_inputs)."""
        return {}

    def init_values(self, g: Graph, name: str) -> Any:
        """Values the parameter `name` it reads must hold, when they are
        determined (RoPE's tables: a numpy array of its shape), else None
        (drawn by role)."""
        return None


@dataclass(frozen=True)
class Repeat(OpBase):
    """Run `body` `trips` times; see the module docstring for the bindings.

    `iterated`/`invariant` are `(outer_param, body_param)` pairs.  Inputs are
    init + outer params (iterated first, then invariant); outputs are final.
    """

    body: Graph
    trips: int
    init: tuple[str, ...]
    final: tuple[str, ...]
    arguments: tuple[str, ...]
    yields: tuple[str, ...]
    iterated: tuple[tuple[str, str], ...] = ()
    invariant: tuple[tuple[str, str], ...] = ()

    @property
    def inputs(self) -> tuple[str, ...]:
        return (
            self.init
            + tuple(outer for outer, _ in self.iterated)
            + tuple(outer for outer, _ in self.invariant)
        )

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.final

    def check(self, g: Graph) -> None:
        _check_repeat(g, self)


Op = OpBase  # an op of any kind (planner.ir.opkind)


@dataclass(frozen=True)
class Graph:
    """A verified dataflow graph (build it with `make_graph`)."""

    name: str
    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, object], ...] = ()

    @cached_property
    def _by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def _producers(self) -> dict[str, Op]:
        return {out: op for op in self.ops for out in op.outputs}

    def has(self, name: str) -> bool:
        return name in self._by_name

    def tensor(self, name: str) -> Tensor:
        """The tensor called `name`; KeyError naming it and the graph otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"graph {self.name}: no tensor {name!r}") from None

    def producer(self, name: str) -> Op | None:
        return self._producers.get(name)

    def consumers(self, name: str) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if name in op.inputs)

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"graph {self.name}: no op {name!r}")

    @property
    def parameters(self) -> tuple[str, ...]:
        """Names of tensors of kind "parameter", sorted."""
        return tuple(t.name for t in self.tensors if t.kind == "parameter")

    def attr(self, key: str, default: object = None) -> object:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def attr_int(self, key: str) -> int:
        """An integer model fact (hidden, heads, mlp, tokens, batch, layers, ...)."""
        v = self.attr(key)
        if not isinstance(v, int):
            raise KeyError(f"graph {self.name}: no integer attr {key!r} (got {v!r})")
        return v


def make_graph(
    name: str,
    tensors: Iterable[Tensor],
    ops: Iterable[Op],
    inputs: Iterable[str],
    outputs: Iterable[str],
    attrs: Iterable[tuple[str, object]] = (),
) -> Graph:
    """Build a Graph (tensors sorted by name) and verify it; raises GraphError."""
    g = Graph(
        name=name,
        tensors=tuple(sorted(tensors, key=lambda t: t.name)),
        ops=tuple(ops),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        attrs=tuple(attrs),
    )
    verify_graph(g)
    return g


# ---------------------------------------------------------------- verifier


def verify_graph(g: Graph) -> None:
    """Raise GraphError(op, message) on the first rule `g` breaks (module doc)."""
    where = f"graph {g.name}"
    _check_tensors(g, where)
    defined: set[str] = {t.name for t in g.tensors if t.kind in ("input", "parameter")}
    produced: set[str] = set()
    op_names: set[str] = set()
    for op in g.ops:
        if not isinstance(op, OpBase):
            raise GraphError(str(getattr(op, "name", op)), f"{where}: not an op: {type(op)}")
        if op.name in op_names:
            raise GraphError(op.name, f"{where}: duplicate op name")
        op_names.add(op.name)
        for t in op.inputs:
            if not g.has(t):
                raise GraphError(op.name, f"reads unknown tensor {t!r}")
            if t not in defined:
                raise GraphError(
                    op.name, f"reads {t!r} before it is produced (cycle or bad order)"
                )
        for t in op.outputs:
            if not g.has(t):
                raise GraphError(op.name, f"writes unknown tensor {t!r}")
            kind = g.tensor(t).kind
            if kind in ("input", "parameter"):
                raise GraphError(op.name, f"writes {t!r} of kind {kind}")
            if t in produced:
                raise GraphError(op.name, f"second producer of {t!r}")
            produced.add(t)
            defined.add(t)
        op.check(g)
    for tensor in g.tensors:
        if tensor.kind in ("activation", "output") and tensor.name not in produced:
            raise GraphError(where, f"tensor {tensor.name!r} ({tensor.kind}) has no producer")


def _check_tensors(g: Graph, where: str) -> None:
    names = [t.name for t in g.tensors]
    if names != sorted(names):
        raise GraphError(where, "tensors are not sorted by name")
    for a, b in zip(names, names[1:], strict=False):
        if a == b:
            raise GraphError(where, f"duplicate tensor {a!r}")
    for t in g.tensors:
        if t.dtype not in DTYPES:
            raise GraphError(where, f"tensor {t.name!r}: dtype {t.dtype!r} not in {DTYPES}")
        if t.kind not in KINDS:
            raise GraphError(where, f"tensor {t.name!r}: kind {t.kind!r} not in {KINDS}")
        if not t.shape or any(not isinstance(d, int) or d <= 0 for d in t.shape):
            raise GraphError(where, f"tensor {t.name!r}: bad shape {t.shape}")
        if t.scale_exp != 0 and t.dtype != "fp8":
            raise GraphError(where, f"tensor {t.name!r}: scale_exp {t.scale_exp} on {t.dtype}")
    declared = [t.name for t in g.tensors if t.kind == "input"]
    if sorted(g.inputs) != declared:
        raise GraphError(where, f"inputs {list(g.inputs)} != tensors of kind input {declared}")
    declared = [t.name for t in g.tensors if t.kind == "output"]
    if sorted(g.outputs) != declared:
        raise GraphError(where, f"outputs {list(g.outputs)} != tensors of kind output {declared}")


def _same_format(op: OpBase, what: str, a: Tensor, b: Tensor) -> None:
    if (a.shape, a.dtype, a.scale_exp) != (b.shape, b.dtype, b.scale_exp):
        raise GraphError(
            op.name, f"{what}: {a.name} {a.shape} {a.dtype} e{a.scale_exp} vs "
            f"{b.name} {b.shape} {b.dtype} e{b.scale_exp}"
        )


def _check_repeat(g: Graph, op: Repeat) -> None:
    """Repeat's rule (module docstring)."""
    body = op.body
    if not isinstance(body, Graph):
        raise GraphError(op.name, "body is not a Graph")
    if not isinstance(op.trips, int) or op.trips < 1:
        raise GraphError(op.name, f"trips {op.trips!r} must be a positive int")
    n = len(op.arguments)
    if not (len(op.yields) == len(op.init) == len(op.final) == n) or n == 0:
        raise GraphError(op.name, "init/final/arguments/yields must have the same non-zero length")
    if op.arguments != body.inputs:
        raise GraphError(op.name, f"arguments {op.arguments} != body inputs {body.inputs}")
    if op.yields != body.outputs:
        raise GraphError(op.name, f"yields {op.yields} != body outputs {body.outputs}")
    try:
        verify_graph(body)
    except GraphError as e:
        raise GraphError(op.name, f"body: {e}") from None
    for k in range(n):
        arg, yld = body.tensor(op.arguments[k]), body.tensor(op.yields[k])
        _same_format(op, f"argument/yield {k}", arg, yld)
        _same_format(op, f"init/argument {k}", g.tensor(op.init[k]), arg)
        _same_format(op, f"final/yield {k}", g.tensor(op.final[k]), yld)
    bound: list[str] = []
    for pairs, iterated in ((op.iterated, True), (op.invariant, False)):
        for outer_name, body_name in pairs:
            outer = g.tensor(outer_name)
            if not body.has(body_name):
                raise GraphError(op.name, f"binds unknown body tensor {body_name!r}")
            inner = body.tensor(body_name)
            outer_kinds = ("parameter",) if iterated else ("parameter", "input")
            if outer.kind not in outer_kinds or inner.kind != "parameter":
                raise GraphError(op.name, f"binding {outer_name}->{body_name}: not a parameter "
                                          f"(an invariant one may bind a graph input)")
            want = (op.trips, *inner.shape) if iterated else inner.shape
            if outer.shape != want:
                what = "iterated" if iterated else "invariant"
                raise GraphError(op.name, f"{what} {outer_name} {outer.shape} != {want}")
            if (outer.dtype, outer.scale_exp) != (inner.dtype, inner.scale_exp):
                raise GraphError(op.name, f"binding {outer_name}->{body_name}: format differs")
            bound.append(body_name)
    if sorted(bound) != list(body.parameters):
        raise GraphError(
            op.name, f"bound body parameters {sorted(bound)} != body parameters "
            f"{list(body.parameters)}"
        )


# ---------------------------------------------------------------- walking


@dataclass(frozen=True)
class OpSite:
    """A non-Repeat op with its qualified name (`<repeat>/<op>` inside a
    Repeat body), its graph (the body or the top graph), its trips (how many
    times it runs: how many layers of its parameters live on the device) and
    its scope (the name prefix, "" at the top)."""

    name: str
    graph: Graph
    op: Op
    trips: int
    scope: str


def op_sites(g: Graph, scope: str = "", trips: int = 1) -> list[OpSite]:
    """Every non-Repeat op of `g` in program order (Repeat bodies inlined once)."""
    out: list[OpSite] = []
    for op in g.ops:
        if isinstance(op, Repeat):
            out += op_sites(op.body, f"{scope}{op.name}/", op.trips)
        else:
            out.append(OpSite(f"{scope}{op.name}", g, op, trips, scope))
    return out


# ---------------------------------------------------------------- counting


def op_macs(g: Graph, op: Op) -> int:
    """Multiply-accumulates of one op (`op.macs`; Repeat: trips × body)."""
    if isinstance(op, Repeat):
        return op.trips * graph_macs(op.body)
    return op.macs(g)


def op_flops(g: Graph, op: Op) -> int:
    """Matmul FLOPs of one op: 2 × MACs (elementwise work is not counted; this
    is the numerator of the roofline fraction)."""
    return 2 * op_macs(g, op)


def graph_macs(g: Graph) -> int:
    return sum(op_macs(g, op) for op in g.ops)


def graph_flops(g: Graph) -> int:
    return 2 * graph_macs(g)


def model_parameter_count(g: Graph) -> int:
    """The model's parameters as published: the graph's (`parameter_count`)
    plus those its front end leaves on the host (attr `host_parameters`: an
    untied word-embedding table) minus the device tensors that are computed
    rather than learned (attr `derived_parameters`: RoPE tables)."""
    host, derived = g.attr("host_parameters", 0), g.attr("derived_parameters", 0)
    assert isinstance(host, int) and isinstance(derived, int)
    return parameter_count(g) + host - derived


def parameter_count(g: Graph) -> int:
    """Elements of all parameters of `g` (outer graph: iterated ones include
    every layer)."""
    return sum(g.tensor(p).size for p in g.parameters)
