"""The MAP pooling head, the Broadcast op and the attention precision fields:
the zoo model's size, the head against a float64 implementation written here,
config and graph errors, and planned runs of every pool / dtype combination
agreeing with the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import planner
from planner.ir.graph import Tensor, make_graph, parameter_count
from planner.ir.ops.broadcast import Broadcast
from planner.ir.reference import fp32_graph, init_inputs, init_params, reference
from planner.pipeline import run_model
from planner.search.incumbent import PipelineConfig
from simulator.device import load_device
from tilecommon.errors import ConfigError, GraphError

MICRO = (Path(planner.__file__).parent / "ir" / "zoo" / "vit-micro.toml").read_text()


def _micro(tmp_path: Path, **fields: str) -> Path:
    text = MICRO.replace('name = "vit-micro"', 'name = "m"')
    text += "".join(f'{k} = "{v}"\n' for k, v in fields.items())
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def test_siglip_map_parameter_count() -> None:
    g = planner.load_model("siglip-so400m-map")
    assert parameter_count(g) == 428_225_600
    h, mlp = 1152, 4304
    head = 4 * (h * h + h) + 2 * h + (h * mlp + mlp) + (mlp * h + h) + h
    assert parameter_count(g) - parameter_count(planner.load_model("siglip-so400m")) == head
    assert g.tensor("out").shape == (1, h)
    assert dict(g.attrs)["pv_dtype"] == "fp8" and "qk_dtype" not in dict(g.attrs)
    assert g.tensor("layers.w_q").dtype == "fp8"


def _ln(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _map_head64(p: dict[str, np.ndarray], enc: np.ndarray, b: int, t: int, heads: int,
                eps: float) -> np.ndarray:
    """big_vision's MAPHead in float64, written from its definition."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = enc.astype(np.float64).reshape(b, t, -1)
    h = x.shape[-1]
    dh = h // heads
    probe = np.broadcast_to(p["head_probe"], (b, 1, h))

    def proj(y: np.ndarray, name: str) -> np.ndarray:
        return y @ p[f"w_head_{name}"] + p[f"b_head_{name}"]

    q = proj(probe, "q").reshape(b, 1, heads, dh).transpose(0, 2, 1, 3)
    k = proj(x, "k").reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
    v = proj(x, "v").reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = (s / s.sum(-1, keepdims=True)) @ v
    y = proj(a.transpose(0, 2, 1, 3).reshape(b, 1, h), "o")
    z = _ln(y, p["head_ln.gamma"], p["head_ln.beta"], eps)
    z = proj(_gelu(proj(z, "fc1")), "fc2")
    return (y + z)[:, 0]


@pytest.mark.parametrize("batch", [1, 3])
def test_map_head_matches_float64(tmp_path: Path, batch: int) -> None:
    g = planner.load_model(_micro(tmp_path, pool="map"), batch=batch, precision="fp32")
    params, inputs = init_params(g, seed=5), init_inputs(g, seed=6)
    params["head_probe"] = params["head_probe"] * 20  # a probe that matters
    record: dict[str, np.ndarray] = {}
    out = reference(g, params, inputs, record=record)["out"]
    want = _map_head64(params, record["encoded"], batch, 10, 2, 1e-6)
    assert out.shape == (batch, 32)
    assert np.linalg.norm(out - want) / np.linalg.norm(want) < 1e-4
    if batch > 1:  # different images pool to different vectors
        assert np.abs(out[0] - out[1]).max() > 1e-3


def test_fp32_graph_is_the_fp32_variant(tmp_path: Path) -> None:
    path = _micro(tmp_path, pool="map", pv_dtype="fp8", qk_dtype="fp8")
    wide = fp32_graph(planner.load_model(path))
    assert wide == planner.load_model(path, precision="fp32")


@pytest.mark.parametrize("field, value", [("pool", "avg"), ("qk_dtype", "fp32"),
                                          ("pv_dtype", 8)])
def test_bad_choice_fields_name_the_field(tmp_path: Path, field: str, value: object) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MICRO + (f'{field} = "{value}"\n' if isinstance(value, str)
                             else f"{field} = {value}\n"))
    with pytest.raises(ConfigError, match=field):
        planner.load_model(path)


def test_broadcast_verifier() -> None:
    x = Tensor("x", (1, 4), "fp16", "input")
    with pytest.raises(GraphError, match="whole number of copies"):
        make_graph("g", [x, Tensor("y", (3, 5), "fp16", "output")],
                   [Broadcast("b", "x", "y")], ["x"], ["y"])
    with pytest.raises(GraphError, match="format changes"):
        make_graph("g", [x, Tensor("y", (3, 4), "fp32", "output")],
                   [Broadcast("b", "x", "y")], ["x"], ["y"])
    g = make_graph("g", [x, Tensor("y", (3, 4), "fp16", "output")],
                   [Broadcast("b", "x", "y")], ["x"], ["y"])
    got = reference(g, {}, {"x": np.arange(4, dtype=np.float32)[None]})["y"]
    assert np.array_equal(got, np.tile(np.arange(4, dtype=np.float32), (3, 1)))


@pytest.mark.parametrize("pool, qk, pv", [("map", "fp16", "fp16"), ("map", "fp16", "fp8"),
                                          ("none", "fp8", "fp8"), ("map", "fp8", "fp16")])
def test_planned_runs_agree_with_reference(tmp_path: Path, pool: str, qk: str,
                                           pv: str) -> None:
    g = planner.load_model(_micro(tmp_path, pool=pool, qk_dtype=qk, pv_dtype=pv))
    out = run_model(g, load_device("tiny"), PipelineConfig(optimization_steps=1))
    s = out.summary
    assert out.status == 0 and s["numerics_ok"] is True
    # tiny K per tile: no split accumulation, so the simulation is bit-exact
    assert s["rel_fro_error"] == 0.0
    assert 0.99 < s["cosine_fp32_min"] <= s["cosine_fp32_mean"] <= 1.0 + 1e-12
    fp8_bmm = [k for k in s["casts"] if k.endswith(("q_fp8", "v_fp8", "probs_fp8"))]
    assert bool(fp8_bmm) == ("fp8" in (qk, pv))


def test_tolerance_follows_the_fp8_noise() -> None:
    from planner.report import REL_FRO_TOLERANCE, numerics_ok, tolerance

    assert tolerance(None) == tolerance(float("nan")) == tolerance(1e-4) == REL_FRO_TOLERANCE
    assert tolerance(0.03) == pytest.approx(0.03 * 2 ** 0.5)
    assert numerics_ok(0.02, 0.1, None, 0.03)
    assert not numerics_ok(0.02, 0.1, None, 0.005)
    assert not numerics_ok(0.02, 0.1, None, float("nan"))
    assert not numerics_ok(0.001, 0.1, "simulated out[0, 0] = nan", 0.03)
