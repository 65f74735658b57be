"""ONNX files as model sources (planner/ir/onnx_import.py), on the committed
fixtures of experiments/export_fixtures.py (a tiny random BERT, ViT, DeiT, CLIP
and SigLIP tower, with and without its MAP head, exported by PyTorch's
TorchScript and dynamo exporters): the recognised model and weights equal
the checkpoint's, runs agree with onnxruntime, and bad files exit 2 naming
file or node."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import planner
from planner.cli import main
from planner.ir.onnx_import import onnx_model
from planner.ir.weights import load_weights

FIXTURE = Path(__file__).parent / "fixtures" / "models" / "tiny-bert"
VIT = FIXTURE.parent / "tiny-vit"
SIGLIP = FIXTURE.parent / "tiny-siglip"
LLAMA = FIXTURE.parent / "tiny-llama"
QWEN = FIXTURE.parent / "tiny-qwen2"
DEIT = FIXTURE.parent / "tiny-deit"
CLIP = FIXTURE.parent / "tiny-clip"
SIGLIP_MAP = FIXTURE.parent / "tiny-siglip-map"
VIT14 = FIXTURE.parent / "tiny-vit-opset14"  # LayerNorm decomposed (TorchScript, opset 14)
BERT14 = FIXTURE.parent / "tiny-bert-opset14"
EXPORTERS = ("torchscript", "dynamo")


def _onnx(exporter: str, fixture: Path = FIXTURE) -> Path:
    return fixture / f"model.{exporter}.onnx"


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_import_is_the_checkpoint(exporter: str) -> None:
    m = onnx_model(_onnx(exporter))
    hf = planner.ir.models.load_config(FIXTURE)
    assert (m.table["hidden"], m.table["heads"], m.table["mlp"], m.table["layers"]) == (
        hf.hidden, hf.heads, hf.mlp, hf.layers)
    assert (m.table["activation"], m.table["block"], m.table["pool"], m.table["eps"]) == (
        hf.activation, hf.block, hf.pool, hf.eps)
    assert m.table["tokens"] == 32 and m.table["attention_mask"]
    g = planner.load_model(FIXTURE, tokens=32)
    ckpt = load_weights(g, FIXTURE / "model.safetensors")
    assert sorted(ckpt) == sorted(m.weights)
    for k, v in ckpt.items():
        mine = m.weights[k]
        if k == "pos_embed":  # the dynamo exporter folds the 32 rows it reads
            v = v[:mine.shape[0]]
        assert np.array_equal(v, mine), k
    # every recognised part names its nodes; every layer has all of them
    assert {r for r in m.provenance if r.startswith("layer 1")} == {
        f"layer 1 {p}" for p in ("q", "k", "v", "attention", "o", "ln1", "fc1", "gelu_erf",
                                 "fc2", "ln2")}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_vit_import_is_the_checkpoint(exporter: str) -> None:
    from safetensors.numpy import load_file

    m = onnx_model(_onnx(exporter, VIT))
    hf = planner.ir.models.load_config(VIT)
    assert {k: v for k, v in m.table.items() if k != "name"} == {
        "hidden": hf.hidden, "heads": hf.heads, "mlp": hf.mlp, "tokens": hf.tokens,
        "layers": hf.layers, "eps": hf.eps, "activation": hf.activation,
        "attention_mask": False, "pool": hf.pool, "patch": hf.patch, "channels": hf.channels}
    ckpt = load_file(str(VIT / "model.safetensors"))
    pos = ckpt["embeddings.position_embeddings"][0]
    cls = ckpt["embeddings.cls_token"].reshape(-1)
    b = ckpt["embeddings.patch_embeddings.projection.bias"]
    assert np.array_equal(m.weights["pos_embed"][1:], pos[1:])
    # the class token rides on a zero patch row: its embedding is b + pos[0]
    assert np.allclose(m.weights["pos_embed"][0] + b, cls + pos[0], atol=1e-6)
    assert np.array_equal(m.weights["layers.w_q"][1],
                          ckpt["encoder.layer.1.attention.attention.query.weight"].T)
    assert np.array_equal(m.weights["ln_f.gamma"], ckpt["layernorm.weight"])
    # the same cycles as the tower its config.json describes
    assert planner.load_model(VIT).attrs == planner.load_model(_onnx(exporter, VIT)).attrs


@pytest.mark.parametrize("fixture, exporter", [
    (FIXTURE, "torchscript"), (FIXTURE, "dynamo"), (VIT, "torchscript"), (VIT, "dynamo"),
    (SIGLIP, "torchscript"), (SIGLIP, "dynamo"), (LLAMA, "dynamo"), (QWEN, "dynamo"),
    (DEIT, "torchscript"), (DEIT, "dynamo"), (CLIP, "torchscript"), (CLIP, "dynamo"),
    (SIGLIP_MAP, "torchscript"), (SIGLIP_MAP, "dynamo"), (VIT14, "torchscript"),
    (BERT14, "torchscript")],
    ids=["bert-ts", "bert-dynamo", "vit-ts", "vit-dynamo", "siglip-ts", "siglip-dynamo",
         "llama-dynamo", "qwen2-dynamo", "deit-ts", "deit-dynamo", "clip-ts", "clip-dynamo",
         "siglip-map-ts", "siglip-map-dynamo", "vit-opset14-ts", "bert-opset14-ts"])
@pytest.mark.parametrize("precision, floor", [("fp16", 0.999), ("fp8", 0.99)])
def test_runs_agree_with_onnxruntime(fixture: Path, exporter: str, precision: str,
                                     floor: float, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(_onnx(exporter, fixture)), "--device", "tiny", "--precision",
                 precision, "--optimization-steps", "1", "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["numerics_ok"] and s["precision"] == precision
    assert s["ort_cosine_min"] >= floor
    # fp8: a MAP tower's output is one pooled token per image, after an fp8
    # head on top of the fp8 tower: its error is not averaged over tokens
    fp8_bound = 0.15 if fixture == SIGLIP_MAP else 0.1
    assert 0 < s["ort_rel_error"] < (fp8_bound if precision == "fp8" else 0.01)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_deit_import_is_the_checkpoint(exporter: str) -> None:
    """DeiT: the class and the distillation token each ride on a zero patch
    row in front (pos[0], pos[1]); the ONNX file and DeiTModel's checkpoint
    give the same weights and table."""
    from safetensors.numpy import load_file

    m = onnx_model(_onnx(exporter, DEIT))
    g = planner.load_model(DEIT)
    assert m.table["tokens"] == g.attr_int("tokens") == 16 + 2
    ckpt = load_weights(g, DEIT / "model.safetensors")
    assert sorted(ckpt) == sorted(m.weights)
    for k, v in ckpt.items():
        assert np.allclose(v, m.weights[k], atol=1e-6), k
    raw = load_file(str(DEIT / "model.safetensors"))
    pos = raw["embeddings.position_embeddings"][0]
    b = raw["embeddings.patch_embeddings.projection.bias"]
    for i, tok in enumerate(("cls_token", "distillation_token")):
        token = raw[f"embeddings.{tok}"].reshape(-1)
        assert np.allclose(m.weights["pos_embed"][i] + b, token + pos[i], atol=1e-6), tok
    assert np.array_equal(m.weights["pos_embed"][2:], pos[2:])


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_clip_import_is_the_checkpoint(exporter: str) -> None:
    """CLIP's tower: a zero patch bias, the pre-layernorm as the embedding norm,
    quick GELU, the post-layernorm on the first token only, beside the
    hidden states; the ONNX file and CLIPVisionModel's checkpoint agree."""
    from safetensors.numpy import load_file

    m = onnx_model(_onnx(exporter, CLIP))
    g = planner.load_model(CLIP)
    cfg = planner.ir.models.load_config(CLIP)
    assert (cfg.pool, cfg.embed_norm, cfg.final_norm, cfg.activation) == (
        "first_norm", True, False, "quick_gelu")
    assert {k: m.table[k] for k in ("pool", "embed_norm", "final_norm", "activation",
                                    "tokens")} == {
        "pool": "first_norm", "embed_norm": True, "final_norm": False,
        "activation": "quick_gelu", "tokens": 17}
    assert g.outputs == ("out", "pooled")
    ckpt = load_weights(g, CLIP / "model.safetensors")
    assert sorted(ckpt) == sorted(m.weights)
    for k, v in ckpt.items():
        assert np.allclose(v, m.weights[k], atol=1e-6), k
    raw = load_file(str(CLIP / "model.safetensors"))
    assert np.allclose(ckpt["pos_embed"][0], raw["embeddings.position_embedding.weight"][0]
                       + raw["embeddings.class_embedding"], atol=1e-6)
    assert not ckpt["b_patch"].any()  # CLIP has no patch bias: ours is zero
    assert np.array_equal(ckpt["embed_ln.gamma"], raw["pre_layrnorm.weight"])
    assert np.array_equal(ckpt["ln_f.gamma"], raw["post_layernorm.weight"])


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_map_head_import_is_the_checkpoint(exporter: str) -> None:
    """SigLIP's MAP head as `nn.MultiheadAttention` exports it: the probe
    (Expand / Tile over the batch, or a folded constant), q from the
    in-projection's first rows, k and v from one packed [H, 2H] MatMul split
    by Gathers (TorchScript: the pieces folded into constants; dynamo: a
    Split of `in_proj_weight`), out_proj, the head's LayerNorm and MLP, the
    residual, token 0.  The file's hidden states are not ours (a MAP
    tower's output is the pooled token): only the pooled output is compared."""
    from safetensors.numpy import load_file

    from planner.ir.onnx_reference import our_outputs

    m = onnx_model(_onnx(exporter, SIGLIP_MAP))
    g = planner.load_model(SIGLIP_MAP)
    assert (m.table["pool"], m.table["pv_dtype"]) == ("map", "fp8")
    assert m.output_roles == ("hidden", "pooled")
    assert our_outputs(m, g) == [None, "out"]
    ckpt = load_weights(g, SIGLIP_MAP / "model.safetensors")
    assert sorted(ckpt) == sorted(m.weights)
    for k, v in ckpt.items():
        assert np.allclose(v, m.weights[k], atol=1e-6), k
    raw = load_file(str(SIGLIP_MAP / "model.safetensors"))
    w = raw["head.attention.in_proj_weight"]
    h = w.shape[1]
    for i, part in enumerate("qkv"):  # rows q, k, v of the in-projection, transposed
        assert np.array_equal(m.weights[f"w_head_{part}"], w[i * h:(i + 1) * h].T), part
    assert np.array_equal(m.weights["head_probe"], raw["head.probe"].reshape(1, h))
    assert {r for r in m.provenance} >= {"head attention", "head mlp"}


