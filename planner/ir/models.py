"""ViT encoders (pre-LN) as graphs, from TOML configs in `planner/ir/zoo/`.

A model TOML has the flat fields of `ModelConfig` (all required except
`batch`, default 1, and the choices `pool` = "none" | "map" (default none),
`qk_dtype` / `pv_dtype` = "fp16" | "fp8", the operand dtype of the two
attention products, default fp16).  The graph (`build_vit`):

    patches [B·T, C·p·p] fp16 (input; pre-extracted patches, a class token is
        just one more patch row)
    Cast fp8 → MatMul(w_patch fp8, b_patch) → fp16 → Add pos_embed [T, H]
        (row-periodic over the batch)
    Repeat × L over the encoder layer (body below; per-layer weights are
        iterated parameters `layers.<name>` with a leading [L] dim)
    LayerNorm(ln_f) → out [B·T, H] fp16 (output); with pool = "map" that is
        `encoded` and the MAP head (big_vision's MAPHead) follows:
    Broadcast(head_probe [1, H]) → [B, H] → Cast fp8 → q = MatMul (one query
        row per image); k, v = MatMul(Cast fp8 encoded) → the attention below
        with T_q = 1 → o MatMul → `head_x` [B, H] → head_ln → Cast fp8 → fc1 →
        Gelu → Cast fp8 → fc2 → Add head_x → out [B, H] fp16 (output;
        big_vision's `x[:, 0]`)

Body (argument `x`, yield `y`, all [B·T, H] fp16):
    ln1 → Cast fp8 → q,k,v = MatMul(+bias) fp16 → SplitHeads → BatchMatMul(q, kᵀ)
    → Softmax(1/sqrt(dh)) → BatchMatMul(p, v) → MergeHeads → Cast fp8 → o MatMul
    (qk_dtype fp8: q and k are cast to fp8 before SplitHeads; pv_dtype fp8: v
    likewise and the probabilities before the PV product)
    (+bias) → Add x → ln2 → Cast fp8 → fc1(+bias) → Gelu → Cast fp8 → fc2(+bias)
    → Add → y

Weights are fp8 with a power-of-two scale (`WEIGHT_SCALE_EXP`, chosen for
weights of std `WEIGHT_STD`, see planner/reference.py); biases, LayerNorm
parameters and the position embedding are fp16.  Activation casts to fp8 use
the fixed exponents in `CAST_SCALE_EXP`, chosen so the casts of a forward pass
at the reference initialization neither saturate nor underflow
(tests/test_reference.py checks it).

`precision="fp32"` builds the same graph with every tensor fp32 (casts become
fp32→fp32): the reference-only variant the float64 cross-check uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.ir.graph import Graph, Op, Repeat, Tensor, make_graph
from planner.ir.ops.add import Add
from planner.ir.ops.batch_matmul import BatchMatMul
from planner.ir.ops.broadcast import Broadcast
from planner.ir.ops.cast import Cast
from planner.ir.ops.gelu import Gelu
from planner.ir.ops.heads import MergeHeads, SplitHeads
from planner.ir.ops.layernorm import LayerNorm
from planner.ir.ops.matmul import MatMul
from planner.ir.ops.softmax import Softmax
from tilecommon.config import Limits, check_fields, read_toml
from tilecommon.errors import ConfigError

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
PRECISIONS = ("fp8", "fp32")

WEIGHT_STD = 0.02
WEIGHT_SCALE_EXP = -8  # weight codes have std 0.02·2**8 ≈ 5 (fp8 e4m3 max 448)
CAST_SCALE_EXP = {"patches": -4, "ln": -2, "attn": -6, "gelu": -2,
                  # attention operands in fp8 (qk_dtype / pv_dtype): q, k, v
                  # have std ~0.7, probabilities lie in [0, 1]; the probe N(0, 0.02)
                  "qkv": -4, "probs": -8, "probe": -8}
POOLS = ("none", "map")
ATTENTION_DTYPES = ("fp16", "fp8")
# choice field -> (allowed values, default)
_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "pool": (POOLS, "none"), "qk_dtype": (ATTENTION_DTYPES, "fp16"),
    "pv_dtype": (ATTENTION_DTYPES, "fp16"),
}


@dataclass(frozen=True)
class ModelConfig:
    """A ViT encoder: hidden size, heads, MLP size, patch side (pixels), input
    channels, tokens per image, layers, images per batch, LayerNorm eps; the
    pooling head and the attention products' operand dtypes."""

    name: str
    hidden: int
    heads: int
    mlp: int
    patch: int
    channels: int
    tokens: int
    layers: int
    batch: int
    eps: float
    pool: str = "none"
    qk_dtype: str = "fp16"
    pv_dtype: str = "fp16"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# field -> (type, minimum, maximum)
