"""Hugging Face config.json as a model source (planner/ir/hf.py): published
configs map onto the zoo's models field for field and plan to the same
package; bad configs exit 2 naming file and field; one that cannot fit a
chip exits 3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import planner
from planner import PipelineConfig, run_model
from planner.cli import main
from planner.ir.graph import model_parameter_count
from planner.ir.models import load_config
from simulator import load_device

# the published configs (transformers' config.json of each checkpoint, trimmed
# of training-only keys)
SIGLIP_SO400M = {
    "model_type": "siglip",
    "text_config": {"hidden_size": 1152, "intermediate_size": 4304,
                    "model_type": "siglip_text_model", "num_attention_heads": 16,
                    "num_hidden_layers": 27},
    "vision_config": {"hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14}}
BERT_BASE_UNCASED = {
    "architectures": ["BertForMaskedLM"], "hidden_act": "gelu", "hidden_size": 768,
    "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
    "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 12,
    "type_vocab_size": 2, "vocab_size": 30522}
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "vocab_size": 151936}
VIT_BASE = {
    "model_type": "vit", "hidden_act": "gelu", "hidden_size": 768, "image_size": 224,
    "intermediate_size": 3072, "layer_norm_eps": 1e-12, "num_attention_heads": 12,
    "num_channels": 3, "num_hidden_layers": 12, "patch_size": 16, "qkv_bias": True}


def _write(root: Path, name: str, config: dict[str, Any]) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    path = root / name / "config.json"
    path.write_text(json.dumps(config))
    return root / name


def _map_off(config: dict[str, Any]) -> dict[str, Any]:
    return {**config, "vision_config": {**config["vision_config"], "vision_use_head": False}}


@pytest.mark.parametrize("zoo, config", [
    ("siglip-so400m", _map_off(SIGLIP_SO400M)), ("siglip-so400m-map", SIGLIP_SO400M),
    ("bert-base", BERT_BASE_UNCASED), ("qwen2.5-0.5b", QWEN25_05B)])
def test_published_configs_are_the_zoo_models(tmp_path: Path, zoo: str,
                                             config: dict[str, Any]) -> None:
    d = _write(tmp_path, zoo, config)
    assert load_config(d) == load_config(zoo) == load_config(d / "config.json")
    assert model_parameter_count(planner.load_model(d)) == \
        model_parameter_count(planner.load_model(zoo))


@pytest.mark.parametrize("zoo, config", [("siglip-so400m", _map_off(SIGLIP_SO400M)),
                                         ("siglip-so400m-map", SIGLIP_SO400M)])
def test_siglip_config_plans_the_zoo_package(tmp_path: Path, zoo: str,
                                             config: dict[str, Any]) -> None:
    """One layer, the baseline, here; all 27 and 8 steps in the slow test below."""
    d = _write(tmp_path, zoo, config)
    got = [run_model(planner.load_model(src, layers=1), load_device("c600"),
                     PipelineConfig(optimization_steps=0), numerics=False).summary
           for src in (zoo, str(d))]
    assert got[0]["package_hash"] == got[1]["package_hash"]
    assert got[0]["cycles"] == got[1]["cycles"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("zoo, config", [("siglip-so400m", _map_off(SIGLIP_SO400M)),
                                         ("siglip-so400m-map", SIGLIP_SO400M)])
def test_siglip_config_plans_the_zoo_package_27_layers(
        tmp_path: Path, zoo: str, config: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    d = _write(tmp_path, zoo, config)
    got = []
    for src in (zoo, str(d)):
        assert main(["plan", src, "--json", "--quiet"]) == 0
        got.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert got[0]["package_hash"] == got[1]["package_hash"]
    assert got[0]["cycles"] == got[1]["cycles"]


def test_vit_config(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, "vit-base-patch16-224", VIT_BASE))
    assert (cfg.tokens, cfg.patch, cfg.hidden, cfg.layers) == (197, 16, 768, 12)
    assert (cfg.activation, cfg.pool, cfg.eps) == ("gelu_erf", "pooler", 1e-12)
    assert cfg.name == "vit-base-patch16-224"


@pytest.mark.parametrize("config, field, words", [
    ({"model_type": "gpt2"}, "model_type", "supported: ['bert'"),
    ({"model_type": "clip"}, "vision_config", "missing (a clip config's tower)"),
    ({"model_type": "siglip"}, "vision_config", "missing"),
    ({**BERT_BASE_UNCASED, "hidden_act": "relu"}, "hidden_act", "not in"),
    ({k: v for k, v in BERT_BASE_UNCASED.items() if k != "hidden_size"}, "hidden_size",
     "missing"),
    ({**SIGLIP_SO400M, "vision_config": {**SIGLIP_SO400M["vision_config"],
                                         "image_size": 7}}, "vision_config.image_size",
     "at least patch_size"),
    ({**BERT_BASE_UNCASED, "num_attention_heads": 7}, "heads", "divide hidden"),
    ([1, 2], "config", "JSON object")])
def test_bad_configs_exit_2_naming_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], config: Any, field: str,
        words: str) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    assert main(["plan", str(d), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(d / "config.json") in err[0] and f"'{field}'" in err[0]
    assert words in err[0]


def test_not_json_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{not json")
    assert main(["plan", str(tmp_path / "config.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["plan", str(tmp_path / "nowhere" / "config.json")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_a_config_that_cannot_fit_fails_with_tile_stage_bytes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = {**BERT_BASE_UNCASED, "hidden_size": 16384, "num_attention_heads": 128,
            "intermediate_size": 65536, "num_hidden_layers": 2}
    assert main(["plan", str(_write(tmp_path, "huge-bert", huge)), "--quiet"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tile" in err[0] and "need" in err[0], err


# tiny checkpoints: hidden 64, two layers, as a fixture exporter would write them
TINY_BERT = {**BERT_BASE_UNCASED, "hidden_size": 64, "num_attention_heads": 4,
             "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 1000,
             "max_position_embeddings": 160}
TINY_QWEN = {**QWEN25_05B, "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 2,
             "vocab_size": 1000}
TINY_LLAMA = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
              "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "vocab_size": 1000}


def _checkpoint(tmp_path: Path, name: str, config: dict[str, Any], scheme: str,
                extra: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """config.json + model.safetensors in transformers' naming: random raw
    weights through `to_scheme`, plus the tensors a real checkpoint holds that
    are not ours (host tables, buffers, pre-training heads)."""
    import numpy as np

    from planner.ir.weights import derived_values, save_weights, to_scheme

    d = _write(tmp_path, name, config)
    g = planner.load_model(d)
    rng = np.random.default_rng(5)
    derived = derived_values(g)
    raw = {p: (derived[p] if p in derived else
               (rng.standard_normal(g.tensor(p).shape) * 0.05
                + (1.0 if p.endswith("gamma") else 0.0)).astype(np.float32))
           for p in g.parameters}
    save_weights(d / "model.safetensors", {**to_scheme(g, raw, scheme), **extra})
    return d, raw


@pytest.mark.parametrize("name, config, scheme, extra", [
    ("tiny-bert", TINY_BERT, "hf-bert", {
        "bert.embeddings.word_embeddings.weight": "table",
        "bert.embeddings.position_ids": "ids", "cls.predictions.bias": "bias"}),
    ("tiny-qwen", TINY_QWEN, "hf-decoder", {
        "model.layers.0.self_attn.rotary_emb.inv_freq": "bias"}),
    ("tiny-llama", TINY_LLAMA, "hf-decoder", {"model.embed_tokens.weight": "table"})])
def test_transformers_checkpoints_load_and_run(tmp_path: Path, name: str,
                                               config: dict[str, Any], scheme: str,
                                               extra: dict[str, str]) -> None:
    import numpy as np

    from planner.ir.weights import load_weights, scheme_of

    made = {"table": np.ones((1000, 64), np.float32), "ids": np.arange(160)[None],
            "bias": np.zeros(1000, np.float32)}
    d, raw = _checkpoint(tmp_path, name, config, scheme, {k: made[v] for k, v in extra.items()})
    g = planner.load_model(d)
    from safetensors.numpy import load_file

    names = sorted(load_file(str(d / "model.safetensors")))
    assert scheme_of(names, g) == scheme
    loaded = load_weights(g, d / "model.safetensors")
    assert sorted(loaded) == sorted(raw)
    assert all(np.array_equal(loaded[k], raw[k]) for k in raw)
    if config is TINY_QWEN:  # tied: the LM head is the embedding table, transposed
        assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    from planner.pipeline import model_values

    graph, values = model_values(g, str(d / "model.safetensors"))
    device = "tiny" if scheme == "hf-bert" else "c600"  # a 512-token prefill needs the chip
    out = run_model(graph, load_device(device), PipelineConfig(optimization_steps=0),
                    params=values)
    assert out.status == 0 and out.summary["numerics_ok"]
    assert out.summary["cosine_fp32_min"] > 0.99


def test_a_checkpoint_tensor_the_model_lacks_is_named(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    import numpy as np

    d, _ = _checkpoint(tmp_path, "tiny-llama", TINY_LLAMA, "hf-decoder",
                       {"model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)})
    assert main(["plan", str(d), "--weights",
                 str(d / "model.safetensors"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "model.layers.0.self_attn.o_proj.bias" in err and "b_o" in err


def test_inspect_shows_the_imported_graph(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    d = _write(tmp_path, "bert-base", BERT_BASE_UNCASED)
    assert main(["inspect", str(d), "--layers", "2", "--ops", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    g = planner.load_model("bert-base", layers=2)
    assert doc["model"] == "bert-base" and doc["layers"] == 2
    assert doc["parameters"] == model_parameter_count(g)
    # the word embeddings and the position rows past the 128 tokens stay on the host
    assert doc["host_parameters"] == 30522 * 768 + (512 - 128) * 768
    # the pooler's; q, k, v, o, fc1 and fc2 of each layer
    assert doc["ops"]["MatMul"] == {"top": 1, "per_layer": 6, "total": 13}
    per_layer = sum(v["per_layer"] for v in doc["ops"].values())
    assert sum(v["total"] for v in doc["ops"].values()) == len(doc["op_list"]) + per_layer
    assert {t["name"] for t in doc["io"]} == {"embeds", "attention_mask", "out", "pooled"}
    assert sum(v["values"] for v in doc["device_parameters"].values()) + \
        doc["host_parameters"] == doc["parameters"]
    assert main(["inspect", str(d), "--precision", "fp16"]) == 0
    assert "fp8" not in capsys.readouterr().out.split("parameters")[-1]
    assert main(["inspect", str(tmp_path / "none" / "config.json")]) == 2


def test_a_sweep_over_a_checkpoint_directory(tmp_path: Path) -> None:
    """A sweep's model axis takes a config.json directory, relative to the
    sweep file, beside a zoo name."""
    from planner.sweep import load_sweep, run_sweep

    _write(tmp_path, "tiny-bert", TINY_BERT)
    (tmp_path / "s.toml").write_text(
        '[sweep]\nmodel = ["./tiny-bert", "minilm-l6"]\ndevice = ["c600"]\nlayers = [1]\n'
        'optimization_steps = [0]\nnumerics = [false]\n')
    res = run_sweep(load_sweep(tmp_path / "s.toml"), tmp_path / "out", workers=1,
                    progress=False)
    rows = {r["model"]: r for r in res.rows}
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows.values())
    assert 0 < rows[str(tmp_path / "tiny-bert")]["cycles"] < rows["minilm-l6"]["cycles"]
