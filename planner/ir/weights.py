"""Weights from files: `.npz` or `.safetensors`, under our names or a checkpoint's.

`load_weights(g, path)` returns `{parameter: float32 array}` of the *raw*
values (not yet rounded to the parameters' dtypes; `quantize_params` does
that, at the graph's scales, which `planner.ir.scales` can choose from the
data).  The keys of a file follow one of the SCHEMES, recognised by its
names (docs/weights.md lists every name):

- **ours**: the graph's parameter names (`layers.w_q` [L, H, H], `w_patch`,
  `head_probe`, ...), shapes exactly as the graph has them;
- **Hugging Face** `SiglipVisionModel` (keys start `vision_model.`): Linear
  weights [out, in] are transposed, the patch convolution [H, C, p, p]
  becomes [C·p·p, H], per-layer tensors `encoder.layers.<i>.` are stacked,
  the head's fused `in_proj_weight` [3H, H] is split into q, k, v;
- **Hugging Face** `ViTModel` and `DeiTModel` (`hf-vit`: keys
  `embeddings.cls_token` or `encoder.layer.<i>.attention.attention.`,
  `vit.` / `deit.` optional): the class token (and DeiT's
  `embeddings.distillation_token`) is folded into the first position row
  (and the second: our patch input carries each as a zero row: pos[i] +
  token - b_patch);
- **Hugging Face** `BertModel` (`hf-bert`: keys `encoder.layer.<i>.`,
  `bert.` optional) and Qwen2 / Llama / Mistral (`hf-decoder`: keys
  `model.layers.<i>.`): Linear weights transposed, per-layer tensors
  stacked; tensors that stay on the host or are not the model's (word
  embeddings of an untied model, `position_ids`, pre-training heads,
  `rotary_emb.inv_freq`) are not used, a tied model's embedding table is its
  LM head, and the RoPE tables are computed (`derived_values`);
- **big_vision** (the JAX checkpoints; keys like
  `params/img/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel`, the
  `params/` and `img/` prefixes optional, layers scanned [L, ...] or
  `encoderblock_<i>`): kernels are [in, out] already; attention kernels
  [H, heads, dh] / [heads, dh, H] and biases [heads, dh] are reshaped, the
  patch kernel [p, p, C, H] becomes [C·p·p, H].

A checkpoint's layers beyond the graph's (`--layers 1` of a 27-layer file)
are not used.  Every other mismatch is a ConfigError naming the file and the
tensor: a parameter the file lacks (with the name it was looked up under),
a tensor the scheme does not know, a shape that does not fit (with the
expected one), a non-float dtype, a non-finite value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.ir.graph import Graph, Tensor
from tilecommon.errors import ConfigError

F32 = np.float32
SCHEMES = ("ours", "hf", "hf-vit", "hf-bert", "hf-decoder", "big_vision")


@dataclass(frozen=True)
class Rule:
    """One file tensor -> one of our parameters: `target` (a per-layer body
    name when `layered`), how its array becomes ours (`how`: "same",
    "transpose", "conv_oihw", "conv_hwio", "reshape", "rows" (the first rows:
    a position table longer than the sequence), or "q"/"k"/"v" for one third
    of a fused in-projection, transposed when 2-D)."""

    target: str
    how: str = "same"
    layered: bool = False


HOST = Rule("", "host")  # a checkpoint tensor that stays on the host or is not ours: unused


# ---------------------------------------------------------------- schemes

_HF_LAYER = {
    "layer_norm1.weight": "ln1.gamma", "layer_norm1.bias": "ln1.beta",
    "layer_norm2.weight": "ln2.gamma", "layer_norm2.bias": "ln2.beta",
    **{f"self_attn.{p}_proj.{w}": f"{'w' if w == 'weight' else 'b'}_{p}"
       for p in "qkv" for w in ("weight", "bias")},
    "self_attn.out_proj.weight": "w_o", "self_attn.out_proj.bias": "b_o",
    "mlp.fc1.weight": "w_fc1", "mlp.fc1.bias": "b_fc1",
    "mlp.fc2.weight": "w_fc2", "mlp.fc2.bias": "b_fc2",
}
_HF_TOP = {
    "embeddings.patch_embedding.weight": Rule("w_patch", "conv_oihw"),
    "embeddings.patch_embedding.bias": Rule("b_patch"),
    "embeddings.position_embedding.weight": Rule("pos_embed"),
    "post_layernorm.weight": Rule("ln_f.gamma"), "post_layernorm.bias": Rule("ln_f.beta"),
    # CLIP's tower (CLIPVisionModel): a class token and the pre-layernorm
    "embeddings.class_embedding": Rule("cls_token", "cls"),
    "pre_layrnorm.weight": Rule("embed_ln.gamma"), "pre_layrnorm.bias": Rule("embed_ln.beta"),
    "embeddings.position_ids": HOST,  # an index buffer
    "head.probe": Rule("head_probe", "reshape"),
    "head.attention.out_proj.weight": Rule("w_head_o", "transpose"),
    "head.attention.out_proj.bias": Rule("b_head_o"),
    "head.layernorm.weight": Rule("head_ln.gamma"), "head.layernorm.bias": Rule("head_ln.beta"),
    "head.mlp.fc1.weight": Rule("w_head_fc1", "transpose"),
    "head.mlp.fc1.bias": Rule("b_head_fc1"),
    "head.mlp.fc2.weight": Rule("w_head_fc2", "transpose"),
    "head.mlp.fc2.bias": Rule("b_head_fc2"),
}


def _encoder_layer(attention: str) -> dict[str, str]:
    """The names transformers' BERT-family layers share: q, k, v under
    `attention`, the attention's output dense and the MLP's two denses."""
    return {
        **{f"{attention}.{hf}.{w}": f"{'w' if w == 'weight' else 'b'}_{ours}"
           for hf, ours in (("query", "q"), ("key", "k"), ("value", "v"))
           for w in ("weight", "bias")},
        "attention.output.dense.weight": "w_o", "attention.output.dense.bias": "b_o",
        "intermediate.dense.weight": "w_fc1", "intermediate.dense.bias": "b_fc1",
        "output.dense.weight": "w_fc2", "output.dense.bias": "b_fc2"}


# transformers' ViTModel (keys optionally under `vit.`); the class token is folded
# into the first position row (our patch input carries it as a zero row)
_VIT_LAYER = {
    **_encoder_layer("attention.attention"),
    "layernorm_before.weight": "ln1.gamma", "layernorm_before.bias": "ln1.beta",
    "layernorm_after.weight": "ln2.gamma", "layernorm_after.bias": "ln2.beta",
}
_VIT_TOP = {
    "embeddings.patch_embeddings.projection.weight": Rule("w_patch", "conv_oihw"),
    "embeddings.patch_embeddings.projection.bias": Rule("b_patch"),
    "embeddings.position_embeddings": Rule("pos_embed", "reshape"),
    "embeddings.cls_token": Rule("cls_token", "cls"),
    "embeddings.distillation_token": Rule("distillation_token", "cls"),  # DeiT
    "layernorm.weight": Rule("ln_f.gamma"), "layernorm.bias": Rule("ln_f.beta"),
    "pooler.dense.weight": Rule("w_pool", "transpose"), "pooler.dense.bias": Rule("b_pool"),
}

# transformers' BertModel (keys optionally under `bert.`, as BertFor* save them)
_BERT_LAYER = {
    **_encoder_layer("attention.self"),
    "attention.output.LayerNorm.weight": "ln1.gamma", "attention.output.LayerNorm.bias": "ln1.beta",
    "output.LayerNorm.weight": "ln2.gamma", "output.LayerNorm.bias": "ln2.beta",
}
_BERT_TOP = {
    "embeddings.position_embeddings.weight": Rule("pos_embed", "rows"),
    "embeddings.token_type_embeddings.weight": Rule("type_embed"),
    "embeddings.LayerNorm.weight": Rule("embed_ln.gamma"),
    "embeddings.LayerNorm.bias": Rule("embed_ln.beta"),
    "pooler.dense.weight": Rule("w_pool", "transpose"), "pooler.dense.bias": Rule("b_pool"),
    "embeddings.word_embeddings.weight": HOST,  # gathered on the host
    "embeddings.position_ids": HOST,  # an index buffer
}
# transformers' Qwen2 / Llama / Mistral (keys under `model.`, the LM head `lm_head.`)
_DEC_LAYER = {
    "input_layernorm.weight": "ln1.gamma", "post_attention_layernorm.weight": "ln2.gamma",
    **{f"self_attn.{p}_proj.{w}": f"{'w' if w == 'weight' else 'b'}_{p}"
       for p in "qkvo" for w in ("weight", "bias")},
    "mlp.gate_proj.weight": "w_gate", "mlp.up_proj.weight": "w_up",
    "mlp.down_proj.weight": "w_down",
}
_DEC_TOP = {"norm.weight": Rule("ln_f.gamma"),  # under `model.` unless a bare model's
            "lm_head.weight": Rule("w_lm_head", "transpose")}

_HF_FUSED = {"head.attention.in_proj_weight": "w_head_", "head.attention.in_proj_bias": "b_head_"}

_BV_BLOCK = {
    "LayerNorm_0/scale": "ln1.gamma", "LayerNorm_0/bias": "ln1.beta",
    "LayerNorm_1/scale": "ln2.gamma", "LayerNorm_1/bias": "ln2.beta",
    "MlpBlock_0/Dense_0/kernel": "w_fc1", "MlpBlock_0/Dense_0/bias": "b_fc1",
    "MlpBlock_0/Dense_1/kernel": "w_fc2", "MlpBlock_0/Dense_1/bias": "b_fc2",
    **{f"MultiHeadDotProductAttention_0/{bv}/{w}": f"{'w' if w == 'kernel' else 'b'}_{ours}"
       for bv, ours in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
       for w in ("kernel", "bias")},
}
_BV_TOP = {
    "embedding/kernel": Rule("w_patch", "conv_hwio"),
    "embedding/bias": Rule("b_patch"),
    "pos_embedding": Rule("pos_embed", "reshape"),
    "Transformer/encoder_norm/scale": Rule("ln_f.gamma"),
    "Transformer/encoder_norm/bias": Rule("ln_f.beta"),
    "MAPHead_0/probe": Rule("head_probe", "reshape"),
    "MAPHead_0/LayerNorm_0/scale": Rule("head_ln.gamma"),
    "MAPHead_0/LayerNorm_0/bias": Rule("head_ln.beta"),
    **{f"MAPHead_0/{k}": Rule(v.replace("_", "_head_", 1), "reshape")
       for k, v in _BV_BLOCK.items() if k.startswith(("MultiHead", "MlpBlock"))},
}


def scheme_of(names: list[str], g: Graph) -> str:
    """"ours" when any name is a parameter of `g`; "hf" for SigLIP's
    `vision_model.` keys, "hf-bert" for a BertModel's, "hf-decoder" for a
    Qwen2 / Llama one's; else "big_vision"."""
    params = set(g.parameters)
    if any(n in params for n in names):
        return "ours"
    if any(n.startswith(("vision_model.", "embeddings.patch_embedding.")) for n in names):
        return "hf"  # a SiglipVisionModel saves its keys with or without `vision_model.`
    if any(re.match(r"(vit\.|deit\.)?(embeddings\.cls_token$|encoder\.layer\.\d+\."
                    r"attention\.attention\.)", n) for n in names):
        return "hf-vit"
    if any(re.match(r"(bert\.)?(encoder\.layer\.|embeddings\.word_embeddings)", n)
           for n in names):
        return "hf-bert"
    if any(re.match(r"(model\.)?(layers\.\d+\.self_attn\.|embed_tokens\.)", n)
           for n in names):
        return "hf-decoder"  # a bare LlamaModel / Qwen2Model saves without `model.`
    return "big_vision"


