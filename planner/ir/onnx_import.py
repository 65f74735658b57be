"""ONNX files as a model source: the model table of `planner.ir.models` and
the weights (our names) recognised in an exporter's graph.

`onnx_model(path)` reads the file with the `onnx` package (checker and shape
inference), then recognises, node by node, the patterns PyTorch's exporters
(TorchScript-based and torch.export-based) emit for a BERT-style encoder and
for a ViT tower:

- a ViT's patch embedding (`Conv` with kernel = stride, no padding, then the
  `Reshape` / `Transpose` to tokens; a `Shape` of it only sizes the view),
  the class-token `Concat` (a constant or an `Expand` of one: our patch
  input carries it as a zero row, so pos[0] absorbs cls - b_patch), the
  position `Add`; pre-LN blocks (the norm before q/k/v and before the MLP,
  residuals around them) and the final `LayerNormalization`;

- token embeddings: `Gather(word table, input_ids)` (gathered on the host, as
  the zoo's text models), token types (`Gather(type table, ...)`: the type-0
  row, single-segment inputs), positions (`Gather(table, constant indices)`
  or a constant-folded `[1, T, H]` slice), `LayerNormalization`;
- per layer: linears (`MatMul` by a 2-D initializer plus a bias `Add`, or
  `Gemm`), q / k / v told apart by the attention they feed (the score
  `MatMul`'s operands, the probabilities' `MatMul`), the head split and
  merge (`Reshape` / `Transpose`), the scaling (`Mul` / `Div` by constants
  whose product must be 1/sqrt(head size)), an additive mask `Add` computed
  from the `attention_mask` input, `Softmax` (and the NaN guard `IsNaN` /
  `Where` around it), the residual `Add` and the post-LN
  `LayerNormalization`, the GELU (the erf chain `Div, Erf, Add, Mul, Mul`,
  or `Gelu`), `Dropout` and `Identity` as no-ops, an all-zero constant
  mask `Add` (the dynamo exporter's, for none) as no mask;
- the pooler: `Gather` of the first token, `Gemm` (or linear), `Tanh`.

Nodes that only compute indices, shapes and the mask from the inputs and
constants need no pattern; every node on the hidden-state path must be
covered.  A node no pattern covers is a ConfigError naming the node, its op
type and what was expected there; a file that is not ONNX, is truncated or
fails the checker (a dangling input) names the file.  `provenance` maps each
recognised role ("layer 0 q", "embed_ln", ...) to the node names it came
from (`tileplan inspect` lists it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilecommon.errors import ConfigError

PASS = ("Dropout", "Identity")  # no-ops on the hidden path
VIEW = ("Reshape", "Transpose", "Squeeze", "Unsqueeze")  # head split / merge


@dataclass
class Imported:
    """What an ONNX file holds: the model table, our-named float32 weights,
    the host's word-embedding table and the nodes behind each role."""

    table: dict[str, Any]
    weights: dict[str, np.ndarray]
    word_embeddings: np.ndarray
    provenance: dict[str, list[str]] = field(default_factory=dict)
    op_types: dict[str, int] = field(default_factory=dict)


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
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for n in self.nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.inputs = [i.name for i in g.input if i.name not in self.const]
        self.outputs = [o.name for o in g.output]
        self.shapes: dict[str, list[int]] = {}
        for vi in [*g.value_info, *g.input, *g.output]:
            dims = vi.type.tensor_type.shape.dim
            self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in dims]

    def value(self, name: str) -> np.ndarray | None:
        """The constant behind `name` (through Identity nodes), or None."""
        seen = 0
        while name not in self.const and seen < 8:
            n = self.producer.get(name)
            if n is None or n.op_type != "Identity":
                return None
            name = n.input[0]
            seen += 1
        return self.const.get(name)

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


def onnx_model(path: str | Path) -> Imported:
    """Recognise the encoder of an ONNX file (module docstring); remembered
    per file and modification time (a model source is read for its table and
    again for its weights)."""
    p = Path(path)
    try:
        stamp = p.stat().st_mtime_ns
    except OSError:
        stamp = 0
    return _import(str(p), stamp)


