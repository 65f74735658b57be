"""ViT encoders (pre-LN) as graphs, from TOML configs in `planner/ir/zoo/`.

A model TOML has the flat fields of `ModelConfig` (all required except
`batch`, default 1).  The graph (`build_vit`):

    patches [B·T, C·p·p] fp16 (input; pre-extracted patches, a class token is
        just one more patch row)
    Cast fp8 → MatMul(w_patch fp8, b_patch) → fp16 → Add pos_embed [T, H]
        (row-periodic over the batch)
    Repeat × L over the encoder layer (body below; per-layer weights are
        iterated parameters `layers.<name>` with a leading [L] dim)
    LayerNorm(ln_f) → out [B·T, H] fp16 (output)

Body (argument `x`, yield `y`, all [B·T, H] fp16):
    ln1 → Cast fp8 → q,k,v = MatMul(+bias) fp16 → SplitHeads → BatchMatMul(q, kᵀ)
    → Softmax(1/sqrt(dh)) → BatchMatMul(p, v) → MergeHeads → Cast fp8 → o MatMul
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

from kernels.exceptions import ConfigError
from planner.ir.graph import (
    Add,
    BatchMatMul,
    Cast,
    Gelu,
    Graph,
    LayerNorm,
    MatMul,
    MergeHeads,
    Op,
    Repeat,
    Softmax,
    SplitHeads,
    Tensor,
    make_graph,
)
from simulator.config import Limits, check_fields, read_toml

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
PRECISIONS = ("fp8", "fp32")

WEIGHT_STD = 0.02
WEIGHT_SCALE_EXP = -8  # weight codes have std 0.02·2**8 ≈ 5 (fp8 e4m3 max 448)
CAST_SCALE_EXP = {"patches": -4, "ln": -2, "attn": -6, "gelu": -2}


@dataclass(frozen=True)
class ModelConfig:
    """A ViT encoder: hidden size, heads, MLP size, patch side (pixels), input
    channels, tokens per image, layers, images per batch, LayerNorm eps."""

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
    values = check_fields(data, source, _LIMITS, _DEFAULTS)
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
    rows, h, heads, dh = cfg.batch * cfg.tokens, cfg.hidden, cfg.heads, cfg.head_dim
    bh = cfg.batch * heads
    g = _Builder(precision)
    params: list[str] = []
    x = g.t("x", (rows, h), "fp16", "input")
    ln1, p = g.layernorm("ln1", x, rows, h, cfg.eps)
    params += p
    ln1_8 = g.cast8(ln1, (rows, h), CAST_SCALE_EXP["ln"])
    split = {}
    for name in ("q", "k", "v"):
        y, p = g.linear(name, ln1_8, h, h, rows)
        params += p
        split[name] = g.t(f"{name}_heads", (bh, cfg.tokens, dh), "fp16")
        g.op(SplitHeads(f"split_{name}", y, split[name], heads))
    s = g.t("scores", (bh, cfg.tokens, cfg.tokens), "fp16")
    g.op(BatchMatMul("bmm_qk", split["q"], split["k"], s, transpose_b=True))
    pr = g.t("probs", (bh, cfg.tokens, cfg.tokens), "fp16")
    g.op(Softmax("softmax", s, pr, 1.0 / math.sqrt(dh)))
    ctx = g.t("ctx_heads", (bh, cfg.tokens, dh), "fp16")
    g.op(BatchMatMul("bmm_pv", pr, split["v"], ctx))
    attn = g.t("attn", (rows, h), "fp16")
    g.op(MergeHeads("merge", ctx, attn, heads))
    attn8 = g.cast8(attn, (rows, h), CAST_SCALE_EXP["attn"])
    o, p = g.linear("o", attn8, h, h, rows)
    params += p
    x1 = g.t("x1", (rows, h), "fp16")
    g.op(Add("add_attn", x, o, x1))
    ln2, p = g.layernorm("ln2", x1, rows, h, cfg.eps)
    params += p
    ln2_8 = g.cast8(ln2, (rows, h), CAST_SCALE_EXP["ln"])
    f1, p = g.linear("fc1", ln2_8, h, cfg.mlp, rows)
    params += p
    act = g.t("gelu", (rows, cfg.mlp), "fp16")
    g.op(Gelu("gelu", f1, act))
    act8 = g.cast8(act, (rows, cfg.mlp), CAST_SCALE_EXP["gelu"])
    f2, p = g.linear("fc2", act8, cfg.mlp, h, rows)
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
    out, _ = g.layernorm("ln_f", xl, rows, h, cfg.eps, kind="output", out="out")
    attrs = (
        ("model", cfg.name), ("hidden", h), ("heads", cfg.heads), ("mlp", cfg.mlp),
        ("tokens", cfg.tokens), ("batch", cfg.batch), ("layers", cfg.layers),
        ("patch", cfg.patch), ("channels", cfg.channels), ("eps", cfg.eps),
        ("precision", precision),
    )
    return make_graph(cfg.name, g.tensors, g.ops, [patches], [out], attrs)
