"""Export the ONNX and Hugging Face fixtures under tests/fixtures/models/.

Not run in CI: it needs torch and transformers, which tileplan never imports.
Measured with torch 2.13.0+cpu and transformers 5.25 (install them in a venv
of their own: `python -m venv /tmp/fx && /tmp/fx/bin/pip install torch
transformers onnx onnxscript safetensors`), then from the repository root:

    /tmp/fx/bin/python experiments/export_fixtures.py [NAME ...]

(names: the fixture directories to write, e.g. tiny-deit; none: all of them).

Each fixture is a tiny random-weight model (hidden 64, 2 layers: a BERT with
SEQUENCE tokens, a ViT, a DeiT (class and distillation tokens), a CLIP vision
tower, a SigLIP tower without its MAP head and one with it (tiny-siglip-map)
on 32x32 images in 8x8 patches, a model that is none of the templates
(tiny-dag: branches, RMSNorm, SwiGLU, a Softmax head; ONNX only), and
a ViT and a BERT exported at opset 14 (tiny-vit-opset14, tiny-bert-opset14:
TorchScript only, LayerNorm decomposed into ReduceMean, Sub, Pow, ... as the
exporter writes it below 17),
Llama- and Qwen2-style decoders with grouped-query attention, Qwen2's with
q/k/v biases) written as a
checkpoint directory: `config.json` + `model.safetensors` (transformers'
`save_pretrained`) and one ONNX file per exporter that works on it,
`model.torchscript.onnx` (the TorchScript-based exporter, opset 17) and
`model.dynamo.onnx` (the torch.export-based one, opset 18).  The inputs are
static: batch 1, SEQUENCE tokens.  transformers' models take keyword inputs,
which the TorchScript exporter passes wrongly ("multiple values for argument
'use_cache'"), so each model is wrapped in a module that calls it with
keywords.
"""

from __future__ import annotations

import sys
from pathlib import Path

SEQUENCE = 32
ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "models"


EXPORTERS = (("torchscript", False, 17), ("dynamo", True, 18))


def export(model: object, example: tuple[object, ...], names: list[str], out: Path,
           outputs: tuple[str, ...] = ("last_hidden_state", "pooler_output"),
           exporters: tuple[tuple[str, bool, int], ...] = EXPORTERS) -> None:
    """`model` (a transformers model taking the keyword inputs `names`) as
    out/config.json + model.safetensors and one ONNX file per exporter
    (name, dynamo or not, opset), whose outputs are the model output's
    fields `outputs`."""
    import onnx
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(**dict(zip(names, args, strict=True)))
            return tuple(getattr(out, o) for o in outputs)

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # type: ignore[attr-defined]
    for exporter, dynamo, opset in exporters:
        path = out / f"model.{exporter}.onnx"
        try:
            torch.onnx.export(Wrapped(model), example, str(path), input_names=names,  # type: ignore[arg-type]
                              output_names=list(outputs),
                              opset_version=opset, dynamo=dynamo)
        except Exception as e:  # an exporter that cannot export this model: say so
            print(f"{path}: {exporter} exporter failed: {str(e).splitlines()[0]}",
                  file=sys.stderr)
            continue
        whole = onnx.load(str(path))  # external data (the dynamo exporter's) inline:
        onnx.save(whole, str(path), save_as_external_data=False)  # one file per exporter
        Path(str(path) + ".data").unlink(missing_ok=True)
        print(f"{path}: {path.stat().st_size:,} bytes")


