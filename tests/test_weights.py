"""Weights from files (planner.ir.weights), fp8 scales from data
(planner.ir.scales) and `tileplan run --weights/--scales`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import planner
import simulator
from planner.cli import main
from planner.ir.reference import init_inputs, init_params, reference
from planner.ir.scales import data_scales, exponent_for, quantize_params
from planner.ir.weights import load_weights, save_weights, to_scheme
from planner.pipeline import model_values, run_model
from planner.search.incumbent import PipelineConfig
from simulator.device import load_device
from tilecommon.errors import ConfigError

MICRO = (Path(planner.__file__).parent / "ir" / "zoo" / "vit-micro.toml").read_text()


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(MICRO.replace('name = "vit-micro"', 'name = "m"')
                    + 'pool = "map"\npv_dtype = "fp8"\n')
    return path


def _raw(g: planner.Graph, seed: int, std_scale: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p: (rng.standard_normal(g.tensor(p).shape) * 0.02 * std_scale
                + (1.0 if p.endswith("gamma") else 0.0)).astype(np.float32)
            for p in g.parameters}


def test_exponent_for() -> None:
    assert exponent_for(448.0) == 0 and exponent_for(449.0) == 1
    assert exponent_for(1.0) == -8  # 256 <= 448 < 512
    assert exponent_for(1.0, headroom_bits=1) == -7
    assert exponent_for(0.0) == 0 and exponent_for(float("nan")) == 0


@pytest.mark.parametrize("scheme, suffix", [("ours", ".safetensors"), ("hf", ".safetensors"),
                                            ("big_vision", ".npz"), ("hf", ".npz")])
def test_round_trip_runs_on_the_file_weights(model: Path, tmp_path: Path, scheme: str,
                                             suffix: str) -> None:
    g = planner.load_model(model)
    raw = _raw(g, 7)
    path = tmp_path / f"w{suffix}"
    save_weights(path, to_scheme(g, raw, scheme))
    loaded = load_weights(g, path)
    assert sorted(loaded) == sorted(raw)
    assert all(np.array_equal(loaded[k], raw[k]) for k in raw)
    graph, got = model_values(g, str(path))
    assert got is not None and graph != g  # data scales differ from the fixed ones
    out = run_model(graph, load_device("tiny"), PipelineConfig(optimization_steps=0),
                    params=got)
    assert out.status == 0 and out.summary["rel_fro_error"] == 0.0
    params, inputs = quantize_params(graph, got), init_inputs(graph, seed=1)
    sim = simulator.run(out.result.package, params=params, inputs=inputs)
    ref = reference(graph, params, inputs)["out"]
    assert np.array_equal(sim.outputs["out"], ref)
    init_out = reference(g, init_params(g, seed=0), init_inputs(g, seed=1))["out"]
    assert not np.allclose(ref, init_out, atol=1e-3)  # the file's weights were used


def _bad(g: planner.Graph, kind: str) -> tuple[dict[str, np.ndarray], str]:
    arrays = to_scheme(g, _raw(g, 3), "hf")
    name = "vision_model.encoder.layers.1.self_attn.k_proj.weight"
    if kind == "missing":
        del arrays[name]
        return arrays, "layers.w_k"
    if kind == "extra":
        arrays["vision_model.encoder.bogus"] = np.zeros(3, np.float32)
        return arrays, "vision_model.encoder.bogus"
    if kind == "misshaped":
        arrays[name] = np.zeros((32, 31), np.float32)
        return arrays, name
    if kind == "dtype":
        arrays[name] = np.zeros((32, 32), np.int32)
        return arrays, name
    arrays[name] = np.full((32, 32), np.nan, np.float32)
    return arrays, name


@pytest.mark.parametrize("kind", ["missing", "extra", "misshaped", "dtype", "nan"])
def test_bad_weights_exit_2_naming_the_tensor(model: Path, tmp_path: Path, kind: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    g = planner.load_model(model)
    arrays, name = _bad(g, kind)
    path = tmp_path / "bad.safetensors"
    save_weights(path, arrays)
    status = main(["run", str(model), "--device", "tiny", "--weights", str(path), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2 and name in err and len(err.strip().splitlines()) == 1
    if kind == "misshaped":
        assert "(32, 32)" in err  # the expected shape


def test_ours_misshaped_and_unreadable(model: Path, tmp_path: Path) -> None:
    g = planner.load_model(model)
    raw = _raw(g, 3)
    raw["w_patch"] = raw["w_patch"][:5]
    save_weights(tmp_path / "w.npz", raw)
    with pytest.raises(ConfigError, match=r"w_patch.*\(48, 32\)"):
        load_weights(g, tmp_path / "w.npz")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(ConfigError, match="cannot read"):
        load_weights(g, tmp_path / "junk.safetensors")
    with pytest.raises(ConfigError, match="must be a .npz"):
        load_weights(g, model)


def test_large_weights_need_data_scales(model: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    g = planner.load_model(model)
    path = tmp_path / "big.npz"
    save_weights(path, _raw(g, 5, std_scale=50.0))  # std 1.0: fifty times the init
    args = ["run", str(model), "--device", "tiny", "--weights", str(path), "--json",
            "--quiet", "--optimization-steps", "0"]
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["numerics_ok"] is True and s["nonfinite"] is None
    assert all(v["saturated"] == 0 for v in s["casts"].values())
    assert main([*args, "--scales", "fixed"]) == 1
    s = json.loads(capsys.readouterr().out)
    assert s["numerics_ok"] is False and s["nonfinite"]
    assert s["casts"]["w_patch"]["saturated"] > 0  # the weights saturate at 2**-8
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # what a user's interpreter shows by default
        assert main([a for a in args if a != "--json"] + ["--scales", "fixed"]) == 1
    text, err = capsys.readouterr()
    assert "fp8 tensor(s) saturate" in text and "FAILED: non-finite" in text
    assert "Warning" not in err  # the summary says it, numpy does not


def test_data_scales_follow_the_data(model: Path) -> None:
    g = planner.load_model(model)
    raw = _raw(g, 1, std_scale=50.0)
    scaled = data_scales(g, raw, init_inputs(g, seed=1))
    w = scaled.tensor("layers.w_q")
    assert w.scale_exp == exponent_for(float(np.abs(raw["layers.w_q"]).max()))
    body = scaled.op("encoder").body  # type: ignore[union-attr]
    assert body.tensor("w_q").scale_exp == w.scale_exp
    assert body.tensor("v_heads").scale_exp == body.tensor("v_fp8").scale_exp
    assert scaled.tensor("head_v_heads").scale_exp == scaled.tensor("head_v_fp8").scale_exp


def _spelled_twice(g: planner.Graph, kind: str) -> tuple[dict[str, np.ndarray], str, str]:
    if kind == "hf-zero-padded":
        arrays = to_scheme(g, _raw(g, 3), "hf")
        name = "vision_model.encoder.layers.1.self_attn.k_proj.weight"
        twin = name.replace("layers.1.", "layers.01.")
        arrays[twin] = arrays[name].copy()
        return arrays, name, twin
    arrays = to_scheme(g, _raw(g, 3), "big_vision")
    name = "params/img/Transformer/encoderblock/MlpBlock_0/Dense_0/kernel"
    twin = name.replace("encoderblock/", "encoderblock_0/")
    arrays[twin] = arrays[name][0].copy()
    return arrays, name, twin


@pytest.mark.parametrize("kind", ["hf-zero-padded", "bv-scanned-and-per-block"])
def test_one_parameter_spelled_twice_names_both(model: Path, tmp_path: Path, kind: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    g = planner.load_model(model)
    arrays, name, twin = _spelled_twice(g, kind)
    path = tmp_path / "twice.npz"
    save_weights(path, arrays)
    assert main(["run", str(model), "--device", "tiny", "--weights", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and name in err[0] and twin in err[0] and "again" in err[0]


def test_float64_beyond_float32_is_named(model: Path, tmp_path: Path) -> None:
    g = planner.load_model(model)
    raw = {k: v.astype(np.float64) for k, v in _raw(g, 3).items()}
    raw["layers.w_fc2"][1, 3, 4] = 1e39
    save_weights(tmp_path / "w.npz", raw)
    with pytest.raises(ConfigError, match="float32's range") as info:
        load_weights(g, tmp_path / "w.npz")
    assert info.value.field == "layers.w_fc2"


def test_ours_from_a_deeper_file_uses_its_first_layers(model: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    g = planner.load_model(model)  # 2 layers
    raw = _raw(g, 4)
    save_weights(tmp_path / "w.safetensors", raw)
    one = planner.load_model(model, layers=1)
    got = load_weights(one, tmp_path / "w.safetensors")
    assert np.array_equal(got["layers.w_q"], raw["layers.w_q"][:1])
    assert main(["run", str(model), "--layers", "1", "--device", "tiny", "--weights",
                 str(tmp_path / "w.safetensors"), "--quiet", "--optimization-steps", "0"]) == 0
    assert "numerics         rel. Frobenius" in capsys.readouterr().out
    short = {**raw, "layers.w_q": raw["layers.w_q"][:1]}
    save_weights(tmp_path / "short.npz", short)
    with pytest.raises(ConfigError, match="or more layers"):
        load_weights(g, tmp_path / "short.npz")


def test_clipped_fp8_weights_fail_the_run(model: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A weight value e4m3fn rounds to 448 (not NaN) at the fixed scale still fails:
    saturation is a failure whether it clips or overflows (docs/weights.md)."""
    g = planner.load_model(model)
    raw = _raw(g, 5)
    e = g.tensor("w_patch").scale_exp
    raw["w_patch"][0, 0] = np.float32(455.0 * 2.0 ** e)  # rounds to 448 · 2^e
    save_weights(tmp_path / "clip.npz", raw)
    args = ["run", str(model), "--device", "tiny", "--weights", str(tmp_path / "clip.npz"),
            "--scales", "fixed", "--quiet", "--optimization-steps", "0"]
    assert main([*args, "--json"]) == 1
    s = json.loads(capsys.readouterr().out)
    assert s["casts"]["w_patch"]["saturated"] > 0 and s["nonfinite"] is None
    assert s["numerics_ok"] is False
    assert main(args) == 1
    assert "FAILED: fp8 saturation" in capsys.readouterr().out


def test_models_lists_parameter_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "vit-micro", "--parameters", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    g = planner.load_model("vit-micro")
    assert set(rows) == set(g.parameters)
    assert rows["layers.w_q"]["shape"] == list(g.tensor("layers.w_q").shape)
    assert main(["models", "--parameters"]) == 2
