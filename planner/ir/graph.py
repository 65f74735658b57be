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
- per-op shape and dtype rules (below; `_check_<Op>`);
- a Repeat's body is itself a valid graph whose `inputs` are the arguments
  (kind "input") and `outputs` the yields (kind "output"); argument k, yield k,
  init k and final k have equal shape, dtype and scale_exp; an iterated
  parameter's outer tensor has shape `(trips, *body_shape)`, invariant ones the
  body shape; every body parameter is bound exactly once.

Extension of the contract: `Broadcast` repeats x [R, N] row-periodically
into out [B·R, N] (out[r] = x[r mod R]; the MAP head's learned probe over
the batch), a pure data movement like SplitHeads/MergeHeads (`MOVE_OPS`).
`Add` allows `b` with fewer rows than `a` when
`b.shape[0]` divides `a.shape[0]` (row-periodic broadcast: the position
embedding [T, H] added to [B·T, H]; out[r] = a[r] + b[r mod b.rows]).

The reference-only precision variant (`load_model(..., precision="fp32")`) has
fp32 MatMul operands; the verifier accepts that, the planner need not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Union

from kernels.abi import DTYPE_SIZE
from tilecommon.errors import GraphError

DTYPES = ("fp8", "fp16", "fp32")
KINDS = ("activation", "parameter", "input", "output")
DTYPE_BYTES = DTYPE_SIZE  # dtype name -> bytes (kernels.abi)


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
    None is left out) and writes (`WRITES`)."""

    READS: ClassVar[tuple[str, ...]] = ()
    WRITES: ClassVar[tuple[str, ...]] = ("out",)

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


@dataclass(frozen=True)
class MatMul(OpBase):
    """out[M,N] = a[M,K] @ b[K,N] (+ bias[N]), fp32 accumulation, one rounding."""

    READS: ClassVar[tuple[str, ...]] = ("a", "b", "bias")

    a: str
    b: str
    out: str
    bias: str | None = None


@dataclass(frozen=True)
class BatchMatMul(OpBase):
    """out[Bt,M,N] = a[Bt,M,K] @ b[Bt,K,N] (b is [Bt,N,K] when transpose_b)."""

    READS: ClassVar[tuple[str, ...]] = ("a", "b")

    a: str
    b: str
    out: str
    transpose_b: bool = False


@dataclass(frozen=True)
class LayerNorm(OpBase):
    """Over the last dim of x [M,N]; fp32 statistics (two-pass, biased variance)."""

    READS: ClassVar[tuple[str, ...]] = ("x", "gamma", "beta")

    x: str
    gamma: str
    beta: str
    out: str
    eps: float


@dataclass(frozen=True)
class Gelu(OpBase):
    """Tanh-form GELU in fp32."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str


@dataclass(frozen=True)
class Softmax(OpBase):
    """Softmax over the last dim of x*scale, max-subtracted, fp32 inside."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str
    scale: float


@dataclass(frozen=True)
class Add(OpBase):
    """out = a + b in fp32, one rounding; b may be row-periodic (see module doc)."""

    READS: ClassVar[tuple[str, ...]] = ("a", "b")

    a: str
    b: str
    out: str


@dataclass(frozen=True)
class Cast(OpBase):
    """out = convert(x) to out.dtype with out.scale_exp (contracts §1)."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str


@dataclass(frozen=True)
class SplitHeads(OpBase):
    """x [B·T, H] -> out [B·heads, T, H/heads]; out[b·heads+h, t, d] = x[b·T+t, h·dh+d]."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str
    heads: int


@dataclass(frozen=True)
class MergeHeads(OpBase):
    """Inverse of SplitHeads: x [B·heads, T, dh] -> out [B·T, heads·dh]."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str
    heads: int


@dataclass(frozen=True)
class Broadcast(OpBase):
    """x [R, N] -> out [B·R, N] with out[r] = x[r mod R] (row-periodic copy)."""

    READS: ClassVar[tuple[str, ...]] = ("x",)

    x: str
    out: str


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


Op = Union[  # noqa: UP007 - a runtime alias used in isinstance-free annotations
    MatMul, BatchMatMul, LayerNorm, Gelu, Softmax, Add, Cast, SplitHeads, MergeHeads,
    Broadcast, Repeat
]
OP_TYPES = (MatMul, BatchMatMul, LayerNorm, Gelu, Softmax, Add, Cast, SplitHeads, MergeHeads,
            Broadcast, Repeat)