def tiny_dag() -> object:
    """A model that is none of the templates (a DAG import: planner.ir.onnx_dag):
    two branches off one LayerNorm (a GELU MLP and a plain linear) added to
    the input, an RMSNorm, a SwiGLU MLP as a residual, then tanh, a linear
    head and a Softmax over its 10 classes; outputs the probabilities and
    the hidden states."""
    import torch

    class TinyDag(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            lin = torch.nn.Linear
            self.ln = torch.nn.LayerNorm(64)
            self.a, self.b, self.c = lin(64, 128), lin(128, 64), lin(64, 64)
            self.rms = torch.nn.Parameter(torch.ones(64))
            self.gate, self.up, self.down = lin(64, 96), lin(64, 96), lin(96, 64)
            self.head = lin(64, 10)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.ln(x)
            y = x + self.b(torch.nn.functional.gelu(self.a(h))) + self.c(h)
            z = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms
            y = y + self.down(torch.nn.functional.silu(self.gate(z)) * self.up(z))
            return torch.softmax(self.head(torch.tanh(y)), -1), y

    return TinyDag().eval()


def export_dag(out: Path) -> None:
    """tiny_dag's ONNX files, one per exporter (no checkpoint: it is no
    transformers model, the files' initializers are its weights)."""
    import onnx
    import torch

    torch.manual_seed(2)
    model = perturbed(tiny_dag())
    out.mkdir(parents=True, exist_ok=True)
    for exporter, dynamo, opset in (("torchscript", False, 17), ("dynamo", True, 18)):
        path = out / f"model.{exporter}.onnx"
        torch.onnx.export(model, (torch.randn(1, 16, 64),), str(path),  # type: ignore[arg-type]
                          input_names=["x"], output_names=["probs", "hidden"],
                          opset_version=opset, dynamo=dynamo)
        whole = onnx.load(str(path))
        onnx.save(whole, str(path), save_as_external_data=False)
        Path(str(path) + ".data").unlink(missing_ok=True)
        print(f"{path}: {path.stat().st_size:,} bytes")


def perturbed(model: object) -> object:
    """`model` with 0.02-std noise on every parameter: transformers
    initialises biases, class and distillation tokens and norm scales to
    constants (zeros, ones), which a wrong import would not show."""
    import torch

    with torch.no_grad():
        for p in model.parameters():  # type: ignore[attr-defined]
            p.add_(torch.randn_like(p) * 0.02)
    return model


def main(names: list[str]) -> None:
    import torch
    from transformers import (
        BertConfig,
        BertModel,
        CLIPVisionConfig,
        CLIPVisionModel,
        DeiTConfig,
        DeiTModel,
        LlamaConfig,
        LlamaModel,
        Qwen2Config,
        Qwen2Model,
        SiglipVisionConfig,
        SiglipVisionModel,
        ViTConfig,
        ViTModel,
    )

    def wanted(name: str) -> bool:
        return not names or name in names

    if wanted("tiny-deit") or wanted("tiny-clip") or wanted("tiny-siglip-map"):
        torch.manual_seed(1)
        image = (torch.randn(1, 3, 32, 32),)
        if wanted("tiny-siglip-map"):
            head = SiglipVisionModel(SiglipVisionConfig(
                hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, image_size=32, patch_size=8,
                vision_use_head=True)).eval()
            export(perturbed(head), image, ["pixel_values"], ROOT / "tiny-siglip-map")
        if wanted("tiny-deit"):
            deit = DeiTModel(DeiTConfig(hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=128,
                                        image_size=32, patch_size=8)).eval()
            export(perturbed(deit), image, ["pixel_values"], ROOT / "tiny-deit")
        if wanted("tiny-clip"):
            clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=64, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=128,
                                                    image_size=32, patch_size=8)).eval()
            export(perturbed(clip), image, ["pixel_values"], ROOT / "tiny-clip")
    if wanted("tiny-vit-opset14"):  # LayerNorm decomposed (no LayerNormalization before 17)
        torch.manual_seed(3)
        vit14 = ViTModel(ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, image_size=32, patch_size=8)).eval()
        export(perturbed(vit14), (torch.randn(1, 3, 32, 32),), ["pixel_values"],
               ROOT / "tiny-vit-opset14", exporters=(("torchscript", False, 14),))
    if wanted("tiny-bert-opset14"):  # a post-LN encoder's decomposed LayerNorms
        torch.manual_seed(4)
        bert14 = BertModel(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=128,
                                      max_position_embeddings=64)).eval()
        ids14 = torch.randint(0, 1000, (1, SEQUENCE))
        export(perturbed(bert14), (ids14, torch.ones(1, SEQUENCE, dtype=torch.long)),
               ["input_ids", "attention_mask"], ROOT / "tiny-bert-opset14",
               exporters=(("torchscript", False, 14),))
    if wanted("tiny-dag"):
        export_dag(ROOT / "tiny-dag")
    if names and not {"tiny-bert", "tiny-vit", "tiny-siglip", "tiny-llama",
                      "tiny-qwen2"} & set(names):
        return
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=128,
                                max_position_embeddings=64)).eval()
    ids = torch.randint(0, 1000, (1, SEQUENCE))
    export(bert, (ids, torch.ones(1, SEQUENCE, dtype=torch.long)),
           ["input_ids", "attention_mask"], ROOT / "tiny-bert")
    vit = ViTModel(ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, image_size=32, patch_size=8)).eval()
    export(vit, (torch.randn(1, 3, 32, 32),), ["pixel_values"], ROOT / "tiny-vit")
    siglip = SiglipVisionModel(SiglipVisionConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, vision_use_head=False)).eval()
    export(siglip, (torch.randn(1, 3, 32, 32),), ["pixel_values"], ROOT / "tiny-siglip",
           ("last_hidden_state",))
    llama = LlamaModel(LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, max_position_embeddings=64)).eval()
    export(llama, (ids,), ["input_ids"], ROOT / "tiny-llama", ("last_hidden_state",))
    qwen = Qwen2Model(Qwen2Config(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  intermediate_size=128, max_position_embeddings=64,
                                  rope_theta=1000000.0)).eval()
    with torch.no_grad():  # transformers initialises biases to zero: make them count
        for layer in qwen.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                         layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.02)
    export(qwen, (ids,), ["input_ids"], ROOT / "tiny-qwen2", ("last_hidden_state",))


if __name__ == "__main__":
    main(sys.argv[1:])
