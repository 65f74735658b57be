"""The MAP head's ONNX pattern (planner.ir.onnx_import): SigLIP's
multihead-attention pooling (transformers' `SiglipMultiheadAttentionPoolingHead`,
big_vision's MAPHead) as PyTorch's exporters write `nn.MultiheadAttention`.

After the tower's final norm `h` [B, T, H]:

- a learned probe [1, 1, H] (Expand / Tile over the batch, or folded to a
  constant) goes through the q projection; `h` goes through the packed k/v
  projection (the in-projection's last 2H rows: one MatMul by [H, 2H], its
  output split by Reshape / Unsqueeze / Transpose / Squeeze and a Gather of
  0 for k, 1 for v) or through separate k and v linears.  The q, k and v
  weights are the rows of `in_proj_weight` (the dynamo exporter Splits it,
  the TorchScript one folds the pieces into constants: `_Graph.value`
  folds either);
- scaled scores (q times 1/sqrt(head size)), Softmax, the product with v,
  the head merge and `out_proj` (a Gemm) give the attended probe `a`;
- `a` + MLP(LayerNorm(a)), with the tower's GELU; the pooled output is its
  first (only) token, a Gather of 0 on the token axis.

`map_head(g, h, ...)` returns the weights under our names (`head_probe`,
`w_head_q` ... `b_head_fc2`, `head_ln.*`: planner.ir.weights), the pooled
value's name and the nodes it covered, or None when no attention reads `h`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.ir.onnx_graph import VIEW, _Graph, _linear
from planner.ir.onnx_layers import _activation, _bias, _norm_of, _residual, _scaling


@dataclass
class MapHead:
    """A recognised MAP head: our-named weights, the pooled value, the
    nodes by role (for `tileplan inspect`), the GELU form and the norm's eps."""

    weights: dict[str, np.ndarray]
    pooled: str
    nodes: dict[str, list[Any]]
    activation: str
    eps: float


def _forward(g: _Graph, name: str, through: tuple[str, ...]) -> tuple[str, list[Any]]:
    """Follow `name` forward through single consumers of the kinds `through`."""
    passed: list[Any] = []
    while True:
        users = g.users(name)
        if len(users) != 1 or users[0].op_type not in through:
            return name, passed
        passed.append(users[0])
        name = users[0].output[0]


def _softmax_after(g: _Graph, h: str, limit: int = 64) -> Any:
    """The first Softmax reached from `h` through at most `limit` nodes."""
    seen: set[int] = set()
    todo = [h]
    while todo and len(seen) < limit:
        for n in g.users(todo.pop(0)):
            if id(n) in seen:
                continue
            if n.op_type == "Softmax":
                return n
            seen.add(id(n))
            todo.extend(n.output)
    return None


def _linear_into(g: _Graph, value: str) -> tuple[np.ndarray, np.ndarray | None, str,
                                                  list[Any]] | None:
    """The linear whose output is `value` (its MatMul or Gemm is found from
    the bias Add, or is the producer itself)."""
    n = g.producer.get(value)
    if n is None:
        return None
    cands = [n] if n.op_type in ("MatMul", "Gemm") else \
        [p for i in n.input if (p := g.producer.get(i)) is not None
         and p.op_type in ("MatMul", "Gemm")]
    for c in cands:
        lin = _linear(g, c)
        if lin is not None and lin[2] == value:
            return lin
    return None


def _select(g: _Graph, nodes: list[Any]) -> int | None:
    """The index a Gather among `nodes` selects (k: 0, v: 1 of a packed k/v)."""
    for n in nodes:
        if n.op_type == "Gather":
            idx = g.value(n.input[1])
            if idx is not None and idx.size == 1:
                return int(idx.reshape(-1)[0])
    return None


def _is_zero(idx: np.ndarray | None) -> bool:
    return idx is not None and idx.size == 1 and int(idx.reshape(-1)[0]) == 0