_LIMITS: Limits = {
    "hidden": (int, 1, 1 << 16),
    "heads": (int, 1, 1 << 10),
    "mlp": (int, 1, 1 << 18),
    "patch": (int, 1, 1 << 10),
    "channels": (int, 1, 64),
    "tokens": (int, 1, 1 << 16),
    "layers": (int, 1, 1 << 10),
    "batch": (int, 1, 1 << 12),
    "eps": (float, 1e-12, 0.1),
}
_DEFAULTS: dict[str, Any] = {"batch": 1}


def parse_config(data: dict[str, Any], source: str) -> ModelConfig:
    """Validate a model table; ConfigError names `source` and the field."""
    if not isinstance(data, dict):
        raise ConfigError(source, "model", "must be a table", type(data).__name__)
    data = dict(data)
    choices = {}
    for field, (allowed, default) in _CHOICES.items():
        value = data.pop(field, default)
        if value not in allowed:
            raise ConfigError(source, field, f"must be one of {list(allowed)}", value)
        choices[field] = value
    values = check_fields(data, source, _LIMITS, _DEFAULTS)
    values.update(choices)
    if values["hidden"] % values["heads"]:
        raise ConfigError(
            source, "heads", f"must divide hidden ({values['hidden']})", values["heads"]
        )
    return ModelConfig(**values)


def zoo_names() -> list[str]:
    """Names of the shipped models, sorted."""
    return sorted(p.stem for p in ZOO_DIR.glob("*.toml"))


def zoo_path(name: str) -> Path:
    """The TOML file of the zoo model `name` (ConfigError naming the zoo)."""
    path = ZOO_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(name, "model", f"no such zoo model; zoo: {zoo_names()}")
    return path


def load_config(name_or_path: str | Path) -> ModelConfig:
    """Read a zoo model by name or a user TOML by path (ConfigError if bad)."""
    data, source = read_toml(name_or_path, ZOO_DIR, "model", "zoo model", "zoo")
    return parse_config(data, source)


def load_model(
    name_or_path: str | Path,
    layers: int | None = None,
    batch: int | None = None,
    precision: str = "fp8",
) -> Graph:
    """The graph of a zoo model (by name) or a user TOML (by path).

    `layers`/`batch` override the config; `precision` is "fp8" (the deployable
    graph) or "fp32" (reference-only: every tensor fp32).  Raises ConfigError.
    """
    cfg = load_config(name_or_path)
    source = str(name_or_path)
    for field, value in (("layers", layers), ("batch", batch)):
        if value is None:
            continue
        lo, hi = _LIMITS[field][1:]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(
                source, field, f"override must be an integer in [{int(lo)}, {int(hi)}]", value
            )
    if precision not in PRECISIONS:
        raise ConfigError(source, "precision", f"must be one of {PRECISIONS}", precision)
    cfg = ModelConfig(**{
        **cfg.__dict__,
        "layers": cfg.layers if layers is None else layers,
        "batch": cfg.batch if batch is None else batch,
    })
    return build_vit(cfg, precision)