def test_the_decomposed_layernorm_import_is_the_checkpoint() -> None:
    """Below opset 17 the TorchScript exporter writes LayerNorm as ReduceMean,
    Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta: every
    norm of the opset-14 ViT is recognised, with the checkpoint's weights."""
    import onnx

    path = _onnx("torchscript", VIT14)
    model = onnx.load(str(path))
    assert model.opset_import[0].version == 14
    kinds = [n.op_type for n in model.graph.node]
    assert "LayerNormalization" not in kinds and kinds.count("ReduceMean") == 2 * 5
    m = onnx_model(path)
    ckpt = load_weights(planner.load_model(VIT14), VIT14 / "model.safetensors")
    assert sorted(ckpt) == sorted(m.weights)
    for k, v in ckpt.items():
        assert np.allclose(v, m.weights[k], atol=1e-6), k
    assert m.table["eps"] == 1e-12 and len(m.provenance["ln_f"]) == 9


def test_the_decomposed_layernorms_of_a_post_ln_encoder(
        capsys: pytest.CaptureFixture[str]) -> None:
    """BERT at opset 14: the embedding norm and each block's two post-LN norms
    decomposed; the weights are the checkpoint's and the file plans to its
    checkpoint's package."""
    path = _onnx("torchscript", BERT14)
    m = onnx_model(path)
    assert m.op_types["ReduceMean"] == 2 * 5 and "LayerNormalization" not in m.op_types
    g = planner.load_model(BERT14, tokens=32)
    ckpt = load_weights(g, BERT14 / "model.safetensors")
    assert sorted(ckpt) == sorted(m.weights)
    for k, v in ckpt.items():
        assert np.allclose(v, m.weights[k], atol=1e-6), k
    got = []
    for argv in ([str(path)], [str(BERT14), "--tokens", "32", "--weights",
                               str(BERT14 / "model.safetensors")]):
        assert main(["plan", *argv, "--device", "tiny", "--json", "--quiet"]) == 0
        got.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert got[0]["package_hash"] == got[1]["package_hash"]


