"""Numpy reference: against an independent float64 ViT, rounding points, init scales."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import planner
from planner.ir.graph import Graph, Repeat, Tensor, make_graph
from planner.ir.ops.cast import Cast
from planner.ir.ops.heads import MergeHeads, SplitHeads
from planner.ir.reference import quantize
from tilecommon.errors import ConfigError


def _ln64(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=1, keepdims=True)
    sigma2 = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(sigma2 + eps) * gamma + beta


def _vit64(p: dict[str, np.ndarray], patches: np.ndarray, a: dict) -> np.ndarray:
    """Plain float64 pre-LN ViT, written from the model definition (not the graph)."""
    h, nh, t, b = a["hidden"], a["heads"], a["tokens"], a["batch"]
    dh = h // nh
    q = {k: v.astype(np.float64) for k, v in p.items()}
    x = patches.astype(np.float64) @ q["w_patch"] + q["b_patch"]
    x = x + np.tile(q["pos_embed"], (b, 1))
    for i in range(a["layers"]):
        def w(n: str) -> np.ndarray:
            return q[f"layers.{n}"][i]  # noqa: B023 - used immediately

        y = _ln64(x, w("ln1.gamma"), w("ln1.beta"), a["eps"])
        ctx = np.zeros_like(x)
        for img in range(b):
            rows = slice(img * t, (img + 1) * t)
            for head in range(nh):
                cols = slice(head * dh, (head + 1) * dh)
                qh = (y[rows] @ w("w_q") + w("b_q"))[:, cols]
                kh = (y[rows] @ w("w_k") + w("b_k"))[:, cols]
                vh = (y[rows] @ w("w_v") + w("b_v"))[:, cols]
                s = qh @ kh.T / math.sqrt(dh)
                e = np.exp(s - s.max(axis=1, keepdims=True))
                ctx[rows, cols] = (e / e.sum(axis=1, keepdims=True)) @ vh
        x = x + ctx @ w("w_o") + w("b_o")
        y = _ln64(x, w("ln2.gamma"), w("ln2.beta"), a["eps"])
        f = y @ w("w_fc1") + w("b_fc1")
        f = 0.5 * f * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (f + 0.044715 * f**3)))
        x = x + f @ w("w_fc2") + w("b_fc2")
    return _ln64(x, q["ln_f.gamma"], q["ln_f.beta"], a["eps"])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def test_fp32_reference_matches_float64_vit(micro_toml: Path) -> None:
    g = planner.load_model(micro_toml, precision="fp32")
    params, inputs = planner.init_params(g, 0), planner.init_inputs(g, 1)
    out = planner.reference(g, params, inputs)["out"]
    want = _vit64(params, inputs["patches"], dict(g.attrs))
    assert out.dtype == np.float32 and out.shape == want.shape
    assert _rel(out, want) < 1e-4


def test_fp8_reference_is_close_to_fp32_and_deterministic(micro_toml: Path) -> None:
    g8 = planner.load_model(micro_toml)
    g32 = planner.load_model(micro_toml, precision="fp32")
    out8 = planner.reference(g8, planner.init_params(g8, 0), planner.init_inputs(g8, 1))["out"]
    again = planner.reference(g8, planner.init_params(g8, 0), planner.init_inputs(g8, 1))["out"]
    out32 = planner.reference(g32, planner.init_params(g32, 0), planner.init_inputs(g32, 1))
    assert np.array_equal(out8, again)
    err = _rel(out8, out32["out"].astype(np.float64))
    assert 1e-4 < err < 0.05  # fp8 rounds visibly, but stays a usable approximation


def test_params_are_representable_deterministic_and_layer_stable(micro_toml: Path) -> None:
    g = planner.load_model(micro_toml)
    p = planner.init_params(g, 0)
    assert sorted(p) == list(g.parameters)
    for name, v in p.items():
        assert v.dtype == np.float32 and v.shape == g.tensor(name).shape
        assert np.array_equal(quantize(v, g.tensor(name)), v), name
    assert np.array_equal(planner.init_params(g, 0)["layers.w_q"], p["layers.w_q"])
    assert not np.array_equal(planner.init_params(g, 1)["layers.w_q"], p["layers.w_q"])
    g1 = planner.load_model(micro_toml, layers=1)
    assert np.array_equal(planner.init_params(g1, 0)["layers.w_q"][0], p["layers.w_q"][0])
    gamma = p["layers.ln1.gamma"]
    assert 0.05 < float(gamma.std()) < 0.15 and abs(float(gamma.mean()) - 1.0) < 0.05
    x = planner.init_inputs(g, 1)["patches"]
    assert x.min() >= -1.0 and x.max() <= 1.0 and 0.5 < float(x.std()) < 0.65


def _fp8_casts_flat(g: Graph) -> list[tuple[str, str, str]]:
    return [("", op.x, op.out) for op in g.ops
            if isinstance(op, Cast) and g.tensor(op.out).dtype == "fp8"]


def _check_fp8_ranges(g: Graph) -> None:
    """At the reference init the fp8 codes of every cast and weight stay well
    inside e4m3 (|code| <= 448/4) and almost no non-zero value flushes to zero."""
    params, inputs = planner.init_params(g, 0), planner.init_inputs(g, 1)
    record: dict[str, np.ndarray] = {}
    planner.reference(g, params, inputs, record=record)
    record.update(inputs)
    body = g.op("encoder")
    assert isinstance(body, Repeat)
    pairs = [(x, o, g.tensor(o)) for _, x, o in _fp8_casts_flat(g)]
    for i in range(body.trips):
        pairs += [(f"encoder[{i}].{x}", f"encoder[{i}].{o}", body.body.tensor(o))
                  for _, x, o in _fp8_casts_flat(body.body)]
    assert len(pairs) == 1 + 4 * body.trips
    for x_name, o_name, t in pairs:
        x, y = record[x_name], record[o_name]
        codes = np.abs(y) * 2.0 ** -t.scale_exp
        assert np.isfinite(y).all(), o_name
        assert 2.0 <= codes.max() <= 112.0, (o_name, codes.max())
        flushed = np.count_nonzero((x != 0) & (y == 0)) / max(np.count_nonzero(x), 1)
        assert flushed < 0.005, (o_name, flushed)
    for name in g.parameters:
        t = g.tensor(name)
        if t.dtype == "fp8":
            codes = np.abs(params[name]) * 2.0 ** -t.scale_exp
            assert 2.0 <= codes.std() <= 16.0 and codes.max() <= 112.0, name


def test_fp8_casts_neither_saturate_nor_underflow() -> None:
    _check_fp8_ranges(planner.load_model("vit-tiny", layers=2))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["siglip-so400m", "pe-core-l14"])
def test_fp8_casts_full_size_models(name: str) -> None:
    _check_fp8_ranges(planner.load_model(name, layers=3))


def test_quantize_rounding_points() -> None:
    t8 = Tensor("a", (3,), "fp8", "activation", -2)
    got = quantize(np.array([0.3, 1e-5, 100.0, 116.0, 120.0], np.float32), t8)
    # ×4: 1.2 -> 1.25 (3 mantissa bits); 4e-5 flushes to 0; 400 ties to even 384;
    # 464 ties to 448 (480 is not a number); 480 -> NaN (ml_dtypes does not saturate)
    assert got[:4].tolist() == [0.3125, 0.0, 96.0, 112.0] and np.isnan(got[4])
    t16 = Tensor("b", (1,), "fp16", "activation")
    assert quantize(np.array([0.1], np.float32), t16).tolist() == [0.0999755859375]
    t8s = Tensor("c", (1,), "fp8", "activation", 0)
    assert quantize(np.array([440.0], np.float32), t8s).tolist() == [448.0]


def test_heads_roundtrip_and_errors() -> None:
    ts = [Tensor("x", (6, 8), "fp32", "input"), Tensor("h", (4, 3, 4), "fp32", "activation"),
          Tensor("y", (6, 8), "fp32", "output")]
    g = make_graph("heads", ts, [SplitHeads("s", "x", "h", 2), MergeHeads("m", "h", "y", 2)],
                   ["x"], ["y"])
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    record: dict[str, np.ndarray] = {}
    assert np.array_equal(planner.reference(g, {}, {"x": x}, record)["y"], x)
    # out[b·heads+h, t, d] = x[b·T+t, h·dh+d] with T = 3, dh = 4
    assert record["h"][1 * 2 + 1, 2, 3] == x[1 * 3 + 2, 1 * 4 + 3]
    with pytest.raises(ConfigError, match="missing") as info:
        planner.reference(g, {}, {})
    assert info.value.field == "x"
    with pytest.raises(ConfigError, match="shape") as info:
        planner.reference(g, {}, {"x": x[:2]})
    assert info.value.field == "x"