# op types some pattern uses (on the hidden path or beside it)
KNOWN = frozenset({
    "Add", "Cast", "Concat", "Constant", "ConstantOfShape", "Conv", "Div", "Dropout",
    "Equal", "Erf", "Expand", "Flatten", "Gather", "GatherElements", "GatherND", "Gelu",
    "Gemm", "GreaterOrEqual", "Identity", "IsNaN", "LayerNormalization", "MatMul", "Mul",
    "Pow", "Reshape", "Shape", "Sigmoid", "Slice", "Softmax", "Squeeze", "Tanh", "Transpose",
    "Unsqueeze", "Where", "And"})


@functools.lru_cache(maxsize=4)
def _import(source: str, stamp: int) -> Imported:
    g = _Graph(load_onnx(source), source)
    try:
        return _recognise(g)
    except ConfigError as e:  # say what the file holds that no pattern knows
        counts: dict[str, int] = {}
        for n in g.nodes:
            if n.op_type not in KNOWN:
                counts[n.op_type] = counts.get(n.op_type, 0) + 1
        if not counts:
            raise
        raise ConfigError(e.source, e.field, f"{e.message}; op types no pattern handles: "
                          f"{dict(sorted(counts.items()))}", e.value) from None


def _recognise(g: _Graph) -> Imported:
    source = g.source
    covered: set[int] = set()
    prov: dict[str, list[str]] = {}

    def take(role: str, nodes: Iterable[Any]) -> None:
        for n in nodes:
            covered.add(id(n))
            prov.setdefault(role, []).append(n.name or n.output[0])

    weights: dict[str, np.ndarray] = {}
    conv = next((n for n in g.nodes if n.op_type == "Conv"
                 and g.back(n.input[0], ("Cast",))[0] in g.inputs), None)
    if conv is not None:  # a ViT tower: patches, class token, positions; pre-LN blocks
        h, start, fields = _patch_embeddings(g, conv, weights, take)
        table = np.zeros((0, 0), np.float32)
        pre = True
    else:
        h, start, fields, table = _token_embeddings(g, weights, take)
        pre = False
    hidden, tokens, eps = fields["hidden"], fields["tokens"], fields.get("eps", 0.0)
    layers: list[dict[str, np.ndarray]] = []
    heads = mlp = 0
    activation = ""
    mask = False
    final = None  # a pre-LN tower's last norm
    while True:
        users = g.users(h)
        ln1 = None
        if pre:
            ln1 = next((u for u in users if u.op_type == "LayerNormalization"), None)
            users = g.users(ln1.output[0]) if ln1 is not None else []
        lins = [x for x in (_linear(g, u) for u in users) if x is not None]
        if len(lins) != 3:
            final = ln1
            break
        i = len(layers)
        layer, info = _layer(g, h, lins, hidden, take, f"layer {i}", ln1)
        heads, mlp, activation = info["heads"], info["mlp"], info["activation"]
        eps = eps or info["eps"]
        mask = mask or info["mask"]
        layers.append(layer)
        h = info["out"]
    if not layers:
        raise ConfigError(source, "onnx", "no encoder layer (three linears reading one "
                                          "hidden state) after the embeddings")
    if pre:  # the final norm over every token
        if final is None:
            raise g.bad(g.producer[h], "expected the final LayerNormalization of the tower")
        weights["ln_f.gamma"], weights["ln_f.beta"] = _ln(g, final)
        take("ln_f", [final])
        h = final.output[0]
    pool = "none"
    users = g.users(h)
    gather = next((u for u in users if u.op_type in ("Gather", "Slice")), None)
    if gather is not None:
        lin = next((x for x in (_linear(g, u) for u in g.users(gather.output[0]))
                    if x is not None), None)
        tanh = g.users(lin[2])[0] if lin is not None and g.users(lin[2]) else None
        if lin is None or tanh is None or tanh.op_type != "Tanh":
            raise g.bad(gather, "expected the pooler: Gather of the first token, a linear, Tanh")
        weights["w_pool"], weights["b_pool"] = lin[0], _bias(lin)
        take("pooler", [gather, *lin[3], tanh])
        pool = "pooler"
    for k in layers[0]:
        weights[f"layers.{k}"] = np.stack([lay[k] for lay in layers])
    # every node on the hidden path is covered by a pattern
    hidden_path = _downstream(g, start)
    loose = [n for n in g.nodes if id(n) not in covered and id(n) in hidden_path
             and n.op_type not in PASS]
    if loose:
        n = loose[0]
        kinds: dict[str, int] = {}
        for x in loose:
            kinds[x.op_type] = kinds.get(x.op_type, 0) + 1
        raise g.bad(n, "no pattern covers it (expected part of an embedding, linear, "
                       "attention, LayerNorm, GELU, residual or pooler); uncovered on the "
                       f"hidden path: {dict(sorted(kinds.items()))}")
    name = Path(source).stem.split(".")[0]
    if name == "model":
        name = Path(source).resolve().parent.name
    table_out: dict[str, Any] = {
        "name": name, "hidden": int(hidden), "heads": int(heads), "mlp": int(mlp),
        "tokens": int(tokens), "layers": len(layers), "eps": float(eps),
        "activation": activation, "attention_mask": mask, "pool": pool}
    if pre:
        table_out.update(patch=fields["patch"], channels=fields["channels"])
    else:
        table_out.update({"input": "embeddings", "block": "post_ln", "embed_norm": True,
                          "final_norm": False, "vocab": fields["vocab"]})
        if fields["max_positions"] and fields["max_positions"] != tokens:
            table_out["max_positions"] = fields["max_positions"]
        if fields["type_vocab"]:
            table_out["type_vocab"] = fields["type_vocab"]
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return Imported(table_out, {k: np.asarray(v, np.float32) for k, v in weights.items()},
                    np.asarray(table, np.float32), prov, dict(sorted(counts.items())))


