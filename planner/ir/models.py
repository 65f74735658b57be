"""Transformer models as graphs, from TOML configs in `planner/ir/zoo/`.

A model TOML is a flat table: the sizes (`hidden`, `heads`, `mlp`, `tokens`,
`layers`, `batch` default 1, `eps`) and the choices below, each checked
(a typed ConfigError names the file and the field).  One builder makes the
three families the zoo holds — ViT towers (ViT, DeiT, CLIP, SigLIP, PE),
BERT-style encoders and decoder-only LLMs at prefill:

- `input` = "patches" (pre-extracted image patches [B·T, C·p·p], needs
  `patch` and `channels`, through a patch-embedding MatMul) | "embeddings"
  (token embeddings [B·T, H] gathered on the host from the token ids: the
  word-embedding table stays on the host);
- `block` = "pre_ln" (x + f(norm(x)): ViT, LLMs) | "post_ln" (norm(x + f(x)): BERT);
- `norm` = "layernorm" | "rmsnorm";
- `activation` = "gelu_tanh" | "gelu_erf" | "quick_gelu" (fc1 → act → fc2)
  | "swiglu" (gate, up → silu(gate)·up → down);
- `attention` = "bidirectional" | "causal";
- `kv_heads` (default `heads`): grouped-query attention, each k/v head
  shared by heads / kv_heads q heads;
- `rope_theta` (absent: none): rotary position embedding on q and k (tables
  [tokens, head_dim/2]) instead of a learned position embedding;
- `max_positions` (default `tokens`): a learned position table of this many
  rows whose first `tokens` rows are used (BERT): those rows are the device's
  `pos_embed`, the others stay on the host (counted in `host_parameters`);
- `type_vocab` (default 0): token-type embeddings, the type-0 row added to
  every token (single-segment inputs);
- `embed_norm` (false): a norm after the embeddings (BERT, CLIP's
  pre-layernorm); `final_norm` (true): a norm after the last layer;
- `bias` = "all" | "qkv" (Qwen: q, k, v only) | "none";
- `attention_mask` (false): an additive key-padding mask input [B, tokens];
- `pool` = "none" (the hidden states) | "map" (big_vision's MAP head) |
  "pooler" (BERT's: first token → dense → tanh, beside the hidden states) |
  "first_norm" (CLIP's: the final norm `ln_f` on the first token only,
  beside the hidden states; needs `final_norm` false) |
  "last" (each sequence's last position → the LM head [H, vocab]: logits);
- `proj` (0): an output projection [H, proj] with bias after the pool (PE-Core);
- `vocab` (0): the LM head's width and the host word-embedding table's
  rows; `tied_embeddings` (false): the LM head is that table (counted once);
- `qk_dtype`, `pv_dtype` = "fp16" | "fp8": the attention products' operands;
- `partials` = "fp16" | "fp32": the dtype of the K-split partial sums of the
  projections and MLP (MatMul.partials; fp16 as the published runs reduce).

ViT graph (the zoo's defaults; unchanged from the first template):

    patches [B·T, C·p·p] fp16 (input) → Cast fp8 → MatMul(w_patch, b_patch) →
    Add pos_embed [T, H] (row-periodic over the batch) → Repeat × L (body
    below; per-layer weights are iterated parameters `layers.<name>` with a
    leading [L] dim) → LayerNorm(ln_f) → out [B·T, H]; with pool "map" that is
    `encoded` and big_vision's MAPHead follows (a learned probe broadcast over
    the batch, attention with one query per image, head_ln, MLP, residual) →
    out [B, H].

Body (argument `x`, yield `y`, all [B·T, H] fp16), pre-LN:
    ln1 → Cast fp8 → q,k,v = MatMul(+bias) → [RoPE on q, k] → SplitHeads →
    BatchMatMul(q, kᵀ) → Softmax(1/sqrt(dh), mask, causal) → BatchMatMul(p, v)
    → MergeHeads → Cast fp8 → o MatMul → Add x → ln2 → Cast fp8 → MLP → Add → y
(qk_dtype fp8: q and k are cast to fp8 before SplitHeads; pv_dtype fp8: v
likewise and the probabilities before the PV product).  Post-LN moves the
norms after the residual adds.  Text models start from the host-gathered
token embeddings plus the position and type-0 embeddings (and the embedding
norm), and end with the pooler or the LM head.  The fixed parts of the
RoPE tables and the attention mask enter the Repeat as invariant bindings.

Weights are fp8 with a power-of-two scale (`WEIGHT_SCALE_EXP`, chosen for
weights of std `WEIGHT_STD`, see planner/reference.py); biases, norm
parameters and position tables are fp16.  Activation casts to fp8 use the
fixed exponents in `CAST_SCALE_EXP`, chosen so the casts of a forward pass at
the reference initialization neither saturate nor underflow
(tests/test_reference.py checks it).  `host_parameters` (a graph attr) counts
the elements of the tables that stay on the host (the word embeddings of an
untied model, position rows past the sequence) and `derived_parameters` those
of the device tensors that are computed, not learned (the RoPE tables):
`model_parameter_count(g)` is the model's published count.

`precision="fp16"` builds the deployable graph with every operand fp16: the
fp8 weights and activation casts of the default policy become fp16 tensors and
the casts disappear.  `precision="fp32"` builds the same graph with every
tensor fp32 (casts become fp32→fp32): the reference-only variant the float64
cross-check uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from planner.ir.builder import CAST_SCALE_EXP, WEIGHT_SCALE_EXP, Tensors
from planner.ir.graph import Graph, Repeat, Tensor, make_graph
from planner.ir.ops.add import Add
from planner.ir.ops.batch_matmul import BatchMatMul
from planner.ir.ops.broadcast import Broadcast
from planner.ir.ops.cast import Cast
from planner.ir.ops.gelu import Gelu
from planner.ir.ops.heads import MergeHeads, SplitHeads
from planner.ir.ops.layernorm import LayerNorm
from planner.ir.ops.matmul import MatMul
from planner.ir.ops.rmsnorm import RMSNorm
from planner.ir.ops.rope import Rope
from planner.ir.ops.rows import Rows
from planner.ir.ops.silu import Tanh
from planner.ir.ops.softmax import Softmax
from planner.ir.ops.swiglu import SwiGLU
from tilecommon.config import Limits, check_fields, is_path, read_toml
from tilecommon.errors import ConfigError

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
PRECISIONS = ("fp8", "fp16", "fp32")
DEPLOYABLE = ("fp8", "fp16")  # precisions a plan can be built for

WEIGHT_STD = 0.02
POOLS = ("none", "map", "pooler", "last", "first_norm")
ATTENTION_DTYPES = ("fp16", "fp8")
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "quick_gelu", "swiglu")
GELU_FORMS = {"gelu_tanh": "tanh", "gelu_erf": "erf", "quick_gelu": "quick"}
# choice field -> (allowed values, default); a field at its default is left
# out of the graph's attrs (the first template's graphs stay as they were)
_CHOICES: dict[str, tuple[tuple[Any, ...], Any]] = {
    "pool": (POOLS, "none"), "qk_dtype": (ATTENTION_DTYPES, "fp16"),
    "pv_dtype": (ATTENTION_DTYPES, "fp16"), "partials": (("fp16", "fp32"), "fp16"),
    "input": (("patches", "embeddings"), "patches"),
    "block": (("pre_ln", "post_ln"), "pre_ln"),
    "norm": (("layernorm", "rmsnorm"), "layernorm"),
    "activation": (ACTIVATIONS, "gelu_tanh"),
    "attention": (("bidirectional", "causal"), "bidirectional"),
    "bias": (("all", "qkv", "none"), "all"),
    "embed_norm": ((False, True), False), "final_norm": ((True, False), True),
    "attention_mask": ((False, True), False), "tied_embeddings": ((False, True), False),
}


@dataclass(frozen=True)
class ModelConfig:
    """A transformer: sizes, and the choices of the module docstring's table
    (0 for an absent optional size: `patch`, `channels`, `kv_heads` (=
    heads), `rope_theta`, `max_positions` (= tokens), `type_vocab`, `proj`,
    `vocab`)."""

    name: str
    hidden: int
    heads: int
    mlp: int
    tokens: int
    layers: int
    batch: int
    eps: float
    patch: int = 0
    channels: int = 0
    kv_heads: int = 0
    rope_theta: float = 0.0
    max_positions: int = 0
    type_vocab: int = 0
    proj: int = 0
    vocab: int = 0
    pool: str = "none"
    qk_dtype: str = "fp16"
    pv_dtype: str = "fp16"
    partials: str = "fp16"
    input: str = "patches"
    block: str = "pre_ln"
    norm: str = "layernorm"
    activation: str = "gelu_tanh"
    attention: str = "bidirectional"
    bias: str = "all"
    embed_norm: bool = False
    final_norm: bool = True
    attention_mask: bool = False
    tied_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """k/v heads (grouped-query attention shares each among heads / kv q heads)."""
        return self.kv_heads or self.heads


# field -> (type, minimum, maximum)
_LIMITS: Limits = {
    "hidden": (int, 1, 1 << 16),
    "heads": (int, 1, 1 << 10),
    "mlp": (int, 1, 1 << 18),
    "tokens": (int, 1, 1 << 16),
    "layers": (int, 1, 1 << 10),
    "batch": (int, 1, 1 << 12),
    "eps": (float, 1e-12, 0.1),
}
# optional sizes: absent means 0 (none), or what the docstring says
_OPTIONAL: Limits = {
    "patch": (int, 1, 1 << 10),
    "channels": (int, 1, 64),
    "kv_heads": (int, 1, 1 << 10),
    "rope_theta": (float, 1.0, 1e9),
    "max_positions": (int, 1, 1 << 20),
    "type_vocab": (int, 1, 1 << 10),
    "proj": (int, 1, 1 << 16),
    "vocab": (int, 1, 1 << 21),
}
_DEFAULTS: dict[str, Any] = {"batch": 1}


def parse_config(data: dict[str, Any], source: str) -> ModelConfig:
    """Validate a model table; ConfigError names `source` and the field."""
    if not isinstance(data, dict):
        raise ConfigError(source, "model", "must be a table", type(data).__name__)
    data = dict(data)
    values: dict[str, Any] = {}
    for field, (allowed, default) in _CHOICES.items():
        value = data.pop(field, default)
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(source, field, "must be true or false", value)
        elif not isinstance(value, str) or value not in allowed:
            raise ConfigError(source, field, f"must be one of {list(allowed)}", value)
        values[field] = value
    optional = {k: data.pop(k) for k in list(data) if k in _OPTIONAL}
    values.update(check_fields(data, source, _LIMITS, _DEFAULTS))
    if optional:
        values.update(check_fields(optional, source, {k: _OPTIONAL[k] for k in optional},
                                   named=False))
    cfg = ModelConfig(**values)
    _check_consistent(cfg, source)
    return cfg


def _check_consistent(cfg: ModelConfig, source: str) -> None:
    """The fields that depend on each other (ConfigError naming one of them)."""
    def bad(field: str, what: str) -> ConfigError:
        return ConfigError(source, field, what, getattr(cfg, field))

    if cfg.hidden % cfg.heads:
        raise bad("heads", f"must divide hidden ({cfg.hidden})")
    if cfg.heads % cfg.kv:
        raise bad("kv_heads", f"must divide heads ({cfg.heads})")
    if cfg.input == "patches" and not (cfg.patch and cfg.channels):
        raise ConfigError(source, "patch" if not cfg.patch else "channels",
                          "missing (input = \"patches\" needs patch and channels)")
    if cfg.rope_theta and cfg.head_dim % 2:
        raise ConfigError(source, "rope_theta", f"needs an even head size ({cfg.head_dim})",
                          cfg.rope_theta)
    if cfg.max_positions and (cfg.rope_theta or cfg.max_positions < cfg.tokens):
        raise bad("max_positions", f"must be at least tokens ({cfg.tokens}), without "
                                   "rope_theta")
    if cfg.pool == "last" and not cfg.vocab:
        raise ConfigError(source, "vocab", "missing (pool = \"last\" ends in the LM head)")
    if cfg.tied_embeddings and cfg.pool != "last":
        raise bad("tied_embeddings", "needs the LM head (pool = \"last\")")
    if cfg.pool == "map" and cfg.attention != "bidirectional":
        raise bad("pool", "the MAP head needs bidirectional attention")
    if cfg.pool == "first_norm" and cfg.final_norm:
        raise bad("pool", "first_norm is the final norm on the first token: needs "
                          "final_norm = false")


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
    """Read a zoo model by name, a user TOML by path, or a Hugging Face
    `config.json` (or the directory holding one: planner.ir.hf).  ConfigError
    if bad."""
    from planner.ir.hf import hf_table, is_hf_source

    if (is_path(name_or_path) or str(name_or_path).endswith(".json")) and \
            is_hf_source(Path(name_or_path)):
        data, source = hf_table(name_or_path)
    elif str(name_or_path).endswith(".onnx"):
        from planner.ir.onnx_import import onnx_model

        imported = onnx_model(name_or_path)
        if imported.dag is not None:
            raise ConfigError(str(name_or_path), "model", "a DAG of IR ops, not one of the "
                                                          "model templates: no model fields")
        data, source = dict(imported.table), str(name_or_path)
    else:
        data, source = read_toml(name_or_path, ZOO_DIR, "model", "zoo model", "zoo")
    return parse_config(data, source)


def load_model(
    name_or_path: str | Path,
    layers: int | None = None,
    batch: int | None = None,
    precision: str = "fp8",
    tokens: int | None = None,
) -> Graph:
    """The graph of a zoo model (by name), a user TOML (by path) or a Hugging
    Face config (planner.ir.hf).

    `layers`/`batch`/`tokens` override the config (tokens: a text model's
    sequence, a tower's patches; checked against the model as the field is);
    `precision` is "fp8" (the deployable graph of the measured policy: fp8
    projections and MLP, fp16 activations and QK), "fp16" (deployable, every
    operand fp16) or "fp32" (reference-only: every tensor fp32).  Raises
    ConfigError.
    """
    source = str(name_or_path)
    if source.endswith(".onnx"):
        from planner.ir.onnx_import import onnx_model

        dag = onnx_model(name_or_path).dag
        if dag is not None:  # any DAG of the IR's ops: sizes as exported
            for field, value in (("layers", layers), ("batch", batch), ("tokens", tokens)):
                if value is not None:
                    raise ConfigError(source, field, "a DAG import has the sizes it was "
                                                     "exported with: no override", value)
            if precision not in PRECISIONS:
                raise ConfigError(source, "precision", f"must be one of {PRECISIONS}",
                                  precision)
            return dag.graph(precision)
    cfg = load_config(name_or_path)
    for field, value in (("layers", layers), ("batch", batch), ("tokens", tokens)):
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
        "tokens": cfg.tokens if tokens is None else tokens,
    })
    if tokens is not None:
        _check_consistent(cfg, source)  # e.g. beyond a learned position table
    return build_model(cfg, precision)


class _Builder(Tensors):
    """The template's builder: a model config's blocks over `Tensors`."""

    def __init__(self, cfg: ModelConfig, precision: str) -> None:
        super().__init__(precision)
        self.cfg = cfg

    def cast_if(self, x: str, shape: tuple[int, ...], dtype: str, scale: str) -> str:
        """`x` itself for fp16, else its fp8 cast at CAST_SCALE_EXP[scale]."""
        return x if dtype == "fp16" else self.cast8(x, shape, CAST_SCALE_EXP[scale])

    def attention(self, pre: str, q_in8: str, kv_in8: str, tq: int, tkv: int,
                  extra: dict[str, str] | None = None) -> tuple[str, list[str]]:
        """Multi-head attention of queries from `q_in8` [B·tq, H] against
        keys/values from `kv_in8` [B·tkv, H] (both fp8), through the output
        projection; returns (out [B·tq, H] fp16, parameter names).  `pre`
        prefixes every name (the encoder layer's are unprefixed); `extra`
        names the body tensors of the RoPE tables ("cos", "sin") and the
        mask ("mask") when the config has them."""
        cfg, extra = self.cfg, extra or {}
        h, heads, dh, b = cfg.hidden, cfg.heads, cfg.head_dim, cfg.batch
        kv = cfg.kv
        params: list[str] = []
        split = {}
        for name, src, t, nh in (("q", q_in8, tq, heads), ("k", kv_in8, tkv, kv),
                                 ("v", kv_in8, tkv, kv)):
            y, p = self.linear(pre + name, src, h, nh * dh, b * t, bias=cfg.bias != "none")
            params += p
            if "cos" in extra and name != "v":
                rot = self.t(f"{pre}{name}_rope", (b * t, nh * dh), "fp16")
                self.op(Rope(f"rope_{pre}{name}", y, extra["cos"], extra["sin"], rot, dh,
                             cfg.rope_theta))
                y = rot
            dt = cfg.pv_dtype if name == "v" else cfg.qk_dtype
            y = self.cast_if(y, (b * t, nh * dh), dt, "qkv")
            split[name] = self.t(f"{pre}{name}_heads", (b * nh, t, dh), dt, scale_exp=(
                CAST_SCALE_EXP["qkv"] if dt == "fp8" else 0))
            self.op(SplitHeads(f"split_{pre}{name}", y, split[name], nh))
        bh, grp = b * heads, heads // kv
        s = self.t(f"{pre}scores", (bh, tq, tkv), "fp16")
        self.op(BatchMatMul(f"bmm_{pre}qk", split["q"], split["k"], s, transpose_b=True,
                            kv_group=grp))
        pr = self.t(f"{pre}probs", (bh, tq, tkv), "fp16")
        mask = extra.get("mask")
        self.op(Softmax(f"{pre}softmax", s, pr, 1.0 / math.sqrt(dh), mask,
                        heads * tq if mask else 1, tq if cfg.attention == "causal" else 0))
        pr = self.cast_if(pr, (bh, tq, tkv), cfg.pv_dtype, "probs")
        ctx = self.t(f"{pre}ctx_heads", (bh, tq, dh), "fp16")
        self.op(BatchMatMul(f"bmm_{pre}pv", pr, split["v"], ctx, kv_group=grp))
        attn = self.t(f"{pre}attn", (b * tq, h), "fp16")
        self.op(MergeHeads(f"{pre}merge", ctx, attn, heads))
        attn8 = self.cast8(attn, (b * tq, h), CAST_SCALE_EXP["attn"])
        o, p = self.linear(pre + "o", attn8, h, h, b * tq, bias=cfg.bias == "all")
        return o, params + p

    def mlp(self, pre: str, x8: str, rows: int) -> tuple[str, list[str]]:
        """fc1 → act → Cast fp8 → fc2 of fp8 `x8` [rows, H], or for SwiGLU
        gate, up → silu(gate)·up → Cast fp8 → down; (out, parameters)."""
        cfg = self.cfg
        bias = cfg.bias == "all"
        if cfg.activation == "swiglu":
            gate, p1 = self.linear(pre + "gate", x8, cfg.hidden, cfg.mlp, rows, bias=bias)
            up, p2 = self.linear(pre + "up", x8, cfg.hidden, cfg.mlp, rows, bias=bias)
            act = self.t(f"{pre}swiglu", (rows, cfg.mlp), "fp16")
            self.op(SwiGLU(f"{pre}swiglu", gate, up, act))
            act8 = self.cast8(act, (rows, cfg.mlp), CAST_SCALE_EXP["gelu"])
            down, p3 = self.linear(pre + "down", act8, cfg.mlp, cfg.hidden, rows, bias=bias)
            return down, p1 + p2 + p3
        f1, p1 = self.linear(pre + "fc1", x8, cfg.hidden, cfg.mlp, rows, bias=bias)
        act = self.t(f"{pre}gelu", (rows, cfg.mlp), "fp16")
        self.op(Gelu(f"{pre}gelu", f1, act, GELU_FORMS[cfg.activation]))
        act8 = self.cast8(act, (rows, cfg.mlp), CAST_SCALE_EXP["gelu"])
        f2, p2 = self.linear(pre + "fc2", act8, cfg.mlp, cfg.hidden, rows, bias=bias)
        return f2, p1 + p2

    def map_head(self, enc: str, out: str, kind: str) -> str:
        """big_vision's MAPHead over `enc` [B·T, H] (module docstring) -> `out` [B, H]."""
        cfg = self.cfg
        h, b = cfg.hidden, cfg.batch
        probe = self.t("head_probe", (1, h), "fp16", "parameter")
        probes = self.t("head_probes", (b, h), "fp16")
        self.op(Broadcast("broadcast_probe", probe, probes))
        q8 = self.cast8(probes, (b, h), CAST_SCALE_EXP["probe"])
        kv8 = self.cast8(enc, (b * cfg.tokens, h), CAST_SCALE_EXP["ln"])
        x, _ = self.attention("head_", q8, kv8, 1, cfg.tokens)
        ln, _ = self.norm("head_ln", x, b, h)
        f2, _ = self.mlp("head_", self.cast8(ln, (b, h), CAST_SCALE_EXP["ln"]), b)
        y = self.t(out, (b, h), "fp16", kind)
        self.op(Add("head_add", x, f2, y))
        return y

    def linear(self, name: str, x8: str, k: int, n: int, rows: int, kind: str = "activation",
               out: str | None = None, bias: bool = True) -> tuple[str, list[str]]:
        """MatMul x8 @ w_<name> (+ b_<name>); returns (out, [weight, bias])."""
        w = self.t(f"w_{name}", (k, n), "fp8", "parameter", WEIGHT_SCALE_EXP)
        b = self.t(f"b_{name}", (n,), "fp16", "parameter") if bias else None
        y = self.t(out or name, (rows, n), "fp16", kind)
        self.op(MatMul(f"mm_{name}", x8, w, y, bias=b, partials=self.cfg.partials))
        return y, [w] + ([b] if b else [])

    def norm(self, name: str, x: str, rows: int, n: int, kind: str = "activation",
             out: str | None = None) -> tuple[str, list[str]]:
        """The config's norm (LayerNorm or RMSNorm) of x [rows, n]."""
        gamma = self.t(f"{name}.gamma", (n,), "fp16", "parameter")
        y = self.t(out or name, (rows, n), "fp16", kind)
        if self.cfg.norm == "rmsnorm":
            self.op(RMSNorm(name, x, gamma, y, self.cfg.eps))
            return y, [gamma]
        beta = self.t(f"{name}.beta", (n,), "fp16", "parameter")
        self.op(LayerNorm(name, x, gamma, beta, y, self.cfg.eps))
        return y, [gamma, beta]


def _encoder_layer(cfg: ModelConfig, precision: str
                   ) -> tuple[Graph, list[str], dict[str, str]]:
    """The Repeat body, its per-layer parameters (in binding order) and its
    layer-invariant tensors by role ("cos", "sin", "mask": body names)."""
    rows, h = cfg.batch * cfg.tokens, cfg.hidden
    g = _Builder(cfg, precision)
    params: list[str] = []
    extra: dict[str, str] = {}
    if cfg.rope_theta:
        for role in ("cos", "sin"):
            extra[role] = g.t(f"rope_{role}", (cfg.tokens, cfg.head_dim // 2), "fp16",
                              "parameter")
    if cfg.attention_mask:
        extra["mask"] = g.t("mask", (cfg.batch, cfg.tokens), "fp16", "parameter")
    x = g.t("x", (rows, h), "fp16", "input")
    post = cfg.block == "post_ln"
    src = x
    if not post:
        src, p = g.norm("ln1", x, rows, h)
        params += p
    src8 = g.cast8(src, (rows, h), CAST_SCALE_EXP["ln"])
    o, p = g.attention("", src8, src8, cfg.tokens, cfg.tokens, extra)
    params += p
    x1 = g.t("x1", (rows, h), "fp16")
    g.op(Add("add_attn", x, o, x1))
    if post:
        x1, p = g.norm("ln1", x1, rows, h)
        params += p
        src = x1
    else:
        src, p = g.norm("ln2", x1, rows, h)
        params += p
    f2, p = g.mlp("", g.cast8(src, (rows, h), CAST_SCALE_EXP["ln"]), rows)
    params += p
    if post:
        x2 = g.t("x2", (rows, h), "fp16")
        g.op(Add("add_mlp", x1, f2, x2))
        y, p = g.norm("ln2", x2, rows, h, kind="output", out="y")
        params += p
    else:
        y = g.t("y", (rows, h), "fp16", "output")
        g.op(Add("add_mlp", x1, f2, y))
    body = make_graph(f"{cfg.name}.layer", g.tensors, g.ops, [x], [y])
    return body, params, extra


def _embeddings(g: _Builder, cfg: ModelConfig) -> tuple[str, str]:
    """The input and the embeddings [B·T, H] fed to the first layer."""
    rows, h, t = cfg.batch * cfg.tokens, cfg.hidden, cfg.tokens
    if cfg.input == "patches":
        k_patch = cfg.channels * cfg.patch * cfg.patch
        inp = g.t("patches", (rows, k_patch), "fp16", "input")
        p8 = g.cast8(inp, (rows, k_patch), CAST_SCALE_EXP["patches"])
        emb, _ = g.linear("patch", p8, k_patch, h, rows, out="embed")
    else:
        inp = emb = g.t("embeds", (rows, h), "fp16", "input")
    if cfg.rope_theta:  # the residual stream starts as a device copy of the input
        x = g.t("x0", (rows, h), "fp16")
        g.op(Cast("embed_in", emb, x))
    else:
        # the rows the sequence reads (a longer table's others stay on the host)
        pos = g.t("pos_embed", (t, h), "fp16", "parameter")
        x = g.t("x0", (rows, h), "fp16")
        g.op(Add("add_pos", emb, pos, x))
    if cfg.type_vocab:
        table = g.t("type_embed", (cfg.type_vocab, h), "fp16", "parameter")
        row = g.t("type0", (1, h), "fp16")
        g.op(Rows("type_row", table, row, (0,)))
        x_t = g.t("x_type", (rows, h), "fp16")
        g.op(Add("add_type", x, row, x_t))
        x = x_t
    if cfg.embed_norm:
        x, _ = g.norm("embed_ln", x, rows, h)
    return inp, x


def build_model(cfg: ModelConfig, precision: str = "fp8") -> Graph:
    """The whole graph for `cfg` (module docstring); verified."""
    rows, h, b, t = cfg.batch * cfg.tokens, cfg.hidden, cfg.batch, cfg.tokens
    body, body_params, extra = _encoder_layer(cfg, precision)
    g = _Builder(cfg, precision)
    inp, x0 = _embeddings(g, cfg)
    inputs = [inp]
    iterated = []
    for bp in body_params:
        inner = body.tensor(bp)
        outer = f"layers.{bp}"
        g.tensors.append(Tensor(outer, (cfg.layers, *inner.shape), inner.dtype, "parameter",
                                inner.scale_exp))
        iterated.append((outer, bp))
    invariant = []
    for role, inner_name in sorted(extra.items()):
        inner = body.tensor(inner_name)
        kind = "input" if role == "mask" else "parameter"
        outer = "attention_mask" if role == "mask" else inner_name
        g.tensors.append(Tensor(outer, inner.shape, inner.dtype, kind, inner.scale_exp))
        invariant.append((outer, inner_name))
        if kind == "input":
            inputs.append(outer)
    outputs = []
    # the hidden states out (beside BERT's pooler or CLIP's normed first token)
    hidden_out = cfg.pool in ("none", "pooler", "first_norm") and not cfg.proj
    kind = "output" if hidden_out and not cfg.final_norm else "activation"
    xl = g.t("xL" if kind != "output" else "out", (rows, h), "fp16", kind)
    g.op(Repeat("encoder", body, cfg.layers, init=(x0,), final=(xl,), arguments=("x",),
                yields=("y",), iterated=tuple(iterated), invariant=tuple(invariant)))
    enc = xl
    if cfg.final_norm:
        name = "out" if hidden_out else ("encoded" if cfg.pool == "map" else "ln_f")
        enc, _ = g.norm("ln_f", xl, rows, h, kind="output" if hidden_out else "activation",
                        out=name)
    if hidden_out:
        outputs.append(enc)
    pooled = _pool(g, cfg, enc, outputs)
    if cfg.proj:
        p8 = g.cast8(pooled, (b, h), CAST_SCALE_EXP["ln"])
        y, _ = g.linear("proj", p8, h, cfg.proj, b, kind="output", out="out")
        outputs.append(y)
    host = cfg.vocab * h if cfg.vocab and not cfg.tied_embeddings else 0
    host += max(0, cfg.max_positions - t) * h  # position rows past the sequence
    attrs = [("model", cfg.name), ("hidden", h), ("heads", cfg.heads), ("mlp", cfg.mlp),
             ("tokens", t), ("batch", b), ("layers", cfg.layers)]
    if cfg.input == "patches":
        attrs += [("patch", cfg.patch), ("channels", cfg.channels)]
    attrs += [("eps", cfg.eps), ("precision", precision)]
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    attrs += [(f, getattr(cfg, f)) for f in list(_CHOICES) + list(_OPTIONAL)
              if f not in ("patch", "channels") and getattr(cfg, f) != defaults[f]]
    if host:
        attrs.append(("host_parameters", host))
    if cfg.rope_theta:  # the RoPE tables: computed, not learned
        attrs.append(("derived_parameters", cfg.tokens * cfg.head_dim))
    return make_graph(cfg.name, g.tensors, g.ops, inputs, outputs, attrs)


def _pool(g: _Builder, cfg: ModelConfig, enc: str, outputs: list[str]) -> str:
    """The pooling head over `enc` [B·T, H]: appends the graph outputs it
    makes to `outputs` and returns the pooled [B, H] tensor (or `enc`)."""
    b, h, t = cfg.batch, cfg.hidden, cfg.tokens
    proj = bool(cfg.proj)
    if cfg.pool == "map":
        y = g.map_head(enc, "pooled" if proj else "out", "activation" if proj else "output")
        if not proj:
            outputs.append(y)
        return y
    if cfg.pool == "pooler":  # BERT: first token -> dense -> tanh
        first = g.t("first", (b, h), "fp16")
        g.op(Rows("first_token", enc, first, tuple(i * t for i in range(b))))
        d, _ = g.linear("pool", g.cast8(first, (b, h), CAST_SCALE_EXP["ln"]), h, h, b)
        y = g.t("pooled", (b, h), "fp16", "activation" if proj else "output")
        g.op(Tanh("pool_tanh", d, y))
        if not proj:
            outputs.append(y)
        return y
    if cfg.pool == "first_norm":  # CLIP: the final norm on the first token only
        first = g.t("first", (b, h), "fp16")
        g.op(Rows("first_token", enc, first, tuple(i * t for i in range(b))))
        y, _ = g.norm("ln_f", first, b, h, kind="activation" if proj else "output",
                      out="pooled")
        if not proj:
            outputs.append(y)
        return y
    if cfg.pool == "last":  # the next token's logits from each sequence's last position
        last = g.t("last", (b, h), "fp16")
        g.op(Rows("last_token", enc, last, tuple(i * t + t - 1 for i in range(b))))
        logits, _ = g.linear("lm_head", g.cast8(last, (b, h), CAST_SCALE_EXP["ln"]), h,
                             cfg.vocab, b, kind="output", out="logits", bias=False)
        outputs.append(logits)
        return last
    return enc


def build_vit(cfg: ModelConfig, precision: str = "fp8") -> Graph:
    """The graph of a ViT config (the zoo's first template): build_model."""
    return build_model(cfg, precision)
