"""The per-layer patterns of the ONNX importer (planner.ir.onnx_import):
norms (LayerNormalization, its decomposition below opset 17, or RMSNorm's
decomposition), attention (q, k, v
told apart by the products they feed, RoPE's rotate-half, grouped-query
repeats, scaling, masks, the NaN guard), residuals, the MLP (GELU forms or
SwiGLU) and `_layer`, one encoder or decoder layer recognised whole."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.ir.onnx_graph import VIEW, _Graph, _linear


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
        norm = _norm_at(g, x, n)
        if norm is not None:
            return norm
    return None


def _norm_at(g: _Graph, x: str, n: Any) -> _Norm | None:
    """The norm of `x` that node `n` starts: a LayerNormalization, its
    decomposition (from the first ReduceMean) or RMSNorm's (from the Pow);
    else None."""
    if n.op_type == "LayerNormalization":
        scale, shift = _ln(g, n)
        return _Norm("layernorm", [n], n.output[0], scale, shift, _eps(n))
    if n.op_type == "ReduceMean":
        return _decomposed_ln(g, x, n)
    if n.op_type != "Pow" or not _is_square(g, n):
        return None
    tail = _follow(g, n.output[0], ("ReduceMean", "Add", "Sqrt", ("Reciprocal", "Div")))
    if tail is None:
        return None
    chain, v = [n, *tail[0]], tail[1]
    eps_c = _const_operand(g, chain[2])
    times = [u for u in g.users(v) if u.op_type == "Mul"
             and g.back(next(i for i in u.input if i != v), ())[0] == g.back(x, ())[0]]
    if eps_c is None or len(times) != 1:
        return None
    gmul = g.users(times[0].output[0])
    gamma = _const_operand(g, gmul[0]) if len(gmul) == 1 and gmul[0].op_type == "Mul" else None
    if gamma is None:
        return None
    return _Norm("rmsnorm", [*chain, times[0], gmul[0]], gmul[0].output[0], gamma, None,
                 _sig6(float(eps_c.reshape(-1)[0])))


def _follow(g: _Graph, v: str, kinds: tuple[str | tuple[str, ...], ...]
            ) -> tuple[list[Any], str] | None:
    """From value `v`, one single consumer of each kind in turn (a tuple: any
    of them): the nodes and the last value, or None."""
    chain = []
    for kind in kinds:
        nxt = g.users(v)
        if len(nxt) != 1 or nxt[0].op_type not in (kind if isinstance(kind, tuple) else (kind,)):
            return None
        chain.append(nxt[0])
        v = nxt[0].output[0]
    return chain, v


def _is_square(g: _Graph, n: Any) -> bool:
    """`n` is a Pow by the constant 2."""
    two = g.value(n.input[1])
    return two is not None and float(two.reshape(-1)[0]) == 2.0


def _sig6(x: float) -> float:
    """An epsilon to the 6 significant digits it was written with (ONNX keeps
    it as float32: 1e-12 reads 9.99999996e-13)."""
    return float(f"{x:.6g}")


def _scaling(g: _Graph, nodes: list[Any]) -> float:
    """The product of the constants the Mul nodes among `nodes` multiply by,
    divided by those the Div nodes divide by (attention's 1/sqrt(d))."""
    s = 1.0
    for n in nodes:
        c = _const_operand(g, n)
        if n.op_type in ("Mul", "Div") and c is not None:
            s = s * float(c.reshape(-1)[0]) if n.op_type == "Mul" else s / float(c.reshape(-1)[0])
    return s


def _only(g: _Graph, value: str, op: str, reads: str | None = None) -> Any:
    """The single consumer of `value` of kind `op` (that also reads `reads`), or None."""
    hits = [u for u in g.users(value) if u.op_type == op
            and (reads is None or reads in [g.back(i, ())[0] for i in u.input])]
    return hits[0] if len(hits) == 1 else None


def _const_operand(g: _Graph, n: Any) -> np.ndarray | None:
    return next((c for i in n.input if (c := g.value(i)) is not None), None)


def _decomposed_ln(g: _Graph, x: str, mean: Any) -> _Norm | None:
    """LayerNorm as the TorchScript exporter writes it below opset 17:
    ReduceMean(x), Sub(x, mean), Pow(d, 2), ReduceMean, Add eps, Sqrt,
    Div(d, std), Mul gamma, Add beta (over the last axis), or None."""
    sub = _only(g, mean.output[0], "Sub", x)
    if sub is None or g.back(sub.input[0], ())[0] != g.back(x, ())[0]:
        return None
    d = sub.output[0]
    pow_, div = _only(g, d, "Pow"), _only(g, d, "Div")
    if pow_ is None or not _is_square(g, pow_) or div is None:
        return None
    tail = _follow(g, pow_.output[0], ("ReduceMean", "Add", "Sqrt"))
    if tail is None or div.input[1] != tail[1]:
        return None
    chain = [pow_, *tail[0]]
    eps_c = _const_operand(g, chain[2])
    mul = _only(g, div.output[0], "Mul")
    gamma = _const_operand(g, mul) if mul is not None else None
    add = _only(g, mul.output[0], "Add") if mul is not None else None
    beta = _const_operand(g, add) if add is not None else None
    if eps_c is None or gamma is None or beta is None or add is None:
        return None
    return _Norm("layernorm", [mean, sub, *chain, div, mul, add], add.output[0],
                 np.asarray(gamma).reshape(-1), np.asarray(beta).reshape(-1),
                 _sig6(float(eps_c.reshape(-1)[0])))


def _ln(g: _Graph, n: Any) -> tuple[np.ndarray, np.ndarray]:
    gamma = g.value(n.input[1])
    beta = g.value(n.input[2]) if len(n.input) > 2 else None
    if gamma is None:
        raise g.bad(n, "expected a LayerNormalization with constant scale")
    return gamma, beta if beta is not None else np.zeros_like(gamma)


def _eps(n: Any) -> float:
    """The epsilon attribute (float32 in ONNX: 1e-12 reads 9.99999996e-13),
    to the 6 significant digits it was written with."""
    return _sig6(next((a.f for a in n.attribute if a.name == 'epsilon'), 1e-5))


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
    scale = _scaling(g, q_nodes + k_nodes)
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
        if n.op_type in ("Mul", "Div") and _const_operand(g, n) is not None:
            scale *= _scaling(g, [n])
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