def _token_embeddings(g: _Graph, weights: dict[str, np.ndarray], take: Any
                      ) -> tuple[str, str, dict[str, Any], np.ndarray]:
    """A text encoder's embeddings: (hidden state after the embedding norm,
    the first value of the hidden path, fields, the host's word table)."""
    source = g.source
    ids = "input_ids" if "input_ids" in g.inputs else None
    word = next((n for n in g.nodes if n.op_type == "Gather" and g.value(n.input[0]) is not None
                 and n.input[1] in g.inputs), None)
    if ids is None or word is None:
        raise ConfigError(source, "onnx", "neither a token embedding (Gather of an initializer "
                                          "by input_ids) nor a patch Conv on an input: only "
                                          "BERT-style encoders and ViT towers import so far")
    table = g.value(word.input[0])
    assert table is not None
    vocab, hidden = table.shape
    tokens = g.shapes.get(ids, [0, 0])[-1]
    if tokens <= 0:
        raise ConfigError(source, "input_ids", "needs a static sequence length", tokens)
    take("word_embeddings", [word])
    # the embedding sum: Adds of gathered or constant rows, then a LayerNorm
    h = word.output[0]
    type_vocab = max_positions = 0
    while True:
        users = g.users(h)
        if len(users) != 1:
            raise g.bad(g.producer[h], "expected one consumer on the embedding path")
        n = users[0]
        if n.op_type == "LayerNormalization":
            break
        if n.op_type != "Add":
            raise g.bad(n, "expected the Add of position / token-type embeddings or the "
                           "embedding LayerNormalization")
        other = next(i for i in n.input if g.back(i, ())[0] != h)
        src = g.producer.get(other)
        if src is not None and src.op_type == "Gather" and g.value(src.input[0]) is not None:
            tab = g.value(src.input[0])
            assert tab is not None
            if tab.shape[0] <= 16 and "type_embed" not in weights:  # token types
                weights["type_embed"] = tab
                type_vocab = tab.shape[0]
                take("type_embeddings", [src, n])
            else:
                weights["pos_embed"] = tab
                max_positions = tab.shape[0]
                take("position_embeddings", [src, n])
        elif g.value(other) is not None:  # a constant-folded position slice [1, T, H]
            rows = g.value(other)
            assert rows is not None
            weights["pos_embed"] = rows.reshape(-1, hidden)
            max_positions = weights["pos_embed"].shape[0]
            take("position_embeddings", [n])
        else:
            raise g.bad(n, "expected an embedding table Gather or constant rows")
        h = n.output[0]
    ln = g.users(h)[0]
    weights["embed_ln.gamma"], weights["embed_ln.beta"] = _ln(g, ln)
    take("embed_ln", [ln])
    fields = {"hidden": int(hidden), "tokens": int(tokens), "eps": _eps(ln),
              "vocab": int(vocab), "type_vocab": int(type_vocab),
              "max_positions": int(max_positions)}
    return ln.output[0], word.output[0], fields, table


