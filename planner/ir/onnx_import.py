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
  the class-token `Concat` (constants or `Expand`s of them, DeiT's
  distillation token after the class token: our patch input carries each
  as a zero row, so pos[i] absorbs token - b_patch), the
  position `Add`, a `LayerNormalization` of the embeddings before the first
  block's own (CLIP's pre-layernorm); pre-LN blocks (the norm before q/k/v
  and before the MLP, residuals around them) and the final
  `LayerNormalization` (CLIP: on the first token only, `Gather` / `Slice`
  then the norm, beside the hidden states), or SigLIP's MAP head after it
  (planner.ir.onnx_head);

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

This module recognises the embeddings and walks the layers; the graph it
reads is planner.ir.onnx_graph's, one layer's patterns are
planner.ir.onnx_layers'.  A file no template matches is tried as any DAG
of the IR's op kinds (planner.ir.onnx_dag: `Imported.dag`, an empty
`table`); when that fails too, the error says both reasons.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.ir.hf import MAP_TOWER
from planner.ir.onnx_dag import Dag, dag_import
from planner.ir.onnx_graph import PASS, VIEW, _Graph, _linear, load_onnx
from planner.ir.onnx_head import map_head
from planner.ir.onnx_layers import _bias, _downstream, _layer, _norm_of, _rope_theta
from tilecommon.errors import ConfigError


@dataclass
class Imported:
    """What an ONNX file holds: the model table, our-named float32 weights,
    the host's word-embedding table and the nodes behind each role."""

    table: dict[str, Any]
    weights: dict[str, np.ndarray]
    word_embeddings: np.ndarray
    provenance: dict[str, list[str]] = field(default_factory=dict)
    op_types: dict[str, int] = field(default_factory=dict)
    # what each of the file's outputs is, in its order: "hidden" (the final
    # hidden states), "pooled" (the pooler's, CLIP's first-token norm's or the
    # MAP head's output) or "" (neither: not compared)
    output_roles: tuple[str, ...] = ()
    # a file no template matches, taken as any DAG of the IR's op kinds
    # (planner.ir.onnx_dag; then `table` is empty)
    dag: Dag | None = None


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
    "Unsqueeze", "Where", "And", "Neg", "ReduceMean", "Sqrt", "Reciprocal", "Split", "Tile",
    "Mod", "Sub"})


