"""A run whose outputs are not finite never passes: NaN/Inf anywhere, or a
comparison that is not finite, is a failure (exit 1) naming the first
non-finite position; fp8 saturation is counted per tensor and reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import planner
import simulator
from planner.cli import main
from planner.ir import reference as ref_mod
from planner.pipeline import run_model
from planner.report import compare, first_nonfinite, format_summary, numerics_ok

TINY = simulator.load_device("tiny")


def test_nan_never_compares_as_within_tolerance() -> None:
    ref = {"out": np.ones((2, 3), np.float32)}
    sim = {"out": np.ones((2, 3), np.float32)}
    sim["out"][1, 2] = np.nan
    rel, worst = compare(sim, ref)
    assert np.isnan(rel) and np.isnan(worst)
    assert not numerics_ok(rel, worst, None)
    assert first_nonfinite(sim, "simulated") == "simulated out[1, 2] = nan"
    assert first_nonfinite(ref, "reference") is None
    assert numerics_ok(*compare(ref, ref), None)
    inf = {"out": np.full((1, 2), np.inf, np.float32)}
    assert first_nonfinite(inf, "simulated") == "simulated out[0, 0] = inf"


def _huge(init):  # type: ignore[no-untyped-def]
    def params(g, seed):  # type: ignore[no-untyped-def]
        return {k: v * np.float32(4096.0) for k, v in init(g, seed=seed).items()}
    return params


def test_saturating_run_fails_and_says_where(
        micro_graph: planner.Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = planner.PipelineConfig(optimization_steps=0)
    good = run_model(micro_graph, TINY, cfg)
    assert good.status == 0 and good.summary["numerics_ok"] is True
    assert good.summary["nonfinite"] is None
    assert all(v["saturated"] == 0 for v in good.summary["casts"].values())
    assert "encoder/q8" in good.summary["casts"] or len(good.summary["casts"]) > 3
    monkeypatch.setattr(ref_mod, "init_params", _huge(ref_mod.init_params))
    bad = run_model(micro_graph, TINY, cfg)
    s = bad.summary
    assert bad.status == 1 and s["numerics_ok"] is False
    assert s["nonfinite"] is not None and s["nonfinite"].startswith("simulated out[")
    assert any(v["saturated"] > 0 for v in s["casts"].values())
    text = format_summary(s)
    assert "FAILED: non-finite value" in text and "saturate" in text


def test_cli_exits_1_on_nan(micro_toml: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ref_mod, "init_params", _huge(ref_mod.init_params))
    args = ["run", str(micro_toml), "--device", "tiny", "--optimization-steps", "0", "--json"]
    assert main(args) == 1
    s = json.loads(capsys.readouterr().out)
    assert s["numerics_ok"] is False and s["nonfinite"]