def _patch_embeddings(g: _Graph, conv: Any, weights: dict[str, np.ndarray], take: Any
                      ) -> tuple[str, str, dict[str, Any]]:
    """A ViT tower's embeddings: the patch Conv (kernel = stride, no padding)
    flattened to tokens, the class token concatenated in front, positions
    added.  Our patch input carries the class token as one more (zero) row,
    so its embedding is b_patch + pos[0]: pos[0] becomes cls + pos[0] -
    b_patch, the same sum."""
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    w = g.value(conv.input[1])
    if w is None or w.ndim != 4 or w.shape[2] != w.shape[3]:
        raise g.bad(conv, "expected a square patch kernel initializer [H, C, p, p]")
    hidden, channels, p = int(w.shape[0]), int(w.shape[1]), int(w.shape[2])
    if attrs.get("strides", [1, 1]) != [p, p] or any(attrs.get("pads", [0])) or \
            attrs.get("group", [1]) not in ([1], []):
        raise g.bad(conv, f"expected a patch embedding: stride = kernel ({p}), no padding")
    b = g.value(conv.input[2]) if len(conv.input) > 2 else None
    b = b if b is not None else np.zeros(hidden, np.float32)
    x, flat = conv.output[0], []
    while True:  # Reshape / Transpose to [B, N, H] (a Shape of it only sizes the view)
        users = [u for u in g.users(x) if u.op_type != "Shape"]
        if len(users) != 1 or users[0].op_type not in VIEW:
            break
        flat.append(users[0])
        x = users[0].output[0]
    nxt = next((u for u in g.users(x) if u.op_type != "Shape"), None)
    cls, cls_nodes, cat = None, [], None
    if nxt is not None and nxt.op_type == "Concat":  # the class token in front (ViT)
        cat = nxt
        other = next(i for i in cat.input if g.back(i, ())[0] != x)
        cls = g.value(other)
        if cls is None:  # Expand(cls_token, shape)
            ex = g.producer.get(other)
            cls = g.value(ex.input[0]) if ex is not None and ex.op_type == "Expand" else None
            cls_nodes = [ex]
        if cls is None:
            raise g.bad(cat, "expected a constant class token")
        nxt = next(iter(g.users(cat.output[0])), None)
    add, pos, pos_nodes = nxt, None, []
    if add is not None and add.op_type == "Add":
        for i in add.input:
            pos = g.value(i) if pos is None else pos
            src = g.producer.get(i)
            if pos is None and src is not None and src.op_type == "Gather":
                tab, idx = g.value(src.input[0]), g.value(src.input[1])
                if tab is not None and idx is not None:  # rows of a position table
                    pos, pos_nodes = tab[idx.reshape(-1)], [src]
    if pos is None or add is None:
        raise g.bad(cat or g.producer[x], "expected the position embedding Add after the "
                                          "patch tokens (and class token)")
    pos = pos.reshape(-1, hidden).astype(np.float32).copy()
    if cls is not None:
        pos[0] += cls.reshape(hidden) - b
    weights["w_patch"] = w.reshape(hidden, -1).T
    weights["b_patch"] = b
    weights["pos_embed"] = pos
    take("patch_embedding", [conv, *flat])
    if cat is not None:
        take("class_token", [cat, *[n for n in cls_nodes if n is not None]])
    take("position_embeddings", [add, *pos_nodes])
    return add.output[0], conv.output[0], {"hidden": hidden, "tokens": int(pos.shape[0]),
                                           "patch": p, "channels": channels}


