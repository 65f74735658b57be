"""Chrome-trace export: valid JSON, spans that add up to the simulated cycles, sorted events."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main
from simulator import load_device, run, save_package
from simulator.testing import ksplit_matmul, repeat_program
from simulator.timing import loop_patch_words
from simulator.trace import MAX_TRACE_TILES, save_trace, step_executions, trace_events

STEP_CATS = ("compute", "exchange", "loop")
TRIPS = 5


def _spans(trace: dict, cat: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == cat]


def test_repeat_trace_adds_up(tmp_path: Path) -> None:
    pkg = repeat_program(load_device("tiny"), TRIPS)
    sim = run(pkg, numerics=False)
    path = save_trace(trace_events(pkg, sim, tiles=[0, 1]), tmp_path / "t.json")
    trace = json.loads(path.read_text())  # valid JSON
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["ts"] for e in xs] == sorted(e["ts"] for e in xs)
    steps = [e for e in xs if e["cat"] in STEP_CATS]
    assert sum(e["dur"] for e in steps) == sim.cycles
    # the step spans tile the timeline: each starts where the previous ended
    steps.sort(key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] == b["ts"] for a, b in zip(steps, steps[1:], strict=False))
    assert steps[-1]["ts"] + steps[-1]["dur"] == sim.cycles
    per_step = np.zeros(pkg.n_steps, dtype=np.int64)
    for e in steps:
        per_step[e["args"]["step"]] += e["dur"]
    assert per_step.tolist() == sim.cycles_per_step.tolist()
    # COPY | BEGIN | ADD | EXCHANGE | END | COPY: one span per execution
    assert len(steps) == 1 + 3 * TRIPS + 1
    iters = _spans(trace, "repeat")
    assert [e["name"] for e in iters] == [f"repeat@1 iteration {i}" for i in range(TRIPS)]
    # every iteration but the last also pays the patches before its jump back
    patch = pkg.device.costs.patch_word_cycles * int(loop_patch_words(pkg).max())
    body = (sum(int(sim.cycles_per_step[s]) for s in (2, 3, 4)) - patch * (TRIPS - 1)) // TRIPS
    assert [e["dur"] for e in iters] == [body + patch] * (TRIPS - 1) + [body]
    sync = _spans(trace, "sync")
    assert len(sync) == TRIPS and all(e["dur"] == pkg.device.exchange_fixed_cycles for e in sync)
    # tile 0 runs every vertex; tile 1 only receives
    tiles = _spans(trace, "tile")
    assert {e["tid"] for e in tiles} == {0}
    assert sum(e["dur"] for e in tiles) == int(sim.tile_busy[0])
    assert trace["otherData"]["cycles"] == sim.cycles


def test_multi_tile_busy_spans_and_units() -> None:
    pkg = ksplit_matmul(load_device("tiny"))[0]
    sim = run(pkg, numerics=False)
    trace = trace_events(pkg, sim, tiles=range(4))
    busy = {t: sum(e["dur"] for e in _spans(trace, "tile") if e["tid"] == t) for t in range(4)}
    assert busy == {t: int(sim.tile_busy[t]) for t in range(4)}
    us = trace_events(pkg, sim, unit="us")
    total = sum(e["dur"] for e in us["traceEvents"] if e.get("cat") in STEP_CATS)
    assert total == pytest.approx(sim.cycles / pkg.device.clock_hz * 1e6)


def test_step_executions() -> None:
    pkg = repeat_program(load_device("tiny"), TRIPS)
    assert step_executions(pkg).tolist() == [1, 1, TRIPS, TRIPS, TRIPS, 1]


def test_bad_requests() -> None:
    pkg = repeat_program(load_device("tiny"), TRIPS)
    sim = run(pkg, numerics=False)
    with pytest.raises(ValueError, match="at most"):
        trace_events(pkg, sim, tiles=range(MAX_TRACE_TILES + 1))
    with pytest.raises(ValueError, match="0..15"):
        trace_events(pkg, sim, tiles=[16])
    with pytest.raises(ValueError, match="unit"):
        trace_events(pkg, sim, unit="ms")
    other = repeat_program(load_device("tiny"), TRIPS + 1)
    with pytest.raises(ValueError, match="cycles"):
        trace_events(other, sim)


def test_cli_simulate_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pdir = save_package(repeat_program(load_device("tiny"), TRIPS), tmp_path / "pkg")
    out = tmp_path / "trace.json"
    assert main(["simulate", str(pdir), "--no-numerics", "--trace", str(out),
                 "--trace-tiles", "0,1"]) == 0
    assert "trace" in capsys.readouterr().out
    assert json.loads(out.read_text())["otherData"]["tiles"] == [0, 1]
    assert main(["simulate", str(pdir), "--no-numerics", "--trace", str(out),
                 "--trace-tiles", "99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trace" in err[0]
