"""--json on every command that prints a result: one JSON object (or list)
on stdout with the values the text output shows; and the optimizer's lines
arrive as its proposals are decided."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from planner import PipelineConfig, load_model, plan
from planner.cli import main
from simulator import load_device, save_package


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], rc: int = 0) -> object:
    assert main(argv) == rc
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    return json.loads(out)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    res = plan(load_model("vit-micro"), load_device("tiny"), PipelineConfig(optimization_steps=0))
    path = tmp_path_factory.mktemp("pkg") / "micro"
    save_package(res.package, path)
    return path


def test_models_extensions_reference(capsys: pytest.CaptureFixture[str]) -> None:
    models = _json(capsys, ["models", "--json"])
    assert isinstance(models, list)
    micro = next(m for m in models if m["model"] == "vit-micro")
    assert micro["hidden"] == 32 and micro["heads"] == 2 and micro["parameters"] > 0
    ext = _json(capsys, ["extensions", "--json"])
    assert {"kind": "baseline policy", "name": "default"}.items() <= next(
        e for e in ext if e["name"] == "default").items()
    ref = _json(capsys, ["reference", "vit-micro", "--json"])
    assert ref["outputs"]["out"]["shape"] == [20, 32] and ref["outputs"]["out"]["nan"] == 0


def test_verify_and_simulate(saved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    v = _json(capsys, ["verify", str(saved), "--json"])
    assert v["ok"] is True and v["steps"] > 0 and len(v["package_hash"]) == 64
    s = _json(capsys, ["simulate", str(saved), "--json"])
    assert s["package_hash"] == v["package_hash"] and s["faults"] == 0
    assert s["cycles"] > 0 and s["outputs"]["out"]["shape"] == [20, 32]


def test_proposal_lines_come_as_they_are_decided() -> None:
    seen: list[tuple[float, object]] = []
    t0 = time.perf_counter()
    res = plan(load_model("vit-micro"), load_device("tiny"),
               PipelineConfig(optimization_steps=4),
               on_record=lambda r: seen.append((time.perf_counter(), r)))
    t_end = time.perf_counter()
    assert [r for _, r in seen] == list(res.history) and len(seen) == 4
    # each record arrives after its own build and before the next one's
    builds = [r.seconds for _, r in seen]  # type: ignore[attr-defined]
    for i in range(1, len(seen)):
        assert seen[i][0] - seen[i - 1][0] >= 0.9 * builds[i]
    assert seen[0][0] - t0 < t_end - t0 - 0.9 * sum(builds[1:])


def test_cli_prints_each_proposal_line_before_the_summary(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vit-micro", "--device", "tiny", "--optimization-steps", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[") and lines[1].startswith("[")
    assert lines[2].startswith("model vit-micro")


def test_run_reports_its_stages_in_order() -> None:
    from planner.pipeline import RUN_STAGES, run_model

    stages: list[str] = []
    out = run_model(load_model("vit-micro"), load_device("tiny"),
                    PipelineConfig(optimization_steps=0), on_stage=stages.append)
    assert out.status == 0 and stages == list(RUN_STAGES)
    stages.clear()
    run_model(load_model("vit-micro"), load_device("tiny"),
              PipelineConfig(optimization_steps=0), numerics=False, on_stage=stages.append)
    assert stages == ["plan"]


def test_stage_bar_names_the_running_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the stage bar shows the stage that runs and counts the
    finished ones; --quiet silences it."""
    import argparse
    import io

    from planner.progress import stage_progress

    err = io.StringIO()
    err.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr("sys.stderr", err)
    with stage_progress(argparse.Namespace(quiet=False), ("plan", "reference")) as stage:
        stage("plan")
        stage("reference")
    text = err.getvalue()
    assert "plan [0/2 stages" in text and "reference [1/2 stages" in text
    err.truncate(0)
    with stage_progress(argparse.Namespace(quiet=True), ("plan",)) as stage:
        stage("plan")
    assert err.getvalue().strip("\x00") == ""