def _bias(lin: tuple[np.ndarray, np.ndarray | None, str, list[Any]]) -> np.ndarray:
    return lin[1] if lin[1] is not None else np.zeros(lin[0].shape[1], np.float32)


def _ln(g: _Graph, n: Any) -> tuple[np.ndarray, np.ndarray]:
    gamma = g.value(n.input[1])
    beta = g.value(n.input[2]) if len(n.input) > 2 else None
    if gamma is None:
        raise g.bad(n, "expected a LayerNormalization with constant scale")
    return gamma, beta if beta is not None else np.zeros_like(gamma)


def _eps(n: Any) -> float:
    """The epsilon attribute (float32 in ONNX: 1e-12 reads 9.99999996e-13),
    to the 6 significant digits it was written with."""
    return float(f"{next((a.f for a in n.attribute if a.name == 'epsilon'), 1e-5):.6g}")


def _downstream(g: _Graph, start: str) -> set[int]:
    """ids of the nodes whose values depend on value `start` (a Shape of it
    depends only on its size: what is computed from that is not)."""
    seen: set[int] = set()
    todo = [start]
    while todo:
        v = todo.pop()
        for n in g.consumers.get(v, []):
            if n.op_type == "Shape":
                continue
            if id(n) not in seen:
                seen.add(id(n))
                todo.extend(n.output)
    return seen


