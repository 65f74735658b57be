"""Hugging Face `config.json` as a model source: the model table of
`planner.ir.models` from a transformers config, so `load_model("dir/")` or
`load_model("dir/config.json")` plans what a checkpoint describes.

`hf_table(path)` maps each supported `model_type` onto the model fields
(module docstring of planner.ir.models); the model's name is the config's
directory name (a checkpoint's repository folder, e.g. `siglip-so400m`).

- `siglip`, `siglip_vision_model` (a ViT tower; the `vision_config` of a full
  `siglip` config): tokens = floor(image_size / patch_size)^2 (a stride-patch
  conv drops a partial patch: 384 / 14 -> 27^2 = 729), `post_layernorm` -> the
  final norm, `vision_use_head` (default true, as transformers) -> the MAP head
  with the precision of the published C600 runs of that tower (fp8 PV
  product, as the zoo's siglip-so400m-map);
- `vit`: tokens = floor(image_size / patch_size)^2 + 1 (the class token enters
  as one more row of the patch input, the template's convention), `qkv_bias`
  (default true), the pooler of `ViTModel` (dense + tanh on the first token);
- `clip`, `clip_vision_model` (CLIP's vision tower; the `vision_config` of a
  full `clip` config): tokens as `vit` (a class token), the patch
  embedding's bias zero (CLIP has none), the pre-layernorm as the embedding
  norm, `hidden_act` (default quick_gelu), the post-layernorm on the first
  token only (pool "first_norm"), beside the hidden states;
- `deit`: as `vit` with one more token, the distillation token (also a zero
  row of the patch input, after the class token's), the pooler of
  `DeiTModel`;
- `bert` (post-LN encoder): token embeddings gathered on the host, learned
  positions (`max_position_embeddings`), token types, embedding norm,
  key-padding mask, the pooler; TEXT_TOKENS tokens (fewer when the
  position table is shorter);
- `qwen2`, `llama`, `mistral` (decoders at prefill): RMSNorm, SwiGLU, causal
  attention, RoPE (`rope_theta`), grouped-query `num_key_value_heads`, q/k/v
  biases for qwen2 (`attention_bias` for llama), tied embeddings as the
  config says, the LM head over the last position (none when `architectures`
  names only the bare model, e.g. LlamaModel); DECODER_TOKENS tokens.

`hidden_act` maps "gelu" → gelu_erf, "gelu_new" / "gelu_pytorch_tanh" /
"gelu_fast" → gelu_tanh, "quick_gelu" → quick_gelu, "silu" / "swish" → the
gated SwiGLU of the decoder family.  Text models have no sequence length
in their config: TEXT_TOKENS for encoders and DECODER_TOKENS for decoders
(the zoo's bert-base and qwen2.5-0.5b), as the zoo models.

Refused with a ConfigError naming the file and field: an unknown
`model_type` (naming the supported ones), an image smaller than a
patch, an activation
outside the list above, a config that is not a JSON object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tilecommon.config import read_document
from tilecommon.errors import ConfigError

# a vision tower with the MAP head, as the published C600 runs ran it (the zoo's
# siglip-so400m-map): the head and an fp8 PV product.  What an imported
# SigLIP tower with a head gets (here and in planner.ir.onnx_import).
MAP_TOWER = {"pool": "map", "pv_dtype": "fp8"}

TEXT_TOKENS = 128  # a BERT-style encoder's sequence (the zoo's bert-base)
DECODER_TOKENS = 512  # a decoder's prefill (the zoo's qwen2.5-0.5b)
GELUS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "gelu_fast": "gelu_tanh", "quick_gelu": "quick_gelu"}
DECODERS = ("qwen2", "llama", "mistral")
SUPPORTED = ("bert", "clip", "clip_vision_model", "deit", "siglip", "siglip_vision_model",
             "vit", *DECODERS)
NOT_YET: dict[str, str] = {}


def is_hf_source(path: Path) -> bool:
    """True for a `config.json` path or a directory holding one."""
    return path.name == "config.json" or (path.is_dir() and (path / "config.json").is_file())


def read_config(path: Path) -> tuple[dict[str, Any], Path]:
    """The JSON object of `path` (a config.json or its directory) and the file."""
    file = path / "config.json" if path.is_dir() else path
    if not file.exists():
        raise ConfigError(str(file), "model", "file not found")
    data = read_document(file, "model", "json")
    if not isinstance(data, dict):
        raise ConfigError(str(file), "config", "must be a JSON object", type(data).__name__)
    return data, file


class _Fields:
    """Reads config fields, naming the file and field when one is missing."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = "") -> None:
        self.data, self.source, self.prefix = data, source, prefix

    def need(self, key: str) -> Any:
        if key not in self.data:
            raise ConfigError(self.source, self.prefix + key, "missing")
        return self.data[key]

    def get(self, key: str, default: Any) -> Any:
        return self.data.get(key, default)

    def act(self, key: str = "hidden_act", default: str = "gelu") -> str:
        value = self.get(key, default)
        if value not in GELUS:
            raise ConfigError(self.source, self.prefix + key,
                              f"activation not in {sorted(GELUS)}", value)
        return GELUS[value]

    def grid(self) -> int:
        image, patch = self.need("image_size"), self.need("patch_size")
        if isinstance(patch, bool) or not isinstance(patch, int) or patch < 1:
            raise ConfigError(self.source, self.prefix + "patch_size",
                              "must be a positive integer", patch)
        if isinstance(image, bool) or not isinstance(image, int) or image < patch:
            raise ConfigError(self.source, self.prefix + "image_size",
                              f"must be an integer of at least patch_size ({patch})", image)
        return (image // patch) ** 2  # a valid-padding conv: the last partial patch drops


def hf_table(path: str | Path) -> tuple[dict[str, Any], str]:
    """The model table (planner.ir.models fields) of a Hugging Face config and
    the source to name in errors (module docstring)."""
    data, file = read_config(Path(path))
    source = str(file)
    kind = data.get("model_type")
    if kind in NOT_YET:
        raise ConfigError(source, "model_type", f"not supported yet: {NOT_YET[kind]}", kind)
    if kind not in SUPPORTED:
        raise ConfigError(source, "model_type", f"unknown; supported: {list(SUPPORTED)}", kind)
    name = file.parent.name or "model"
    f = _Fields(data, source)
    if kind in ("siglip", "clip"):
        if not isinstance(data.get("vision_config"), dict):
            raise ConfigError(source, "vision_config", f"missing (a {kind} config's tower)")
        f = _Fields(data["vision_config"], source, "vision_config.")
    if kind in ("siglip", "siglip_vision_model"):
        table = {"hidden": f.need("hidden_size"), "heads": f.need("num_attention_heads"),
                 "mlp": f.need("intermediate_size"), "layers": f.need("num_hidden_layers"),
                 "patch": f.need("patch_size"), "channels": f.get("num_channels", 3),
                 "tokens": f.grid(), "eps": float(f.get("layer_norm_eps", 1e-6)),
                 "activation": f.act(default="gelu_pytorch_tanh")}
        if f.get("vision_use_head", True):
            table.update(MAP_TOWER)
    elif kind in ("clip", "clip_vision_model"):
        # CLIP's tower: class token, no patch bias, pre-layernorm, quick GELU, and its
        # post-layernorm on the first token only (CLIPVisionModel's pooler_output)
        table = {"hidden": f.need("hidden_size"), "heads": f.need("num_attention_heads"),
                 "mlp": f.need("intermediate_size"), "layers": f.need("num_hidden_layers"),
                 "patch": f.need("patch_size"), "channels": f.get("num_channels", 3),
                 "tokens": f.grid() + 1, "eps": float(f.get("layer_norm_eps", 1e-5)),
                 "activation": f.act(default="quick_gelu"), "pool": "first_norm",
                 "embed_norm": True, "final_norm": False}
    elif kind in ("vit", "deit"):  # DeiT: a distillation token after the class token
        table = {"hidden": f.need("hidden_size"), "heads": f.need("num_attention_heads"),
                 "mlp": f.need("intermediate_size"), "layers": f.need("num_hidden_layers"),
                 "patch": f.need("patch_size"), "channels": f.get("num_channels", 3),
                 "tokens": f.grid() + (2 if kind == "deit" else 1),
                 "eps": float(f.get("layer_norm_eps", 1e-12)),
                 "activation": f.act(), "pool": "pooler",
                 "bias": "all" if f.get("qkv_bias", True) else "none"}
    elif kind == "bert":
        table = {"input": "embeddings", "hidden": f.need("hidden_size"),
                 "heads": f.need("num_attention_heads"), "mlp": f.need("intermediate_size"),
                 "layers": f.need("num_hidden_layers"),
                 "tokens": min(TEXT_TOKENS, f.get("max_position_embeddings", 512)),
                 "eps": float(f.get("layer_norm_eps", 1e-12)), "block": "post_ln",
                 "activation": f.act(), "max_positions": f.get("max_position_embeddings", 512),
                 "type_vocab": f.get("type_vocab_size", 2), "embed_norm": True,
                 "final_norm": False, "attention_mask": True, "pool": "pooler",
                 "vocab": f.need("vocab_size")}
    else:  # decoders
        act = f.get("hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise ConfigError(source, "hidden_act", "a decoder's MLP must be gated SiLU "
                                                    "(silu)", act)
        heads = f.need("num_attention_heads")
        biased = kind == "qwen2" or bool(f.get("attention_bias", False))
        # a checkpoint of the bare model (LlamaModel, Qwen2Model) has no LM head
        arch = [a for a in data.get("architectures") or [] if isinstance(a, str)]
        bare = bool(arch) and all(a.endswith("Model") for a in arch)
        table = {"input": "embeddings", "hidden": f.need("hidden_size"), "heads": heads,
                 "mlp": f.need("intermediate_size"), "layers": f.need("num_hidden_layers"),
                 "tokens": DECODER_TOKENS, "eps": float(f.get("rms_norm_eps", 1e-6)),
                 "norm": "rmsnorm", "activation": "swiglu", "attention": "causal",
                 "rope_theta": float(f.get("rope_theta", 10000.0)),
                 "bias": "qkv" if biased else "none", "pool": "none" if bare else "last",
                 "vocab": f.need("vocab_size"),
                 "tied_embeddings": not bare and bool(f.get("tie_word_embeddings", False))}
        kv = f.get("num_key_value_heads", None) or heads
        if kv != heads:
            table["kv_heads"] = kv
    return {"name": name, **table}, source