def _per_layer(rest: str, pattern: str, table: dict[str, str]
               ) -> tuple[Rule, int | None] | None:
    """The rule of a per-layer tensor `rest` (`pattern` captures the layer
    index and the name within the layer; Linear weights are transposed)."""
    m = re.fullmatch(pattern, rest)
    if not (m and m.group(2) in table):
        return None
    target = table[m.group(2)]
    return Rule(target, "transpose" if target.startswith("w_") else "same", True), int(m.group(1))


def rule_for(name: str, scheme: str, tied: bool = False) -> tuple[Rule, int | None] | None:
    """(rule, layer index or None for a stacked [L, ...] tensor / a top-level
    one) of file tensor `name` under `scheme`; None when it knows no such name.
    `tied`: the model's LM head is its token embedding table (hf-decoder)."""
    hf = {"hf": ("vision_model.", r"encoder\.layers\.(\d+)\.(.+)", _HF_LAYER, _HF_TOP),
          "hf-vit": ("vit.", r"encoder\.layer\.(\d+)\.(.+)", _VIT_LAYER, _VIT_TOP),
          "hf-bert": ("bert.", r"encoder\.layer\.(\d+)\.(.+)", _BERT_LAYER, _BERT_TOP),
          "hf-decoder": ("model.", r"layers\.(\d+)\.(.+)", _DEC_LAYER, _DEC_TOP)}
    if scheme in hf:
        prefix, pattern, layer, top = hf[scheme]
        rest = name.removeprefix(prefix) if prefix else name
        if scheme == "hf-vit":
            rest = rest.removeprefix("deit.")  # DeiTFor* classes save under `deit.`
        if scheme == "hf-bert" and rest.startswith("cls."):
            return HOST, None  # the pre-training heads
        if scheme == "hf-decoder":
            if rest == "embed_tokens.weight":
                return (Rule("w_lm_head", "transpose") if tied else HOST), None
            if name.endswith("rotary_emb.inv_freq"):
                return HOST, None  # a derived buffer of older checkpoints
        hit = _per_layer(rest, pattern, layer)
        if hit is not None:
            return hit
        rule = top.get(rest)
        return None if rule is None else (rule, None)
    rest = re.sub(r"^(params/)?(img/)?", "", name)
    m = re.fullmatch(r"Transformer/encoderblock(?:_(\d+))?/(.+)", rest)
    if m and m.group(2) in _BV_BLOCK:
        return Rule(_BV_BLOCK[m.group(2)], "reshape", True), (
            None if m.group(1) is None else int(m.group(1)))
    rule = _BV_TOP.get(rest)
    return None if rule is None else (rule, None)