def map_head(g: _Graph, h: str, hidden: int, heads: int) -> MapHead | None:
    """The MAP head reading the final hidden states `h` (module docstring)."""
    soft = _softmax_after(g, h)
    if soft is None:
        return None
    score = g.producer.get(g.back(soft.input[0], ())[0])
    if score is None or score.op_type != "MatMul":
        raise g.bad(soft, "expected the MAP head's scores (a MatMul) before the Softmax")
    pv = next((u for u in g.users(soft.output[0]) if u.op_type == "MatMul"), None)
    if pv is None:
        raise g.bad(soft, "expected the MAP head's product with v after the Softmax")
    q_val, q_nodes = g.back(score.input[0], VIEW + ("Mul", "Div"))
    k_val, k_nodes = g.back(score.input[1], VIEW + ("Gather", "Mul", "Div"))
    v_val, v_nodes = g.back(pv.input[1], VIEW + ("Gather",))
    q = _linear_into(g, q_val)
    if q is None or g.value(q[3][0].input[0]) is None:
        raise g.bad(score, "expected the MAP head's q: a linear of the constant probe")
    probe = np.asarray(g.value(q[3][0].input[0]), np.float32).reshape(-1, hidden)
    if not np.array_equal(probe, np.broadcast_to(probe[:1], probe.shape)):
        raise g.bad(q[3][0], "expected one probe for every image")
    k, v = _linear_into(g, k_val), _linear_into(g, v_val)
    if k is None or v is None:
        raise g.bad(score, "expected the MAP head's k and v: linears of the hidden states")
    w: dict[str, np.ndarray] = {"head_probe": probe[:1]}
    w["w_head_q"], w["b_head_q"] = q[0], _bias(q)
    if k is v or k[2] == v[2]:  # one packed k/v linear [H, 2H], split by a Gather
        sk, sv = _select(g, k_nodes), _select(g, v_nodes)
        if k[0].shape != (hidden, 2 * hidden) or sk is None or sv is None \
                or {sk, sv} != {0, 1}:
            raise g.bad(k[3][0], f"expected the packed k/v projection [{hidden}, "
                                 f"{2 * hidden}] split in k (0) and v (1)")
        kv_w, kv_b = k[0], _bias(k)
        for name, part in (("k", sk), ("v", sv)):
            cols = slice(part * hidden, (part + 1) * hidden)
            w[f"w_head_{name}"], w[f"b_head_{name}"] = kv_w[:, cols], kv_b[cols]
    else:
        w["w_head_k"], w["b_head_k"] = k[0], _bias(k)
        w["w_head_v"], w["b_head_v"] = v[0], _bias(v)
    for lin in (k, v):
        src, _ = g.back(lin[3][0].input[0], VIEW)
        if src != h:
            raise g.bad(lin[3][0], "expected the MAP head's k / v to read the final norm")
    dh = hidden // heads
    scale = _scaling(g, q_nodes + k_nodes)
    if not math.isclose(scale, 1.0 / math.sqrt(dh), rel_tol=1e-3):
        raise g.bad(score, f"MAP head attention scale {scale:.6g}, expected 1/sqrt({dh})")
    merged, merge = _forward(g, pv.output[0], VIEW)
    o = next((x for u in g.users(merged) if (x := _linear(g, u)) is not None), None)
    if o is None:
        raise g.bad(pv, "expected the MAP head's out_proj after the head merge")
    w["w_head_o"], w["b_head_o"] = o[0], _bias(o)
    a, views = _forward(g, o[2], VIEW)
    ln = _norm_of(g, a)
    if ln is None or ln.kind != "layernorm":
        raise g.bad(g.producer[a], "expected the MAP head's LayerNorm after out_proj")
    w["head_ln.gamma"] = ln.gamma
    if ln.beta is not None:
        w["head_ln.beta"] = ln.beta
    fc1 = next((y for u in g.users(ln.out) if (y := _linear(g, u)) is not None), None)
    if fc1 is None:
        raise g.bad(ln.nodes[-1], "expected the MAP head's fc1 after its LayerNorm")
    act_nodes, form, fc2_node = _activation(g, fc1[2])
    fc2 = _linear(g, fc2_node)
    assert fc2 is not None
    w["w_head_fc1"], w["b_head_fc1"] = fc1[0], _bias(fc1)
    w["w_head_fc2"], w["b_head_fc2"] = fc2[0], _bias(fc2)
    add = _residual(g, fc2[2], a)
    first = next((u for u in g.users(add.output[0]) if u.op_type in ("Gather", "Slice")), None)
    if first is None or first.op_type == "Gather" and not _is_zero(g.value(first.input[1])):
        raise g.bad(add, "expected the MAP head's pooled token (a Gather of token 0)")
    nodes = {"head attention": [*q[3], *q_nodes, *k[3], *k_nodes, *v[3], *v_nodes, score,
                                soft, pv, *merge, *o[3], *views],
             "head mlp": [*ln.nodes, *fc1[3], *act_nodes, *fc2[3], add, first]}
    for lin in (k, v):
        nodes["head attention"] += g.back(lin[3][0].input[0], VIEW)[1]
    return MapHead(w, first.output[0], nodes, form, ln.eps)