def test_onnx_and_checkpoint_plan_alike(capsys: pytest.CaptureFixture[str]) -> None:
    """Both exports and config.json + model.safetensors: one package.  The
    dynamo export folds the 32 position rows it reads into a constant, the
    TorchScript one gathers them from the 64-row table, the checkpoint holds
    the table: the device gets the 32 rows each time (the others stay on
    the host)."""
    got = []
    for argv in ([str(_onnx("torchscript"))], [str(_onnx("dynamo"))],
                 [str(FIXTURE), "--tokens", "32", "--weights",
                  str(FIXTURE / "model.safetensors")]):
        assert main(["plan", *argv, "--device", "tiny", "--json", "--quiet"]) == 0
        got.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert got[0]["package_hash"] == got[1]["package_hash"] == got[2]["package_hash"]
    assert got[0]["cycles"] == got[1]["cycles"] == got[2]["cycles"] > 0


@pytest.mark.parametrize("fixture, exporter", [
    (VIT, "torchscript"), (VIT, "dynamo"), (SIGLIP, "torchscript"), (SIGLIP, "dynamo"),
    (LLAMA, "dynamo"), (QWEN, "dynamo"), (DEIT, "torchscript"), (DEIT, "dynamo"),
    (CLIP, "torchscript"), (CLIP, "dynamo"), (SIGLIP_MAP, "torchscript"),
    (SIGLIP_MAP, "dynamo"), (VIT14, "torchscript")],
    ids=["vit-ts", "vit-dynamo", "siglip-ts", "siglip-dynamo", "llama-dynamo", "qwen2-dynamo",
         "deit-ts", "deit-dynamo", "clip-ts", "clip-dynamo", "siglip-map-ts",
         "siglip-map-dynamo", "vit-opset14-ts"])