# ---------------------------------------------------------------- loading


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a `.npz` or `.safetensors` file (ConfigError naming
    the file when it cannot be read)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(path), "weights", "no such file")
    try:
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if p.suffix == ".safetensors":
            from safetensors.numpy import load_file

            return dict(load_file(str(p)))
        if p.suffix == ".onnx":  # the initializers an imported model maps to our names
            from planner.ir.onnx_import import onnx_model

            return dict(onnx_model(p).weights)
    except ConfigError:
        raise
    except Exception as e:  # OSError, BadZipFile, ValueError, safetensors' SafetensorError
        raise ConfigError(str(path), "weights", f"cannot read: {e}") from None
    raise ConfigError(str(path), "weights", "must be a .npz, .safetensors or .onnx file",
                      p.suffix)


def _convert(a: np.ndarray, rule: Rule, want: tuple[int, ...], g: Graph) -> np.ndarray | None:
    """`a` as our tensor of shape `want` under `rule`, or None if it does not fit."""
    how = rule.how
    if how == "transpose" and a.ndim == 2:
        a = a.T
    elif how == "conv_oihw" and a.ndim == 4:  # [H, C, p, p] -> [C·p·p, H]
        a = a.reshape(a.shape[0], -1).T
    elif how == "conv_hwio" and a.ndim == 4:  # [p, p, C, H] -> [C·p·p, H]
        a = a.transpose(2, 0, 1, 3).reshape(-1, a.shape[3])
    elif how in ("q", "k", "v"):  # one third of a fused [3H, ...] projection
        third = a.shape[0] // 3
        if a.shape[0] != 3 * third:
            return None
        a = a["qkv".index(how) * third:("qkv".index(how) + 1) * third]
        a = a.T if a.ndim == 2 else a
    elif how == "reshape" and a.size == int(np.prod(want)):
        a = a.reshape(want)
    elif how == "rows" and a.ndim == 2 and a.shape[1:] == want[1:] and a.shape[0] >= want[0]:
        a = a[:want[0]]  # a position table's rows past the sequence are not used
    return a if a.shape == want else None