class _Builder:
    """Collects tensors and ops of one graph in order."""

    def __init__(self, precision: str) -> None:
        self.fp32 = precision == "fp32"
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def t(self, name: str, shape: tuple[int, ...], dtype: str, kind: str = "activation",
          scale_exp: int = 0) -> str:
        if self.fp32:
            dtype, scale_exp = "fp32", 0
        self.tensors.append(Tensor(name, shape, dtype, kind, scale_exp))
        return name

    def op(self, op: Op) -> None:
        self.ops.append(op)

    def cast8(self, x: str, shape: tuple[int, ...], scale_exp: int) -> str:
        out = self.t(f"{x}_fp8", shape, "fp8", scale_exp=scale_exp)
        self.op(Cast(f"cast_{x}", x, out))
        return out

    def cast_if(self, x: str, shape: tuple[int, ...], dtype: str, scale: str) -> str:
        """`x` itself for fp16, else its fp8 cast at CAST_SCALE_EXP[scale]."""
        return x if dtype == "fp16" else self.cast8(x, shape, CAST_SCALE_EXP[scale])

    def attention(self, cfg: ModelConfig, pre: str, q_in8: str, kv_in8: str, tq: int,
                  tkv: int) -> tuple[str, list[str]]:
        """Multi-head attention of queries from `q_in8` [B·tq, H] against
        keys/values from `kv_in8` [B·tkv, H] (both fp8), through the output
        projection; returns (out [B·tq, H] fp16, parameter names).  `pre`
        prefixes every name (the encoder layer's are unprefixed)."""
        h, heads, dh, b = cfg.hidden, cfg.heads, cfg.head_dim, cfg.batch
        bh = b * heads
        params: list[str] = []
        split = {}
        for name, src, t in (("q", q_in8, tq), ("k", kv_in8, tkv), ("v", kv_in8, tkv)):
            y, p = self.linear(pre + name, src, h, h, b * t)
            params += p
            dt = cfg.pv_dtype if name == "v" else cfg.qk_dtype
            y = self.cast_if(y, (b * t, h), dt, "qkv")
            split[name] = self.t(f"{pre}{name}_heads", (bh, t, dh), dt, scale_exp=(
                CAST_SCALE_EXP["qkv"] if dt == "fp8" else 0))
            self.op(SplitHeads(f"split_{pre}{name}", y, split[name], heads))
        s = self.t(f"{pre}scores", (bh, tq, tkv), "fp16")
        self.op(BatchMatMul(f"bmm_{pre}qk", split["q"], split["k"], s, transpose_b=True))
        pr = self.t(f"{pre}probs", (bh, tq, tkv), "fp16")
        self.op(Softmax(f"{pre}softmax", s, pr, 1.0 / math.sqrt(dh)))
        pr = self.cast_if(pr, (bh, tq, tkv), cfg.pv_dtype, "probs")
        ctx = self.t(f"{pre}ctx_heads", (bh, tq, dh), "fp16")
        self.op(BatchMatMul(f"bmm_{pre}pv", pr, split["v"], ctx))
        attn = self.t(f"{pre}attn", (b * tq, h), "fp16")
        self.op(MergeHeads(f"{pre}merge", ctx, attn, heads))
        attn8 = self.cast8(attn, (b * tq, h), CAST_SCALE_EXP["attn"])
        o, p = self.linear(pre + "o", attn8, h, h, b * tq)
        return o, params + p

    def mlp(self, cfg: ModelConfig, pre: str, x8: str, rows: int) -> tuple[str, list[str]]:
        """fc1 → Gelu → Cast fp8 → fc2 of fp8 `x8` [rows, H]; (out, parameters)."""
        f1, p1 = self.linear(pre + "fc1", x8, cfg.hidden, cfg.mlp, rows)
        act = self.t(f"{pre}gelu", (rows, cfg.mlp), "fp16")
        self.op(Gelu(f"{pre}gelu", f1, act))
        act8 = self.cast8(act, (rows, cfg.mlp), CAST_SCALE_EXP["gelu"])
        f2, p2 = self.linear(pre + "fc2", act8, cfg.mlp, cfg.hidden, rows)
        return f2, p1 + p2

    def map_head(self, cfg: ModelConfig, enc: str) -> str:
        """big_vision's MAPHead over `enc` [B·T, H] (module docstring) -> out."""
        h, b = cfg.hidden, cfg.batch
        probe = self.t("head_probe", (1, h), "fp16", "parameter")
        probes = self.t("head_probes", (b, h), "fp16")
        self.op(Broadcast("broadcast_probe", probe, probes))
        q8 = self.cast8(probes, (b, h), CAST_SCALE_EXP["probe"])
        kv8 = self.cast8(enc, (b * cfg.tokens, h), CAST_SCALE_EXP["ln"])
        x, _ = self.attention(cfg, "head_", q8, kv8, 1, cfg.tokens)
        ln, _ = self.layernorm("head_ln", x, b, h, cfg.eps)
        f2, _ = self.mlp(cfg, "head_", self.cast8(ln, (b, h), CAST_SCALE_EXP["ln"]), b)
        out = self.t("out", (b, h), "fp16", "output")
        self.op(Add("head_add", x, f2, out))
        return out

    def linear(self, name: str, x8: str, k: int, n: int, rows: int, kind: str = "activation",
               out: str | None = None) -> tuple[str, list[str]]:
        """MatMul x8 @ w_<name> + b_<name>; returns (out, [weight, bias])."""
        w = self.t(f"w_{name}", (k, n), "fp8", "parameter", WEIGHT_SCALE_EXP)
        b = self.t(f"b_{name}", (n,), "fp16", "parameter")
        y = self.t(out or name, (rows, n), "fp16", kind)
        self.op(MatMul(f"mm_{name}", x8, w, y, bias=b))
        return y, [w, b]

    def layernorm(self, name: str, x: str, rows: int, n: int, eps: float,
                  kind: str = "activation", out: str | None = None) -> tuple[str, list[str]]:
        gamma = self.t(f"{name}.gamma", (n,), "fp16", "parameter")
        beta = self.t(f"{name}.beta", (n,), "fp16", "parameter")
        y = self.t(out or name, (rows, n), "fp16", kind)
        self.op(LayerNorm(name, x, gamma, beta, y, eps))
        return y, [gamma, beta]


