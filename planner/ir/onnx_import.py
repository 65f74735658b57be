"""ONNX files as a model source: the model table of `planner.ir.models` and
the weights (our names) recognised in an exporter's graph.

`onnx_model(path)` reads the file with the `onnx` package (checker and shape
inference), then recognises, node by node, the patterns PyTorch's exporters
(TorchScript-based and torch.export-based) emit for a BERT-style encoder, for
ViT and SigLIP towers and for a Llama-style decoder:

- a decoder's blocks: RMSNorm's decomposition (Pow 2, ReduceMean, Add eps,
  Sqrt, Reciprocal, Mul, Mul gamma), RoPE's rotate-half form on q and k
  (x*cos + Concat(Neg(Slice), Slice)*sin; the base is recovered from the
  tables, which must be `rope_tables` of it), grouped-query k/v repeated by
  Unsqueeze / Expand / Reshape (kv heads from the k projection's width), a
  constant causal mask, the SwiGLU MLP (Sigmoid, Mul, Mul by the up
  projection), the final RMSNorm;

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
    "Unsqueeze", "Where", "And", "Neg", "ReduceMean", "Sqrt", "Reciprocal"})


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
        pre = bool(fields.get("decoder"))
    hidden, tokens, eps = fields["hidden"], fields["tokens"], fields.get("eps", 0.0)
    infos: list[dict[str, Any]] = []
    layers: list[dict[str, np.ndarray]] = []
    heads = mlp = 0
    activation = ""
    mask = False
    final = None  # a pre-LN tower's last norm
    while True:
        users = g.users(h)
        ln1 = None
        if pre:
            ln1 = _norm_of(g, h)
            users = g.users(ln1.out) if ln1 is not None else []
        lins = [x for x in (_linear(g, u) for u in users) if x is not None]
        if len(lins) != 3:
            final = ln1
            break
        i = len(layers)
        layer, info = _layer(g, h, lins, hidden, take, f"layer {i}", ln1)
        heads, mlp, activation = info["heads"], info["mlp"], info["activation"]
        eps = eps or info["eps"]
        mask = mask or info["mask"]
        infos.append(info)
        layers.append(layer)
        h = info["out"]
    if not layers:
        raise ConfigError(source, "onnx", "no encoder layer (three linears reading one "
                                          "hidden state) after the embeddings")
    if pre:  # the final norm over every token
        if final is None:
            raise g.bad(g.producer[h], "expected the final norm of the tower")
        weights["ln_f.gamma"] = final.gamma
        if final.beta is not None:
            weights["ln_f.beta"] = final.beta
        take("ln_f", final.nodes)
        h = final.out
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
    if fields.get("decoder"):
        first = infos[0]
        if first["rope"] is None or not first["causal"] or first["activation"] != "swiglu":
            raise ConfigError(source, "onnx", "a decoder imports with RoPE, causal attention "
                                              "and a SwiGLU MLP")
        table_out.update({"input": "embeddings", "norm": "rmsnorm", "attention": "causal",
                          "rope_theta": _rope_theta(g, first["rope"], tokens, hidden // heads),
                          "bias": first["bias"], "vocab": fields["vocab"]})
        if first["kv_heads"] != heads:
            table_out["kv_heads"] = first["kv_heads"]
    elif pre:
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
    h = word.output[0]
    start = _norm_of(g, h)
    if start is not None and start.kind == "rmsnorm":  # a decoder: straight into layer 0
        return h, h, {"hidden": int(hidden), "tokens": int(tokens), "vocab": int(vocab),
                      "decoder": True}, table
    # the embedding sum: Adds of gathered or constant rows, then a LayerNorm
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


@dataclass
class _Norm:
    """A normalisation applied to one value: a LayerNormalization node, or
    RMSNorm's decomposition (Pow 2, ReduceMean, Add eps, Sqrt, Reciprocal or
    Div, Mul, Mul gamma)."""

    kind: str  # "layernorm" | "rmsnorm"
    nodes: list[Any]
    out: str
    gamma: np.ndarray
    beta: np.ndarray | None
    eps: float


def _norm_of(g: _Graph, x: str) -> _Norm | None:
    """The norm a consumer of `x` starts, or None."""
    for n in g.users(x):
        if n.op_type == "LayerNormalization":
            scale, shift = _ln(g, n)
            return _Norm("layernorm", [n], n.output[0], scale, shift, _eps(n))
        if n.op_type == "Pow":
            two = g.value(n.input[1])
            if two is None or float(two.reshape(-1)[0]) != 2.0:
                continue
            chain, v = [n], n.output[0]
            for kind in ("ReduceMean", "Add", "Sqrt", ("Reciprocal", "Div")):
                nxt = g.users(v)
                if len(nxt) != 1 or nxt[0].op_type not in (kind if isinstance(kind, tuple)
                                                            else (kind,)):
                    break
                chain.append(nxt[0])
                v = nxt[0].output[0]
            else:
                eps_c = next((g.value(i) for i in chain[2].input if g.value(i) is not None),
                             None)
                times = [u for u in g.users(v) if u.op_type == "Mul"
                         and g.back(next(i for i in u.input if i != v), ())[0]
                         == g.back(x, ())[0]]
                if eps_c is None or len(times) != 1:
                    continue
                gmul = g.users(times[0].output[0])
                gamma = None
                if len(gmul) == 1 and gmul[0].op_type == "Mul":
                    consts = [c for i in gmul[0].input if (c := g.value(i)) is not None]
                    gamma = consts[0] if consts else None
                if gamma is None:
                    continue
                eps = float(f"{float(eps_c.reshape(-1)[0]):.6g}")
                return _Norm("rmsnorm", [*chain, times[0], gmul[0]], gmul[0].output[0],
                             gamma, None, eps)
    return None


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
        a, _, _ = _source(g, n.input[0])
        b, _, _ = _source(g, n.input[1])
        if a in by_out and b in by_out:
            score = n
        elif b in by_out and (probs := _probs(g, n.input[0])) is not None:
            pv, guard = n, probs[1]
    if score is None or pv is None:
        raise g.bad(g.users(h)[0], "expected attention: q, k and v linears feeding a score "
                                   "MatMul, Softmax and a probabilities MatMul")
    q_name, q_nodes, rope = _source(g, score.input[0])
    k_name, k_nodes, k_rope = _source(g, score.input[1])
    v_name, v_nodes, _ = _source(g, pv.input[1])
    q, k, v = by_out[q_name], by_out[k_name], by_out[v_name]
    if (rope is None) != (k_rope is None):
        raise g.bad(score, "expected RoPE on both q and k, or on neither")
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
    mask = causal = False
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
            elif zero is not None and _is_causal(zero):
                causal = True
            elif not _from_inputs(g, other) or zero is not None:
                raise g.bad(n, "expected an additive mask computed from the inputs, or a "
                               "causal one")
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
        mlp_in, stream = ln1.out, ln1.out
    else:  # pre-LN: x + f(norm(x)); the second norm feeds the MLP
        ln1 = pre_norm
        res1, ln_mlp = _residual_norm(g, o[2], h)
        mlp_in, stream = ln_mlp.out, res1.output[0]
    firsts = [x for x in (_linear(g, u) for u in g.users(mlp_in)) if x is not None]
    if not firsts:
        raise g.bad(g.producer[mlp_in], "expected the MLP's first linear after a norm")
    gate = up = None
    if len(firsts) == 2:  # SwiGLU: silu(x W_gate) * (x W_up)
        gate = next((f for f in firsts if any(u.op_type == "Sigmoid" for u in g.users(f[2]))),
                    None)
        up = next((f for f in firsts if f is not gate), None)
        if gate is None or up is None:
            raise g.bad(g.producer[mlp_in], "expected a gated MLP (SiLU gate and up "
                                            "projection)")
        act_nodes, activation, fc2_node = _swiglu(g, gate[2], up[2])
        fc1 = gate
    else:
        fc1 = firsts[0]
        act_nodes, activation, fc2_node = _activation(g, fc1[2])
    fc2 = _linear(g, fc2_node)
    assert fc2 is not None
    if pre_norm is None:
        res2, ln2 = _residual_norm(g, fc2[2], stream)
        out = ln2.out
    else:
        res2, ln2 = _residual(g, fc2[2], stream), ln_mlp
        out = res2.output[0]
    take(f"{role} q", q[3] + q_nodes + (rope[2] if rope is not None else []))
    take(f"{role} k", k[3] + k_nodes + (k_rope[2] if k_rope is not None else []))
    take(f"{role} v", v[3] + v_nodes)
    take(f"{role} attention", chain + [pv] + guard + merge_nodes)
    take(f"{role} o", o[3] + [res1])
    take(f"{role} ln1", ln1.nodes)
    take(f"{role} {'gate, up' if up is not None else 'fc1'}",
         fc1[3] + (up[3] if up is not None else []))
    take(f"{role} {activation}", act_nodes)
    take(f"{role} {'down' if up is not None else 'fc2'}", fc2[3] + [res2])
    take(f"{role} ln2", ln2.nodes)
    layer = {"w_q": q[0], "w_k": k[0], "w_v": v[0], "w_o": o[0], "ln1.gamma": ln1.gamma,
             "ln2.gamma": ln2.gamma}
    has = {n: x[1] is not None for n, x in (("q", q), ("k", k), ("v", v), ("o", o),
                                             ("fc1", fc1), ("fc2", fc2), ("up", up))
           if x is not None}
    if ln1.beta is not None and ln2.beta is not None:
        layer.update({"ln1.beta": ln1.beta, "ln2.beta": ln2.beta})
    if up is not None:  # the gated MLP: gate, up, down
        layer.update(w_gate=fc1[0], w_up=up[0], w_down=fc2[0])
    else:
        layer.update(w_fc1=fc1[0], w_fc2=fc2[0])
    if has["q"] and has["k"] and has["v"] and not any(
            b for n, b in has.items() if n not in ("q", "k", "v")):
        bias = "qkv"  # Qwen's: the q, k and v projections only
        layer.update(b_q=_bias(q), b_k=_bias(k), b_v=_bias(v))
    elif any(has.values()):  # a bias an exporter dropped was zero
        bias = "all"
        layer.update(b_q=_bias(q), b_k=_bias(k), b_v=_bias(v), b_o=_bias(o))
        if up is None:
            layer.update(b_fc1=_bias(fc1), b_fc2=_bias(fc2))
    else:
        bias = "none"
    return layer, {"heads": heads, "mlp": fc1[0].shape[1], "activation": activation,
                   "mask": mask, "out": out, "eps": ln1.eps, "norm": ln1.kind,
                   "kv_heads": k[0].shape[1] // (hidden // heads), "rope": rope,
                   "bias": bias, "causal": causal}


TRACE = VIEW + ("Mul", "Div", "Expand")  # scaling and GQA's repeat of k/v heads


def _rope_at(g: _Graph, add: Any) -> tuple[str, list[Any], np.ndarray, np.ndarray] | None:
    """(x, nodes, cos, sin) when `add` is RoPE's rotate-half form
    x * cos + concat(-x[..., d/2:], x[..., :d/2]) * sin."""
    if add.op_type != "Add":
        return None
    parts = [p for i in add.input if (p := g.producer.get(i)) is not None]
    if len(parts) != 2 or any(p.op_type != "Mul" for p in parts):
        return None
    direct: tuple[Any, str, np.ndarray] | None = None
    rot: tuple[Any, Any, np.ndarray] | None = None
    for p in parts:
        data = [i for i in p.input if g.value(i) is None]
        const = [c for i in p.input if (c := g.value(i)) is not None]
        src = g.producer.get(data[0]) if len(data) == 1 else None
        if len(const) != 1:
            return None
        if src is not None and src.op_type == "Concat":
            rot = (p, src, const[0])
        else:
            direct = (p, data[0] if data else "", const[0])
    if direct is None or rot is None:
        return None
    mul_r, cat, sin = rot
    neg = g.producer.get(cat.input[0])
    if neg is None or neg.op_type != "Neg":
        return None
    slices = [g.producer.get(neg.input[0]), g.producer.get(cat.input[1])]
    if any(x is None or x.op_type != "Slice" or x.input[0] != direct[1] for x in slices):
        return None
    return direct[1], [add, direct[0], mul_r, cat, neg, *slices], direct[2], sin


def _source(g: _Graph, name: str) -> tuple[str, list[Any], Any]:
    """Follow an attention operand back through views, scaling, k/v head
    repeats and RoPE to the linear it came from: (value, nodes passed, rope
    as (cos, sin, its nodes) or None)."""
    nodes: list[Any] = []
    rope = None
    while True:
        v, passed = g.back(name, TRACE + ("Unsqueeze",))
        nodes += passed
        n = g.producer.get(v)
        hit = _rope_at(g, n) if n is not None else None
        if hit is None:
            return v, nodes, rope
        name, more, cos, sin = hit
        rope = (cos, sin, more)


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
    norm = _norm_of(g, add.output[0])
    del nxt
    if norm is None:
        raise g.bad(add, "expected a norm after the residual Add (post-LN: only "
                         "BERT-style blocks import so far)")
    return add, norm


def _swiglu(g: _Graph, gate: str, up: str) -> tuple[list[Any], str, Any]:
    """silu(gate) * up: Sigmoid(gate) * gate, times up; the down linear's node."""
    sig = next((u for u in g.users(gate) if u.op_type == "Sigmoid"), None)
    if sig is None:
        raise g.bad(g.producer[gate], "expected the SiLU gate (Sigmoid and Mul)")
    silu = next((u for u in g.users(sig.output[0]) if u.op_type == "Mul"
                 and gate in [g.back(i, ())[0] for i in u.input]), None)
    if silu is None:
        raise g.bad(sig, "expected Mul(gate, Sigmoid(gate))")
    prod = next((u for u in g.users(silu.output[0]) if u.op_type == "Mul"
                 and up in [g.back(i, ())[0] for i in u.input]), None)
    if prod is None:
        raise g.bad(silu, "expected the gate times the up projection")
    down = next((u for u in g.users(prod.output[0]) if _linear(g, u) is not None), None)
    if down is None:
        raise g.bad(prod, "expected the down projection")
    return [sig, silu, prod], "swiglu", down


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