def _expected(rule: Rule, want: tuple[int, ...], g: Graph) -> str:
    if rule.how == "transpose":
        return str(want[::-1])
    if rule.how == "conv_oihw":
        c, p = g.attr_int("channels"), g.attr_int("patch")
        return str((want[1], c, p, p))
    if rule.how == "conv_hwio":
        c, p = g.attr_int("channels"), g.attr_int("patch")
        return str((p, p, c, want[1]))
    if rule.how == "reshape":
        return f"{int(np.prod(want))} elements ({want} or a reshape of it)"
    if rule.how in ("q", "k", "v"):
        return str((3 * want[-1], *want[:-1][::-1])) if len(want) == 2 else str((3 * want[0],))
    if rule.how == "rows":
        return f"{want} (or more rows)"
    return str(want)


F32_MAX = float(np.finfo(F32).max)


def _checked_array(path: str, name: str, a: np.ndarray) -> np.ndarray:
    if a.dtype.kind != "f":
        raise ConfigError(path, name, "dtype must be a float type", str(a.dtype))
    if not np.all(np.isfinite(a)):
        raise ConfigError(path, name, "holds a NaN or infinite value")
    if a.size and a.dtype.itemsize > 4:
        big = float(np.max(np.abs(a)))
        if big > F32_MAX:
            raise ConfigError(path, name, f"holds a value beyond float32's range "
                                          f"(|x| <= {F32_MAX:.4g})", big)
    return np.asarray(a, dtype=F32)