def _encoder_layer(cfg: ModelConfig, precision: str) -> tuple[Graph, list[str]]:
    """The Repeat body and its parameter names (in binding order)."""
    rows, h = cfg.batch * cfg.tokens, cfg.hidden
    g = _Builder(precision)
    params: list[str] = []
    x = g.t("x", (rows, h), "fp16", "input")
    ln1, p = g.layernorm("ln1", x, rows, h, cfg.eps)
    params += p
    ln1_8 = g.cast8(ln1, (rows, h), CAST_SCALE_EXP["ln"])
    o, p = g.attention(cfg, "", ln1_8, ln1_8, cfg.tokens, cfg.tokens)
    params += p
    x1 = g.t("x1", (rows, h), "fp16")
    g.op(Add("add_attn", x, o, x1))
    ln2, p = g.layernorm("ln2", x1, rows, h, cfg.eps)
    params += p
    ln2_8 = g.cast8(ln2, (rows, h), CAST_SCALE_EXP["ln"])
    f2, p = g.mlp(cfg, "", ln2_8, rows)
    params += p
    y = g.t("y", (rows, h), "fp16", "output")
    g.op(Add("add_mlp", x1, f2, y))
    body = make_graph(f"{cfg.name}.layer", g.tensors, g.ops, [x], [y])
    return body, params


def build_vit(cfg: ModelConfig, precision: str = "fp8") -> Graph:
    """The whole encoder graph for `cfg` (module docstring); verified."""
    rows, h = cfg.batch * cfg.tokens, cfg.hidden
    k_patch = cfg.channels * cfg.patch * cfg.patch
    body, body_params = _encoder_layer(cfg, precision)
    g = _Builder(precision)
    patches = g.t("patches", (rows, k_patch), "fp16", "input")
    p8 = g.cast8(patches, (rows, k_patch), CAST_SCALE_EXP["patches"])
    emb, _ = g.linear("patch", p8, k_patch, h, rows, out="embed")
    pos = g.t("pos_embed", (cfg.tokens, h), "fp16", "parameter")
    x0 = g.t("x0", (rows, h), "fp16")
    g.op(Add("add_pos", emb, pos, x0))
    iterated = []
    for bp in body_params:
        inner = body.tensor(bp)
        outer = f"layers.{bp}"
        g.tensors.append(Tensor(outer, (cfg.layers, *inner.shape), inner.dtype, "parameter",
                                inner.scale_exp))
        iterated.append((outer, bp))
    xl = g.t("xL", (rows, h), "fp16")
    g.op(Repeat("encoder", body, cfg.layers, init=(x0,), final=(xl,), arguments=("x",),
                yields=("y",), iterated=tuple(iterated)))
    if cfg.pool == "map":
        enc, _ = g.layernorm("ln_f", xl, rows, h, cfg.eps, out="encoded")
        out = g.map_head(cfg, enc)
    else:
        out, _ = g.layernorm("ln_f", xl, rows, h, cfg.eps, kind="output", out="out")
    attrs = (
        ("model", cfg.name), ("hidden", h), ("heads", cfg.heads), ("mlp", cfg.mlp),
        ("tokens", cfg.tokens), ("batch", cfg.batch), ("layers", cfg.layers),
        ("patch", cfg.patch), ("channels", cfg.channels), ("eps", cfg.eps),
        ("precision", precision),
    ) + tuple((f, getattr(cfg, f)) for f, (_, default) in _CHOICES.items()
              if getattr(cfg, f) != default)  # absent when default: unchanged hashes
    return make_graph(cfg.name, g.tensors, g.ops, [patches], [out], attrs)
