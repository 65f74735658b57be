"""The ONNX graph as the importer reads it (planner.ir.onnx_import):
`load_onnx` (checker and shape inference, a ConfigError naming the file),
`_Graph` (constants folded, producers and consumers, a walk back through
chosen node kinds, errors naming a node) and `_linear` (a MatMul by a 2-D
initializer plus its bias Add, or a Gemm)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tilecommon.errors import ConfigError

PASS = ("Dropout", "Identity")  # no-ops on the hidden path
VIEW = ("Reshape", "Transpose", "Squeeze", "Unsqueeze")  # head split / merge
# layout of constants (and the shapes they take): folded
FOLD = ("Identity", *VIEW, "Split", "Expand", "Tile", "ConstantOfShape")


class _Graph:
    """The ONNX graph with constants folded where they are plain values."""

    def __init__(self, model: Any, source: str) -> None:
        from onnx import numpy_helper

        self.source = source
        g = model.graph
        self.nodes = list(g.node)
        self.const: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i)
                                             for i in g.initializer}
        self.alias: dict[str, str] = {}
        for n in self.nodes:
            if n.op_type == "Constant":
                for a in n.attribute:
                    if a.name == "value":
                        self.const[n.output[0]] = numpy_helper.to_array(a.t)
        self._folding = 0  # depth of `value`'s walk through foldable nodes
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inputs = [i.name for i in g.input if i.name not in self.const]
        self.outputs = [o.name for o in g.output]
        self.shapes: dict[str, list[int]] = {}
        self.elem_types: dict[str, int] = {}  # onnx.TensorProto element types
        for vi in [*g.value_info, *g.input, *g.output]:
            self.elem_types[vi.name] = vi.type.tensor_type.elem_type
            dims = vi.type.tensor_type.shape.dim
            self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in dims]

    def value(self, name: str) -> np.ndarray | None:
        """The constant behind `name`, or None: through Identity nodes and
        through the layout nodes of constants (`FOLD`: the TorchScript
        exporter's Expand / Tile of the MAP head's probe, the dynamo
        exporter's Split and Transpose of a packed in-projection), which are
        evaluated once and remembered.  Arithmetic is never folded: a weight
        stays a weight."""
        if name in self.const:
            return self.const[name]
        n = self.producer.get(name)
        if n is None or n.op_type not in FOLD or self._folding > 32:
            return None
        self._folding += 1
        try:
            args = [self.value(i) if i else None for i in n.input]
        finally:
            self._folding -= 1
        if any(i and a is None for i, a in zip(n.input, args, strict=True)):
            return None
        out = _fold(n, args, name)
        if out is not None:
            self.const[name] = out
        return out

    def bad(self, node: Any, what: str) -> ConfigError:
        return ConfigError(self.source, f"node {node.name or node.output[0]}",
                           f"{node.op_type}: {what}")

    def users(self, name: str) -> list[Any]:
        """The consumers of `name`, looking through no-op nodes."""
        out = []
        for n in self.consumers.get(name, []):
            if n.op_type in PASS:
                out += self.users(n.output[0])
            else:
                out.append(n)
        return out

    def back(self, name: str, through: Iterable[str]) -> tuple[str, list[Any]]:
        """Follow `name` back through nodes of the kinds `through` (their first
        non-constant input): the value reached and the nodes passed."""
        passed: list[Any] = []
        kinds = set(through) | set(PASS)
        while True:
            n = self.producer.get(name)
            if n is None or n.op_type not in kinds:
                return name, passed
            passed.append(n)
            data = [i for i in n.input if i and self.value(i) is None]
            if not data:
                return name, passed
            name = data[0]


def _fold(n: Any, args: list[np.ndarray | None], name: str) -> np.ndarray | None:
    """The output `name` of layout node `n` on constant inputs `args`, or
    None when its attributes are not the plain ones exporters write."""
    attrs = {a.name: a for a in n.attribute}
    x = args[0]
    assert x is not None
    try:
        if n.op_type == "Identity":
            return x
        if n.op_type == "Transpose":
            perm = list(attrs["perm"].ints) if "perm" in attrs else None
            return np.transpose(x, perm)
        if n.op_type == "Reshape":
            dims = [int(d) for d in np.asarray(args[1]).reshape(-1)]
            if not ("allowzero" in attrs and attrs["allowzero"].i):
                dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
            return x.reshape(dims)
        if n.op_type in ("Squeeze", "Unsqueeze"):
            axes = args[1] if len(args) > 1 and args[1] is not None else \
                (list(attrs["axes"].ints) if "axes" in attrs else None)
            if n.op_type == "Squeeze":
                return np.squeeze(x, None if axes is None else tuple(int(a) for a in
                                                                 np.ravel(axes)))
            if axes is None:
                return None
            return np.expand_dims(x, tuple(int(a) for a in np.ravel(axes)))
        if n.op_type == "Expand":
            assert args[1] is not None
            shape = tuple(int(d) for d in np.ravel(args[1]))
            return np.broadcast_to(x, np.broadcast_shapes(x.shape, shape)).copy()
        if n.op_type == "ConstantOfShape":
            from onnx import numpy_helper

            fill = numpy_helper.to_array(attrs["value"].t) if "value" in attrs else \
                np.zeros(1, np.float32)
            return np.full(tuple(int(d) for d in np.ravel(x)), fill.reshape(-1)[0], fill.dtype)
        if n.op_type == "Tile":
            assert args[1] is not None
            return np.tile(x, tuple(int(d) for d in np.ravel(args[1])))
        if n.op_type == "Split":
            axis = attrs["axis"].i if "axis" in attrs else 0
            if len(args) > 1 and args[1] is not None:
                sizes = [int(d) for d in np.ravel(args[1])]
            elif "split" in attrs:
                sizes = list(attrs["split"].ints)
            else:  # equal parts (opset 18: num_outputs)
                k = len(n.output)
                sizes = [x.shape[axis] // k] * k
            cuts = np.cumsum(sizes)[:-1]
            return np.split(x, cuts, axis=axis)[list(n.output).index(name)]
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    return None


def _linear(g: _Graph, node: Any) -> tuple[np.ndarray, np.ndarray | None, str, list[Any]] | None:
    """(W [in, out], bias or None, output name, nodes) of a linear starting
    at `node` (MatMul by a 2-D constant, + bias Add; or Gemm)."""
    if node.op_type == "Gemm":
        w = g.value(node.input[1])
        attrs = {a.name: a for a in node.attribute}
        if w is None or w.ndim != 2:
            return None
        if "transB" in attrs and attrs["transB"].i:
            w = w.T
        b = g.value(node.input[2]) if len(node.input) > 2 else None
        return w, b, node.output[0], [node]
    if node.op_type != "MatMul":
        return None
    w = g.value(node.input[1])
    if w is None or w.ndim != 2:
        return None
    users = g.users(node.output[0])
    if len(users) == 1 and users[0].op_type == "Add":
        add = users[0]
        other = [i for i in add.input if i != node.output[0]]
        b = g.value(other[0]) if other else None
        if b is not None and b.shape == (w.shape[1],):
            return w, b, add.output[0], [node, add]
    return w, None, node.output[0], [node]


def load_onnx(path: str | Path) -> Any:
    """The checked, shape-inferred ONNX model (ConfigError naming the file)."""
    import onnx

    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(path), "model", "file not found")
    try:
        model = onnx.load(str(p))
    except Exception as e:  # DecodeError and friends: not an ONNX protobuf
        raise ConfigError(str(path), "onnx", f"not an ONNX model: {e}") from None
    if not model.graph.node:
        raise ConfigError(str(path), "onnx", "not an ONNX model (no graph nodes)")
    try:
        onnx.checker.check_model(model)
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as e:  # ValidationError, InferenceError: dangling inputs and the like
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(str(path), "onnx", f"does not check: {first}") from None
    return model