@functools.lru_cache(maxsize=4)
def _import(source: str, stamp: int) -> Imported:
    g = _Graph(load_onnx(source), source)
    try:
        try:
            return _recognise(g)
        except ConfigError as e:  # not a template: any DAG of the IR's ops?
            try:
                dag = dag_import(g, _name(source))
            except ConfigError as d:
                raise ConfigError(e.source, e.field, f"{e.message}; as a DAG of IR ops: "
                                                     f"{d.field}: {d.message}",
                                  e.value) from None
        return Imported({}, dag.weights, np.zeros((0, 0), np.float32), dag.provenance,
                        _op_types(g), dag=dag)
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
    embed_norm = False
    if conv is not None:  # a ViT tower: patches, class token, positions; pre-LN blocks
        h, start, fields = _patch_embeddings(g, conv, weights, take)
        table = np.zeros((0, 0), np.float32)
        pre = True
        e = _norm_of(g, h)
        if e is not None and e.kind == "layernorm" and _norm_of(g, e.out) is not None:
            # a norm of the embeddings that the first block's norm reads (CLIP's
            # pre-layernorm), not the first block's own
            weights["embed_ln.gamma"] = e.gamma
            if e.beta is not None:
                weights["embed_ln.beta"] = e.beta
            take("embed_ln", e.nodes)
            h, embed_norm = e.out, True
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
    pool = "none"
    first_norm = None  # CLIP: the final norm on the first token only
    if pre and final is None and conv is not None:
        for u in g.users(h):
            if u.op_type in ("Gather", "Slice"):
                first_norm = _norm_of(g, u.output[0])
                if first_norm is not None:
                    weights["ln_f.gamma"] = first_norm.gamma
                    if first_norm.beta is not None:
                        weights["ln_f.beta"] = first_norm.beta
                    take("ln_f", [u, *first_norm.nodes])
                    pool = "first_norm"
                    break
    if pre and first_norm is None:  # the final norm over every token
        if final is None:
            raise g.bad(g.producer[h], "expected the final norm of the tower")
        weights["ln_f.gamma"] = final.gamma
        if final.beta is not None:
            weights["ln_f.beta"] = final.beta
        take("ln_f", final.nodes)
        h = final.out
    head = map_head(g, h, hidden, heads) if pre and conv is not None \
        and first_norm is None else None
    pooled = first_norm.out if first_norm is not None else None
    if head is not None:  # SigLIP's attention-pooling head (planner.ir.onnx_head)
        if head.activation != activation or not math.isclose(head.eps, eps, rel_tol=1e-3):
            raise ConfigError(source, "onnx", f"the MAP head's GELU ({head.activation}) and "
                                              f"norm eps ({head.eps:g}) must be the tower's "
                                              f"({activation}, {eps:g})")
        weights.update(head.weights)
        for role, nodes in head.nodes.items():
            take(role, nodes)
        pool, pooled = "map", head.pooled
    users = g.users(h)
    gather = None if first_norm is not None or head is not None else \
        next((u for u in users if u.op_type in ("Gather", "Slice")), None)
    if gather is not None:
        lin = next((x for x in (_linear(g, u) for u in g.users(gather.output[0]))
                    if x is not None), None)
        tanh = g.users(lin[2])[0] if lin is not None and g.users(lin[2]) else None
        if lin is None or tanh is None or tanh.op_type != "Tanh":
            raise g.bad(gather, "expected the pooler: Gather of the first token, a linear, Tanh")
        weights["w_pool"], weights["b_pool"] = lin[0], _bias(lin)
        take("pooler", [gather, *lin[3], tanh])
        pool, pooled = "pooler", tanh.output[0]
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
    table_out: dict[str, Any] = {
        "name": _name(source), "hidden": int(hidden), "heads": int(heads), "mlp": int(mlp),
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
        if head is not None:
            table_out.update(MAP_TOWER)
        if embed_norm:
            table_out["embed_norm"] = True
        if first_norm is not None:
            table_out["final_norm"] = False
    else:
        table_out.update({"input": "embeddings", "block": "post_ln", "embed_norm": True,
                          "final_norm": False, "vocab": fields["vocab"]})
        if fields["max_positions"] and fields["max_positions"] != tokens:
            table_out["max_positions"] = fields["max_positions"]
        if fields["type_vocab"]:
            table_out["type_vocab"] = fields["type_vocab"]
    roles = tuple("hidden" if g.back(o, ())[0] == h else
                  "pooled" if pooled is not None and g.back(o, ())[0] == pooled else ""
                  for o in g.outputs)
    return Imported(table_out, {k: np.asarray(v, np.float32) for k, v in weights.items()},
                    np.asarray(table, np.float32), prov, _op_types(g), roles)


def _name(source: str) -> str:
    """The model's name: the file's stem, or its directory's for model.*.onnx."""
    name = Path(source).stem.split(".")[0]
    return Path(source).resolve().parent.name if name == "model" else name


def _op_types(g: _Graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return dict(sorted(counts.items()))


def _token_embeddings(g: _Graph, weights: dict[str, np.ndarray], take: Any
                      ) -> tuple[str, str, dict[str, Any], np.ndarray]:
    """A text encoder's embeddings: (hidden state after the embedding norm,
    the first value of the hidden path, fields, the host's word table)."""
    source = g.source
    ids = "input_ids" if "input_ids" in g.inputs else None
    word = next((n for n in g.nodes if n.op_type == "Gather" and g.value(n.input[0]) is not None
                 and n.input[1] in g.inputs), None)
    if ids is None or word is None:
        raise ConfigError(source, "onnx", "no model template: neither a token embedding "
                                          "(Gather of an initializer by input_ids) nor a "
                                          "patch Conv on an input")
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
        norm = _norm_of(g, h)  # the embedding LayerNorm (a node, or decomposed)
        if norm is not None and norm.kind == "layernorm":
            break
        users = g.users(h)
        if len(users) != 1:
            raise g.bad(g.producer[h], "expected one consumer on the embedding path")
        n = users[0]
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
            else:  # the rows the sequence reads (positions 0.. unless constant)
                idx = g.value(src.input[1])
                rows_read = idx.reshape(-1) if idx is not None else np.arange(tokens)
                weights["pos_embed"] = tab[rows_read]
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
    assert norm.beta is not None
    weights["embed_ln.gamma"], weights["embed_ln.beta"] = norm.gamma, norm.beta
    take("embed_ln", norm.nodes)
    fields = {"hidden": int(hidden), "tokens": int(tokens), "eps": norm.eps,
              "vocab": int(vocab), "type_vocab": int(type_vocab),
              "max_positions": int(max_positions)}
    return norm.out, word.output[0], fields, table


def _patch_embeddings(g: _Graph, conv: Any, weights: dict[str, np.ndarray], take: Any
                      ) -> tuple[str, str, dict[str, Any]]:
    """A ViT tower's embeddings: the patch Conv (kernel = stride, no padding)
    flattened to tokens, the class token (DeiT: and the distillation token)
    concatenated in front, positions added.  Our patch input carries each
    such token as one more (zero) row, so its embedding is b_patch + pos[i]:
    pos[i] becomes token + pos[i] - b_patch, the same sum."""
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    w = g.value(conv.input[1])
    if w is None or w.ndim != 4 or w.shape[2] != w.shape[3]:
        raise g.bad(conv, "expected a square patch kernel initializer [H, C, p, p]")
    hidden, channels, p = int(w.shape[0]), int(w.shape[1]), int(w.shape[2])
    if attrs.get("strides", [1, 1]) != [p, p] or any(attrs.get("pads", [0])) or \
            attrs.get("group", [1]) not in ([1], []):
        raise g.bad(conv, f"expected a patch embedding: stride = kernel ({p}), no padding")
    b = g.value(conv.input[2]) if len(conv.input) > 2 else None
    b = b if b is not None else np.zeros(hidden, np.float32)  # none (CLIP), or zero folded
    x, flat = conv.output[0], []
    while True:  # Reshape / Transpose to [B, N, H] (a Shape of it only sizes the view)
        users = [u for u in g.users(x) if u.op_type != "Shape"]
        if len(users) != 1 or users[0].op_type not in VIEW:
            break
        flat.append(users[0])
        x = users[0].output[0]
    nxt = next((u for u in g.users(x) if u.op_type != "Shape"), None)
    prefix: list[np.ndarray] = []  # the tokens in front: class (and DeiT's distillation)
    cls_nodes, cat = [], None
    if nxt is not None and nxt.op_type == "Concat":  # the class token in front (ViT)
        cat = nxt
        if g.back(cat.input[-1], ())[0] != x:
            raise g.bad(cat, "expected the patch tokens last, after the class token(s)")
        for other in cat.input[:-1]:
            # a constant (folded: `_Graph.value` expands it over a constant batch),
            # or Expand(token, the batch's shape)
            ex = g.producer.get(other)
            tok = g.value(other)
            if ex is not None and ex.op_type == "Expand":
                cls_nodes.append(ex)
                tok = tok if tok is not None else g.value(ex.input[0])
            rows = tok.reshape(-1, hidden) if tok is not None and tok.size % hidden == 0 \
                else None
            if rows is None or not (rows == rows[0]).all():
                raise g.bad(cat, "expected constant class (and distillation) tokens "
                                 f"of {hidden} values, one for every image")
            prefix.append(rows[0])
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
    for i, tok in enumerate(prefix):
        pos[i] += tok.reshape(hidden) - b
    weights["w_patch"] = w.reshape(hidden, -1).T
    weights["b_patch"] = b
    weights["pos_embed"] = pos
    take("patch_embedding", [conv, *flat])
    if cat is not None:
        take("class_token", [cat, *[n for n in cls_nodes if n is not None]])
    take("position_embeddings", [add, *pos_nodes])
    return add.output[0], conv.output[0], {"hidden": hidden, "tokens": int(pos.shape[0]),
                                           "patch": p, "channels": channels}