# ops that only move data between canonical layouts (lowered as one exchange)
MOVE_OPS = (SplitHeads, MergeHeads, Broadcast)


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
        if not isinstance(op, OP_TYPES):
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
        _CHECKS[type(op)](g, op)
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


def _same_shape(op: OpBase, what: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise GraphError(op.name, f"{what}: {a.name} {a.shape} vs {b.name} {b.shape}")


def _dtype_in(op: OpBase, t: Tensor, allowed: tuple[str, ...]) -> None:
    if t.dtype not in allowed:
        raise GraphError(op.name, f"{t.name}: dtype {t.dtype} not in {allowed}")


def _rank(op: OpBase, t: Tensor, rank: int) -> None:
    if len(t.shape) != rank:
        raise GraphError(op.name, f"{t.name}: rank {len(t.shape)} (shape {t.shape}), want {rank}")


_ACT = ("fp16", "fp32")


def _check_matmul(g: Graph, op: MatMul) -> None:
    a, b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    for t in (a, b, out):
        _rank(op, t, 2)
    _dtype_in(op, a, DTYPES)
    if a.dtype != b.dtype:
        raise GraphError(op.name, f"operand dtypes differ: {a.dtype} vs {b.dtype}")
    _dtype_in(op, out, _ACT)
    if a.shape[1] != b.shape[0]:
        raise GraphError(op.name, f"inner dims differ: {op.a} {a.shape} @ {op.b} {b.shape}")
    if out.shape != (a.shape[0], b.shape[1]):
        raise GraphError(op.name, f"out {out.shape} != {(a.shape[0], b.shape[1])}")
    if op.bias is not None:
        bias = g.tensor(op.bias)
        _dtype_in(op, bias, _ACT)
        if bias.shape != (b.shape[1],):
            raise GraphError(op.name, f"bias {bias.shape} != {(b.shape[1],)}")


def _check_batch_matmul(g: Graph, op: BatchMatMul) -> None:
    a, b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    for t in (a, b, out):
        _rank(op, t, 3)
    _dtype_in(op, a, DTYPES)
    if a.dtype != b.dtype:
        raise GraphError(op.name, f"operand dtypes differ: {a.dtype} vs {b.dtype}")
    _dtype_in(op, out, _ACT)
    k_b, n = (b.shape[2], b.shape[1]) if op.transpose_b else (b.shape[1], b.shape[2])
    if a.shape[0] != b.shape[0] or a.shape[2] != k_b:
        raise GraphError(
            op.name, f"shapes {a.shape} @ {b.shape} (transpose_b={op.transpose_b}) mismatch"
        )
    if out.shape != (a.shape[0], a.shape[1], n):
        raise GraphError(op.name, f"out {out.shape} != {(a.shape[0], a.shape[1], n)}")


def _check_layernorm(g: Graph, op: LayerNorm) -> None:
    x, out = g.tensor(op.x), g.tensor(op.out)
    _rank(op, x, 2)
    _same_shape(op, "out shape", x, out)
    _dtype_in(op, x, _ACT)
    _dtype_in(op, out, _ACT)
    for p in (g.tensor(op.gamma), g.tensor(op.beta)):
        _dtype_in(op, p, _ACT)
        if p.shape != (x.shape[1],):
            raise GraphError(op.name, f"{p.name} {p.shape} != {(x.shape[1],)}")
    if not (isinstance(op.eps, float) and 0.0 < op.eps < 1.0):
        raise GraphError(op.name, f"eps {op.eps!r} must be a float in (0, 1)")


def _check_elementwise(g: Graph, op: Gelu | Softmax | Cast) -> None:
    x, out = g.tensor(op.x), g.tensor(op.out)
    _same_shape(op, "out shape", x, out)
    if isinstance(op, Cast):
        return
    _dtype_in(op, x, _ACT)
    _dtype_in(op, out, _ACT)
    if isinstance(op, Softmax) and not (isinstance(op.scale, float) and op.scale > 0.0):
        raise GraphError(op.name, f"scale {op.scale!r} must be a positive float")


def _check_add(g: Graph, op: Add) -> None:
    a, b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    _same_shape(op, "out shape", a, out)
    for t in (a, b, out):
        _dtype_in(op, t, _ACT)
    if a.shape == b.shape:
        return
    if len(a.shape) != len(b.shape) or a.shape[1:] != b.shape[1:] or a.shape[0] % b.shape[0]:
        raise GraphError(
            op.name, f"b {b.shape} neither equals a {a.shape} nor divides its rows"
        )


def _check_heads(g: Graph, op: SplitHeads | MergeHeads) -> None:
    x, out = g.tensor(op.x), g.tensor(op.out)
    flat, split = (x, out) if isinstance(op, SplitHeads) else (out, x)
    _rank(op, flat, 2)
    _rank(op, split, 3)
    if x.dtype != out.dtype:
        raise GraphError(op.name, f"dtype changes {x.dtype} -> {out.dtype}")
    if op.heads <= 0 or split.shape[0] % op.heads:
        raise GraphError(op.name, f"heads {op.heads} does not divide {split.name} {split.shape}")
    batch, tokens, dh = split.shape[0] // op.heads, split.shape[1], split.shape[2]
    if flat.shape != (batch * tokens, op.heads * dh):
        raise GraphError(
            op.name, f"{flat.name} {flat.shape} != {(batch * tokens, op.heads * dh)} "
            f"for {split.name} {split.shape} with {op.heads} heads"
        )


def _check_broadcast(g: Graph, op: Broadcast) -> None:
    x, out = g.tensor(op.x), g.tensor(op.out)
    _rank(op, x, 2)
    _rank(op, out, 2)
    if (x.dtype, x.scale_exp) != (out.dtype, out.scale_exp):
        raise GraphError(op.name, f"format changes {x.dtype} -> {out.dtype}")
    if x.shape[1] != out.shape[1] or out.shape[0] % x.shape[0]:
        raise GraphError(op.name, f"out {out.shape} is not a whole number of copies of "
                                  f"{x.name} {x.shape}")


def _same_format(op: OpBase, what: str, a: Tensor, b: Tensor) -> None:
    if (a.shape, a.dtype, a.scale_exp) != (b.shape, b.dtype, b.scale_exp):
        raise GraphError(
            op.name, f"{what}: {a.name} {a.shape} {a.dtype} e{a.scale_exp} vs "
            f"{b.name} {b.shape} {b.dtype} e{b.scale_exp}"
        )


def _check_repeat(g: Graph, op: Repeat) -> None:
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
            if outer.kind != "parameter" or inner.kind != "parameter":
                raise GraphError(op.name, f"binding {outer_name}->{body_name}: not parameters")
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


_CHECKS: dict[type, Callable[[Graph, Any], None]] = {
    MatMul: _check_matmul,
    BatchMatMul: _check_batch_matmul,
    LayerNorm: _check_layernorm,
    Gelu: _check_elementwise,
    Softmax: _check_elementwise,
    Cast: _check_elementwise,
    Add: _check_add,
    SplitHeads: _check_heads,
    MergeHeads: _check_heads,
    Broadcast: _check_broadcast,
    Repeat: _check_repeat,
}


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
    """Multiply-accumulates of one op (MatMul/BatchMatMul; Repeat: trips × body)."""
    if isinstance(op, MatMul):
        m, k = g.tensor(op.a).shape
        return m * k * g.tensor(op.b).shape[1]
    if isinstance(op, BatchMatMul):
        bt, m, k = g.tensor(op.a).shape
        return bt * m * k * g.tensor(op.out).shape[2]
    if isinstance(op, Repeat):
        return op.trips * graph_macs(op.body)
    return 0


def op_flops(g: Graph, op: Op) -> int:
    """Matmul FLOPs of one op: 2 × MACs (elementwise work is not counted; this
    is the numerator of the roofline fraction)."""
    return 2 * op_macs(g, op)


def graph_macs(g: Graph) -> int:
    return sum(op_macs(g, op) for op in g.ops)


def graph_flops(g: Graph) -> int:
    return 2 * graph_macs(g)


def parameter_count(g: Graph) -> int:
    """Elements of all parameters of `g` (outer graph: iterated ones include
    every layer)."""
    return sum(g.tensor(p).size for p in g.parameters)