def _layer(g: _Graph, h: str, lins: list[Any], hidden: int, take: Any, role: str,
           pre_norm: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One encoder layer reading hidden state `h`: post-LN (BERT), or pre-LN
    (ViT) when `pre_norm` is the LayerNormalization before its attention."""
    by_out = {lin[2]: lin for lin in lins}
    score = pv = None
    guard: list[Any] = []
    for n in g.nodes:
        if n.op_type != "MatMul" or g.value(n.input[1]) is not None:
            continue
        a, _ = g.back(n.input[0], VIEW + ("Mul", "Div"))
        b, _ = g.back(n.input[1], VIEW + ("Mul", "Div"))
        if a in by_out and b in by_out:
            score = n
        elif b in by_out and (probs := _probs(g, n.input[0])) is not None:
            pv, guard = n, probs[1]
    if score is None or pv is None:
        raise g.bad(g.users(h)[0], "expected attention: q, k and v linears feeding a score "
                                   "MatMul, Softmax and a probabilities MatMul")
    q_name, q_nodes = g.back(score.input[0], VIEW + ("Mul", "Div"))
    k_name, k_nodes = g.back(score.input[1], VIEW + ("Mul", "Div"))
    v_name, v_nodes = g.back(pv.input[1], VIEW + ("Mul", "Div"))
    q, k, v = by_out[q_name], by_out[k_name], by_out[v_name]
    # the scaling: constants multiplied into q and k (or dividing the scores)
    scale = 1.0
    for n in q_nodes + k_nodes:
        c = next((g.value(i) for i in n.input if g.value(i) is not None), None)
        if n.op_type in ("Mul", "Div") and c is not None:
            scale = scale * float(c.reshape(-1)[0]) if n.op_type == "Mul" else scale / float(
                c.reshape(-1)[0])
    # scores -> (scale) -> (+ mask) -> Softmax
    x = score.output[0]
    chain = [score]
    mask = False
    while True:
        users = g.users(x)
        if len(users) != 1:
            raise g.bad(g.producer[x], "expected the scores to flow into Softmax alone")
        n = users[0]
        chain.append(n)
        if n.op_type == "Softmax":
            break
        c = next((g.value(i) for i in n.input if g.value(i) is not None), None)
        if n.op_type in ("Mul", "Div") and c is not None:
            scale = scale * float(c.reshape(-1)[0]) if n.op_type == "Mul" else scale / float(
                c.reshape(-1)[0])
        elif n.op_type == "Add":
            other = next(i for i in n.input if g.back(i, ())[0] != x)
            zero = g.value(other)
            if zero is not None and not np.any(zero):
                pass  # a mask of zeros (the dynamo exporter's, for no mask)
            elif not _from_inputs(g, other) or zero is not None:
                raise g.bad(n, "expected an additive mask computed from the inputs")
            else:
                mask = True
        else:
            raise g.bad(n, "expected scaling, a mask Add or Softmax after the scores")
        x = n.output[0]
    reshape = g.shapes.get(score.output[0], [])
    heads = reshape[1] if len(reshape) == 4 and reshape[1] > 0 else 0
    for n in q_nodes if not heads else ():  # the head split's target shape [B, T, heads, dh]
        c = g.value(n.input[1]) if n.op_type == "Reshape" else None
        if c is not None and c.size == 4:
            heads = int(c[2]) if c[2] > 0 else hidden // int(c[3]) if c[3] > 0 else 0
    if heads <= 0 or hidden % heads:
        raise g.bad(score, "cannot tell the number of heads from the score shape")
    dh = hidden // heads
    if not math.isclose(scale, 1.0 / math.sqrt(dh), rel_tol=1e-3):
        raise g.bad(score, f"attention scale {scale:.6g}, expected 1/sqrt({dh})")
    # merge heads -> o linear -> residual Add(h) -> LayerNorm
    o = None
    merged, merge_nodes = pv.output[0], []
    while o is None:
        users = g.users(merged)
        if len(users) != 1:
            raise g.bad(pv, "expected the merged heads to feed the output linear")
        n = users[0]
        lin = _linear(g, n)
        if lin is not None:
            o = lin
            break
        if n.op_type not in VIEW:
            raise g.bad(n, "expected Reshape / Transpose merging the heads")
        merge_nodes.append(n)
        merged = n.output[0]
    if pre_norm is None:  # post-LN: norm(x + f(x))
        res1, ln1 = _residual_norm(g, o[2], h)
        mlp_in, stream = ln1.output[0], ln1.output[0]
    else:  # pre-LN: x + f(norm(x)); the second norm feeds the MLP
        ln1 = pre_norm
        res1, ln_mlp = _residual_norm(g, o[2], h)
        mlp_in, stream = ln_mlp.output[0], res1.output[0]
    fc1 = next((x for x in (_linear(g, u) for u in g.users(mlp_in)) if x is not None), None)
    if fc1 is None:
        raise g.bad(g.producer[mlp_in], "expected the MLP's first linear after a LayerNorm")
    act_nodes, activation, fc2_node = _activation(g, fc1[2])
    fc2 = _linear(g, fc2_node)
    assert fc2 is not None
    if pre_norm is None:
        res2, ln2 = _residual_norm(g, fc2[2], stream)
        out = ln2.output[0]
    else:
        res2, ln2 = _residual(g, fc2[2], stream), ln_mlp
        out = res2.output[0]
    take(f"{role} q", q[3] + q_nodes)
    take(f"{role} k", k[3] + k_nodes)
    take(f"{role} v", v[3] + v_nodes)
    take(f"{role} attention", chain + [pv] + guard + merge_nodes)
    take(f"{role} o", o[3] + [res1])
    take(f"{role} ln1", [ln1])
    take(f"{role} fc1", fc1[3])
    take(f"{role} {activation}", act_nodes)
    take(f"{role} fc2", fc2[3] + [res2])
    take(f"{role} ln2", [ln2])
    g1, b1 = _ln(g, ln1)
    g2, b2 = _ln(g, ln2)
    layer = {"w_q": q[0], "b_q": _bias(q), "w_k": k[0], "b_k": _bias(k), "w_v": v[0],
             "b_v": _bias(v), "w_o": o[0], "b_o": _bias(o), "ln1.gamma": g1, "ln1.beta": b1,
             "w_fc1": fc1[0], "b_fc1": _bias(fc1), "w_fc2": fc2[0], "b_fc2": _bias(fc2),
             "ln2.gamma": g2, "ln2.beta": b2}
    return layer, {"heads": heads, "mlp": fc1[0].shape[1], "activation": activation,
                   "mask": mask, "out": out, "eps": _eps(ln1)}


def _probs(g: _Graph, name: str) -> tuple[Any, list[Any]] | None:
    """(Softmax, the NaN-guard nodes after it) when `name` holds attention
    probabilities: a Softmax output, or `Where(IsNaN(p), 0, p)` of one."""
    n = g.producer.get(g.back(name, ())[0])
    if n is None:
        return None
    if n.op_type == "Softmax":
        return n, []
    if n.op_type == "Where":
        soft = [p for i in n.input if (p := g.producer.get(i)) is not None
                and p.op_type == "Softmax"]
        nan = g.producer.get(n.input[0])
        if soft and nan is not None and nan.op_type == "IsNaN":
            return soft[0], [n, nan]
    return None


def _residual(g: _Graph, x: str, skip: str) -> Any:
    """The residual Add of `x` and `skip`."""
    users = g.users(x)
    if len(users) != 1 or users[0].op_type != "Add":
        raise g.bad(g.producer[x], "expected the residual Add")
    add = users[0]
    other = [i for i in add.input if g.back(i, ())[0] != x]
    if len(other) != 1 or g.back(other[0], ())[0] != g.back(skip, ())[0]:
        raise g.bad(add, "expected the residual Add of the layer's input")
    return add


def _residual_norm(g: _Graph, x: str, skip: str) -> tuple[Any, Any]:
    add = _residual(g, x, skip)
    nxt = g.users(add.output[0])
    norm = next((n for n in nxt if n.op_type == "LayerNormalization"), None)
    if norm is None:
        raise g.bad(add, "expected LayerNormalization after the residual Add (post-LN: only "
                         "BERT-style blocks import so far)")
    return add, norm


def _activation(g: _Graph, x: str) -> tuple[list[Any], str, Any]:
    """The GELU nodes after the first MLP linear's output `x`, the form, and
    the second linear's first node."""
    nodes: list[Any] = []
    frontier = [x]
    fc2 = None
    seen: set[int] = set()
    while frontier:
        v = frontier.pop()
        for n in g.users(v):
            if id(n) in seen:
                continue
            if _linear(g, n) is not None and n.op_type in ("MatMul", "Gemm"):
                fc2 = n
                continue
            if n.op_type not in ("Div", "Erf", "Add", "Mul", "Gelu", "Pow", "Tanh",
                                 "Sigmoid"):
                raise g.bad(n, "expected the GELU (the erf or tanh form, CLIP's sigmoid "
                               "form, or Gelu) between the MLP's linears")
            seen.add(id(n))
            nodes.append(n)
            frontier.extend(n.output)
    kinds = {n.op_type for n in nodes}
    gelu = next((n for n in nodes if n.op_type == "Gelu"), None)
    if gelu is not None:
        approx = next((a.s.decode() for a in gelu.attribute if a.name == "approximate"), "none")
        form = "gelu_tanh" if approx == "tanh" else "gelu_erf"
    elif "Erf" in kinds:
        form = "gelu_erf"
    elif "Tanh" in kinds:
        form = "gelu_tanh"
    elif "Sigmoid" in kinds:
        form = "quick_gelu"
    else:
        form = ""
    if fc2 is None or not form:
        raise g.bad(g.producer[x], "expected a GELU and the MLP's second linear")
    return nodes, form, fc2


def _from_inputs(g: _Graph, name: str) -> bool:
    """True when `name` is computed from graph inputs and constants only
    (not from the hidden path)."""
    todo, seen = [name], set()
    while todo:
        v = todo.pop()
        if v in seen or v in g.inputs or g.value(v) is not None or not v:
            continue
        seen.add(v)
        n = g.producer.get(v)
        if n is None:
            return False
        if n.op_type in ("MatMul", "Gemm", "LayerNormalization", "Softmax"):
            return False
        todo.extend(n.input)
    return True