def test_onnx_and_checkpoint_plan_alike_too(fixture: Path, exporter: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A ViT, a SigLIP tower without its head and a Llama-style decoder:
    each export and config.json + model.safetensors (ViTModel's names, the
    class token folded into the first position row; SiglipVisionModel's; a
    bare LlamaModel's, at the export's 32 tokens) give one package."""
    got = []
    tokens = ["--tokens", "32"] if fixture in (LLAMA, QWEN) else []
    for argv in ([str(_onnx(exporter, fixture))],
                 [str(fixture), *tokens, "--weights", str(fixture / "model.safetensors")]):
        assert main(["plan", *argv, "--device", "tiny", "--json", "--quiet"]) == 0
        got.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert got[0]["package_hash"] == got[1]["package_hash"]
    assert got[0]["cycles"] == got[1]["cycles"] > 0


def _edited(tmp_path: Path, edit: str) -> Path:
    import onnx

    model = onnx.load(str(_onnx("torchscript")))
    nodes = model.graph.node
    if edit == "uncovered":  # the first layer's Erf becomes a Sin
        next(n for n in nodes if n.op_type == "Erf").op_type = "Sin"
    elif edit == "dangling":
        next(n for n in nodes if n.op_type == "Softmax").input[0] = "nowhere"
    elif edit == "no-ids":
        model.graph.input[0].name = "pixel_values"
        for n in nodes:
            for i, x in enumerate(n.input):
                if x == "input_ids":
                    n.input[i] = "pixel_values"
    path = tmp_path / f"{edit}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("kind, words", [
    ("truncated", "not an ONNX model"), ("text", "not an ONNX model"),
    ("dangling", "does not check"), ("uncovered", "'node /model/encoder/layer.0/"),
    ("no-ids", "neither a token embedding")])
def test_bad_files_exit_2_naming_file_or_node(tmp_path: Path, kind: str, words: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    if kind == "truncated":
        path = tmp_path / "t.onnx"
        path.write_bytes(_onnx("torchscript").read_bytes()[:5000])
    elif kind == "text":
        path = tmp_path / "x.onnx"
        path.write_text("hello, not a protobuf\n")
    else:
        path = _edited(tmp_path, kind)
    assert main(["plan", str(path), "--device", "tiny", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and words in err[0], err
    if kind == "uncovered":
        assert "Sin: expected the GELU" in err[0]


def test_inspect_names_the_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(_onnx("torchscript")), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["onnx"]["op_types"]["LayerNormalization"] == 5
    assert doc["onnx"]["provenance"]["layer 0 q"][0] == \
        "/model/encoder/layer.0/attention/self/query/MatMul"
    assert doc["layers"] == 2 and doc["fields"]["tokens"] == 32


def test_a_file_lists_the_op_types_no_pattern_handles(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Recognition that stops says where, and every op type in the file no
    pattern handles (here one Reciprocal of an RMSNorm made an Exp)."""
    import onnx

    model = onnx.load(str(_onnx("dynamo", LLAMA)))
    next(n for n in model.graph.node if n.op_type == "Reciprocal").op_type = "Exp"
    path = tmp_path / "exp.onnx"
    onnx.save(model, str(path))
    assert main(["plan", str(path), "--device", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0]
    assert err[0].endswith("op types no pattern handles: {'Exp': 1}"), err[0]


def test_the_decoder_import(capsys: pytest.CaptureFixture[str]) -> None:
    """RMSNorm, RoPE (base recovered from the tables), grouped-query k/v
    (2 heads for 4), the causal mask constant and the SwiGLU MLP."""
    m = onnx_model(_onnx("dynamo", LLAMA))
    assert {k: m.table[k] for k in ("norm", "activation", "attention", "rope_theta",
                                     "kv_heads", "bias", "pool")} == {
        "norm": "rmsnorm", "activation": "swiglu", "attention": "causal",
        "rope_theta": 10000.0, "kv_heads": 2, "bias": "none", "pool": "none"}
    assert m.weights["layers.w_k"].shape == (2, 64, 32)
    qwen = onnx_model(_onnx("dynamo", QWEN))  # Qwen2: q/k/v biases only, base 1e6
    assert (qwen.table["bias"], qwen.table["rope_theta"]) == ("qkv", 1e6)
    assert "layers.b_q" in qwen.weights and "layers.b_o" not in qwen.weights
    assert sorted(r for r in m.provenance if r.startswith("layer 0")) == sorted(
        f"layer 0 {p}" for p in ("q", "k", "v", "attention", "o", "ln1", "gate, up",
                                 "swiglu", "down", "ln2"))