def load_weights(g: Graph, path: str | Path) -> dict[str, np.ndarray]:
    """The raw float32 values of every parameter of `g` from `path` (module
    docstring); ConfigError naming the file and the tensor otherwise."""
    src = str(path)
    arrays = read_arrays(path)
    scheme = scheme_of(sorted(arrays), g)
    want = {p: g.tensor(p) for p in g.parameters}
    if scheme == "ours":
        ours: dict[str, np.ndarray] = {}
        for name in sorted(arrays):
            if name not in want:
                raise ConfigError(src, name, "not a parameter of model "
                                             f"{g.name} (file uses our names)")
            a = _checked_array(src, name, arrays[name])
            shape = want[name].shape
            if (name.startswith("layers.") or name == "pos_embed") and \
                    a.ndim == len(shape) and a.shape[1:] == shape[1:] and a.shape[0] > shape[0]:
                a = a[:shape[0]]  # a deeper file's later layers (positions) are not used
            if a.shape != shape:
                raise ConfigError(src, name, f"shape must be {shape}" + (
                    " (or more layers)" if name.startswith("layers.") else ""), a.shape)
            ours[name] = np.ascontiguousarray(a)
        for name, value in derived_values(g).items():  # computed, not learned (RoPE tables)
            ours.setdefault(name, np.asarray(value, dtype=F32))
        _missing(src, want, ours, scheme)
        return ours
    layers = {}  # body name -> outer [L, ...] parameter
    for p in want:
        if p.startswith("layers."):
            layers[p.removeprefix("layers.")] = p
    trips = g.attr_int("layers")
    tied = bool(g.attr("tied_embeddings", False))
    out: dict[str, np.ndarray] = {}
    stacks: dict[str, dict[int, np.ndarray]] = {}
    tokens: dict[str, np.ndarray] = {}  # class (and distillation) token
    spelled: dict[tuple[str, int | None], str] = {}  # (target, layer) -> the file's name

    def claim(target: str, slots: range | list[int | None], name: str) -> None:
        """One file tensor per parameter (and layer): `layers.00` beside
        `layers.0`, or a scanned stack beside per-block tensors, is ambiguous."""
        for slot in slots:
            first = spelled.setdefault((target, slot), name)
            if first != name:
                raise ConfigError(src, name, f"gives {target}"
                                  + ("" if slot is None else f" layer {slot}")
                                  + f" again, already given by {first!r}")

    for name in sorted(arrays):
        hits: list[tuple[Rule, int | None]] = []
        if scheme == "hf" and name.removeprefix("vision_model.") in _HF_FUSED:
            pre = _HF_FUSED[name.removeprefix("vision_model.")]
            hits = [(Rule(pre + w, w), None) for w in "qkv"]
        else:
            hit = rule_for(name, scheme, tied)
            if hit is None:
                raise ConfigError(src, name, f"unknown tensor for the {scheme} naming "
                                             f"(docs/weights.md lists the names)")
            if hit[0] is HOST:
                continue
            hits = [hit]
        a = _checked_array(src, name, arrays[name])
        if hits[0][0].how == "cls":  # folded into pos_embed[0] (and [1]) below
            claim(hits[0][0].target, [None], name)
            tokens[hits[0][0].target] = a.reshape(-1)
            continue
        for rule, layer in hits:
            target = layers.get(rule.target) if rule.layered else rule.target
            if target is None or target not in want:
                raise ConfigError(src, name, f"maps to {rule.target!r}, which model {g.name} "
                                             f"does not have")
            t: Tensor = want[target]
            if rule.layered and layer is None:  # a scanned stack [L_file, ...]
                if a.ndim == 0 or a.shape[0] < trips:
                    raise ConfigError(src, name, f"must stack at least {trips} layers",
                                      a.shape)
                per = [_convert(a[i], rule, t.shape[1:], g) for i in range(trips)]
                if any(x is None for x in per):
                    raise ConfigError(src, name, f"shape must be [L, ] + "
                                                 f"{_expected(rule, t.shape[1:], g)}", a.shape)
                claim(target, range(trips), name)
                stacks.setdefault(target, {}).update(enumerate(per))  # type: ignore[arg-type]
                continue
            shape = t.shape[1:] if rule.layered else t.shape
            conv = _convert(a, rule, shape, g)
            if conv is None:
                raise ConfigError(src, name, f"shape must be {_expected(rule, shape, g)}",
                                  a.shape)
            if rule.layered:
                assert layer is not None
                if layer < trips:  # later layers of a deeper checkpoint are unused
                    claim(target, [layer], name)
                    stacks.setdefault(target, {})[layer] = conv
            else:
                claim(target, [None], name)
                out[target] = np.ascontiguousarray(conv, dtype=F32)
    for target, per_layer in stacks.items():
        gone = [i for i in range(trips) if i not in per_layer]
        if gone:
            raise ConfigError(src, target, f"the file has no layer {gone[0]} of it "
                                           f"({scheme} naming)")
        out[target] = np.stack([per_layer[i] for i in range(trips)]).astype(F32)
    if scheme == "hf" and "cls_token" in tokens and "b_patch" in want and \
            "b_patch" not in out:  # CLIP's patch convolution has no bias: ours is zero
        out["b_patch"] = np.zeros(want["b_patch"].shape, F32)
    if scheme == "hf-vit" or tokens:  # tokens in front ride on zero patch rows: b_patch + pos[i]
        wanted = ("cls_token", "distillation_token")[:prefix_tokens(g)]
        for i, tok in enumerate(wanted):
            got = tokens.get(tok)
            b = out.get("b_patch")
            if got is None or "pos_embed" not in out or b is None or got.shape != b.shape:
                raise ConfigError(src, f"embeddings.{tok}", "missing or not of H values (the "
                                  "class token of a ViT or CLIP; a DeiT's distillation token "
                                  "too)")
            if i == 0:
                out["pos_embed"] = out["pos_embed"].copy()
            out["pos_embed"][i] += got - b
        extra = sorted(set(tokens) - set(wanted))
        if extra:
            raise ConfigError(src, f"embeddings.{extra[0]}", f"model {g.name} has no such "
                              f"token ({g.attr_int('tokens')} tokens: {len(wanted)} in front)")
    for name, value in derived_values(g).items():  # computed, not learned (RoPE tables)
        out.setdefault(name, np.asarray(value, dtype=F32))
    _missing(src, want, out, scheme)
    return out