def _rope_theta(g: _Graph, rope: tuple[np.ndarray, np.ndarray, list[Any]], tokens: int,
                dh: int) -> float:
    """The base of RoPE tables [.., T, dh] (rotate-half: both halves alike),
    from position 1's angles; the tables must be rope_tables(T, dh, theta)."""
    from planner.ir.ops.rope import rope_tables

    cos, sin = (np.asarray(t, np.float64).reshape(-1, dh) for t in rope[:2])
    if cos.shape[0] != tokens or not np.allclose(cos[:, :dh // 2], cos[:, dh // 2:]):
        raise g.bad(rope[2][0], f"expected rotate-half RoPE tables [{tokens}, {dh}]")
    # frequency 1 = theta^(-2/dh): the slope of its unwrapped angle over the positions
    ang = np.unwrap(np.arctan2(sin[:, 1], cos[:, 1]))
    slope = float(np.dot(np.arange(tokens), ang) / np.dot(np.arange(tokens), np.arange(tokens)))
    theta = float(f"{slope ** (-dh / 2):.4g}")
    mine = rope_tables(tokens, dh, theta)
    if not (np.allclose(mine[0], cos[:, : dh // 2], atol=1e-4)
            and np.allclose(mine[1], sin[:, : dh // 2], atol=1e-4)):
        raise g.bad(rope[2][0], f"RoPE tables are not those of base {theta:g}")
    return theta


def _is_causal(m: np.ndarray) -> bool:
    """True for an additive [.., T, T] mask that hides exactly the keys after
    each query (very negative above the diagonal, zero on and below it)."""
    if m.ndim < 2 or m.shape[-1] != m.shape[-2]:
        return False
    t = m.shape[-1]
    above = np.triu(np.ones((t, t), bool), 1)
    sq = m.reshape(-1, t, t)
    return bool(np.all(sq[:, ~above] == 0) and np.all(sq[:, above] <= -1e4))


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