def prefix_tokens(g: Graph) -> int:
    """Tokens of a patch tower that are not patches (class token; DeiT's
    distillation token too): its tokens less the largest square grid."""
    t = g.attr_int("tokens")
    return t - math.isqrt(t) ** 2


def derived_values(g: Graph) -> dict[str, np.ndarray]:
    """The parameters of `g` that are computed rather than learned (the RoPE
    tables): a checkpoint does not hold them."""
    from planner.ir.reference import _fixed_values

    return {k: v for k, v in _fixed_values(g).items() if k in set(g.parameters)}


def _missing(src: str, want: Mapping[str, Tensor], got: Mapping[str, np.ndarray],
             scheme: str) -> None:
    for p in sorted(want):
        if p not in got:
            raise ConfigError(src, p, f"missing from the file ({scheme} naming), expected "
                                      f"shape {want[p].shape}")


def save_weights(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write `arrays` as `.npz` or `.safetensors` (by suffix), atomically."""
    from tilecommon.files import write_file_atomic

    p = Path(path)
    data = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    if p.suffix == ".safetensors":
        from safetensors.numpy import save

        blob = save(data)
        write_file_atomic(p, lambda f: f.write(blob), "wb")
    elif p.suffix == ".npz":
        write_file_atomic(p, lambda f: np.savez(f, **data), "wb")  # type: ignore[arg-type]
    else:
        raise ConfigError(str(path), "weights", "must be a .npz or .safetensors file")


def to_scheme(g: Graph, params: Mapping[str, np.ndarray], scheme: str
              ) -> dict[str, np.ndarray]:
    """`params` (our names) renamed and reshaped to `scheme`'s checkpoint
    layout: the inverse of `load_weights` (tests and examples write files
    with it)."""
    if scheme == "ours":
        return dict(params)
    names: list[str] = []
    trips = g.attr_int("layers")
    tied = bool(g.attr("tied_embeddings", False))
    if scheme == "hf":
        names += [f"vision_model.{k}" for k, r in _HF_TOP.items() if r.how != "cls"
                  and r is not HOST]
        names += [f"vision_model.{k}" for k in _HF_FUSED]
        names += [f"vision_model.encoder.layers.{i}.{k}" for i in range(trips) for k in _HF_LAYER]
    elif scheme == "hf-vit":
        names += [k for k, r in _VIT_TOP.items() if r.how != "cls"]
        names += [f"encoder.layer.{i}.{k}" for i in range(trips) for k in _VIT_LAYER]
    elif scheme == "hf-bert":
        names += [f"bert.{k}" for k, r in _BERT_TOP.items() if r is not HOST]
        names += [f"bert.encoder.layer.{i}.{k}" for i in range(trips) for k in _BERT_LAYER]
    elif scheme == "hf-decoder":
        names += ["model.norm.weight", "model.embed_tokens.weight" if tied else "lm_head.weight"]
        names += [f"model.layers.{i}.{k}" for i in range(trips) for k in _DEC_LAYER]
    else:
        names += [f"params/img/{k}" for k in _BV_TOP]
        names += [f"params/img/Transformer/encoderblock/{k}" for k in _BV_BLOCK]
    out: dict[str, np.ndarray] = {}
    for name in names:
        short = name.removeprefix("vision_model.")
        if scheme == "hf" and short in _HF_FUSED:
            pre = _HF_FUSED[short]
            if pre + "q" not in params:
                continue
            parts = [params[pre + w] for w in "qkv"]
            out[name] = np.concatenate([p.T if p.ndim == 2 else p for p in parts])
            continue
        hit = rule_for(name, scheme, tied)
        assert hit is not None and hit[0] is not HOST, name
        rule, layer = hit
        target = f"layers.{rule.target}" if rule.layered else rule.target
        if target not in params:
            continue
        a = params[target]
        if rule.layered and layer is not None:
            a = a[layer]
        out[name] = _unconvert(a, rule, g, name)
    if scheme == "hf-vit":  # the first position rows' sums as the class (distillation) token
        pos = out["embeddings.position_embeddings"].copy()
        for i, tok in enumerate(("cls_token", "distillation_token")[:prefix_tokens(g)]):
            out[f"embeddings.{tok}"] = (pos[0, i] + params["b_patch"]).reshape(1, 1, -1)
            pos[0, i] = 0.0
        out["embeddings.position_embeddings"] = pos
    return out


def _unconvert(a: np.ndarray, rule: Rule, g: Graph, name: str) -> np.ndarray:
    if rule.how == "transpose":
        return a.T.copy()
    c = g.attr_int("channels") if rule.how.startswith("conv") else 0  # patch models only
    p = g.attr_int("patch") if rule.how.startswith("conv") else 0
    if rule.how == "conv_oihw":
        return a.T.reshape(a.shape[1], c, p, p).copy()
    if rule.how == "conv_hwio":
        return a.reshape(c, p, p, a.shape[1]).transpose(1, 2, 0, 3).copy()
    shapes: dict[str, Callable[[tuple[int, ...]], tuple[int, ...]]] = {
        "head_probe": lambda s: (1, *s), "pos_embed": lambda s: (1, *s)}
    if rule.how == "reshape" and rule.target in shapes:
        return a.reshape(shapes[rule.target](a.shape))
    return a.copy()
