"""Hardware results: format round trip, every kind of corrupt input, cross-check numbers, CLI.

No hardware exists here: every result below is SYNTHETIC — made from a simulation
of the package on a device with known perturbations, and marked so in its meta."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main
from simulator import Package, load_device, run, save_package
from simulator.hardware import (
    HardwareResult,
    check_against,
    crosscheck,
    load_hardware_result,
    save_hardware_result,
    seeded_values,
    step_label,
    step_loops,
)
from simulator.testing import ksplit_matmul, repeat_program
from tilecommon.errors import ConfigError, HardwareResultInvalid

SYNC_EXTRA = 100  # cycles added to every exchange by the "hardware" device
DELTA = 0.5  # added to one output element by the "hardware"


@pytest.fixture(scope="module")
def ksplit() -> tuple[Package, dict, dict]:
    pkg, params, inputs, _ = ksplit_matmul(load_device("tiny"))
    return pkg, params, inputs


def synthetic_result(pkg: Package, params: dict, inputs: dict, seed: int | None = None
                     ) -> HardwareResult:
    """Simulate on the device with SYNC_EXTRA more sync cycles; shift one output."""
    dev = pkg.device.with_costs(sync_cycles=pkg.device.costs.sync_cycles + SYNC_EXTRA)
    sim = run(dataclasses.replace(pkg, device=dev), params=params, inputs=inputs)
    outs = {k: v.copy() for k, v in sim.outputs.items()}
    outs["out"][1, 2] += np.float32(DELTA)
    return HardwareResult(pkg.content_hash(), pkg.device.name, sim.cycles,
                          step_cycles=sim.cycles_per_step.copy(),
                          tile_cycles=sim.tile_busy.copy(), outputs=outs, value_seed=seed,
                          meta={"synthetic": True, "runner": "test", "date": "2026-11-30"})


def test_round_trip(ksplit: tuple[Package, dict, dict], tmp_path: Path) -> None:
    pkg, params, inputs = ksplit
    r = synthetic_result(pkg, params, inputs, seed=7)
    path = save_hardware_result(r, tmp_path / "hw", pkg)
    back = load_hardware_result(path, pkg)
    assert (back.package_hash, back.device, back.total_cycles, back.value_seed) == (
        r.package_hash, "tiny", r.total_cycles, 7)
    assert back.step_cycles is not None and r.step_cycles is not None
    assert back.step_cycles.tolist() == r.step_cycles.tolist()
    assert back.tile_cycles is not None and back.tile_cycles.dtype == np.int64
    assert np.array_equal(back.outputs["out"], r.outputs["out"])
    assert back.synthetic and dict(back.meta) == dict(r.meta)
    # saving again replaces the directory; no temporary files are left behind
    save_hardware_result(back, path, pkg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw"]
    # optional arrays may be absent
    bare = HardwareResult(pkg.content_hash(), "tiny", 123)
    again = load_hardware_result(save_hardware_result(bare, tmp_path / "bare"), pkg)
    assert again.step_cycles is None and again.tile_cycles is None and not again.outputs


def _corrupt(path: Path, **changes: object) -> None:
    doc = json.loads((path / "hwresult.json").read_text())
    for k, v in changes.items():
        if v is None and k.startswith("-"):
            del doc[k[1:]]
        else:
            doc[k] = v
    (path / "hwresult.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("change, field", [
    ({"version": 2}, "version"),
    ({"-total_cycles": None}, "total_cycles"),
    ({"colour": "red"}, "colour"),
    ({"total_cycles": -5}, "total_cycles"),
    ({"total_cycles": "many"}, "total_cycles"),
    ({"package_hash": "ab" * 32}, "package_hash"),
    ({"device": "c600"}, "device"),
    ({"meta": []}, "meta"),
    ({"has_step_cycles": False}, "arrays"),
    ({"outputs": [{"name": "out", "shape": [8, 17]}]}, "outputs.out"),
])
def test_corrupt_json_names_file_and_field(ksplit: tuple[Package, dict, dict], tmp_path: Path,
                                           change: dict, field: str) -> None:
    pkg, params, inputs = ksplit
    path = save_hardware_result(synthetic_result(pkg, params, inputs), tmp_path / "hw", pkg)
    _corrupt(path, **change)
    with pytest.raises(HardwareResultInvalid) as e:
        load_hardware_result(path, pkg)
    assert e.value.field == field
    assert str(path) in e.value.source
    assert isinstance(e.value, ConfigError)  # CLI: bad input, exit status 2


def test_corrupt_files(ksplit: tuple[Package, dict, dict], tmp_path: Path) -> None:
    pkg, params, inputs = ksplit
    r = synthetic_result(pkg, params, inputs)
    path = save_hardware_result(r, tmp_path / "hw", pkg)
    (path / "arrays.npz").write_bytes((path / "arrays.npz").read_bytes()[:100])
    with pytest.raises(HardwareResultInvalid, match="arrays.npz.*'npz'"):
        load_hardware_result(path)
    (path / "hwresult.json").write_text("{not json")
    with pytest.raises(HardwareResultInvalid, match="hwresult.json.*'json'"):
        load_hardware_result(path)
    with pytest.raises(HardwareResultInvalid, match="missing"):
        load_hardware_result(tmp_path / "nowhere")


def test_mismatch_with_package(ksplit: tuple[Package, dict, dict]) -> None:
    pkg, params, inputs = ksplit
    r = synthetic_result(pkg, params, inputs)
    cases = {
        "step_cycles": dataclasses.replace(r, step_cycles=np.zeros(pkg.n_steps + 1, np.int64)),
        "tile_cycles": dataclasses.replace(r, tile_cycles=np.zeros(3, np.int64)),
        "outputs.out": dataclasses.replace(r, outputs={"out": np.zeros((16, 8), np.float32)}),
        "outputs.y": dataclasses.replace(r, outputs={"y": np.zeros((8, 16), np.float32)}),
    }
    for field, bad in cases.items():
        with pytest.raises(HardwareResultInvalid) as e:
            check_against(bad, pkg, "somewhere.json")
        assert (e.value.source, e.value.field) == ("somewhere.json", field)
    other = repeat_program(load_device("tiny"), 3)
    with pytest.raises(HardwareResultInvalid, match="package_hash"):
        check_against(r, other)
    with pytest.raises(HardwareResultInvalid, match="'step_cycles'"):
        dataclasses.replace(r, step_cycles=np.zeros(pkg.n_steps, np.float64))
    with pytest.raises(HardwareResultInvalid, match="'outputs.out'"):
        dataclasses.replace(r, outputs={"out": np.zeros((8, 16), np.float64)})


def test_crosscheck_numbers(ksplit: tuple[Package, dict, dict]) -> None:
    pkg, params, inputs = ksplit
    hw = synthetic_result(pkg, params, inputs)
    sim = run(pkg, params=params, inputs=inputs)
    rep = crosscheck(pkg, sim, hw, top=2)
    # one exchange step (step 1): exactly SYNC_EXTRA more cycles, nothing else differs
    assert hw.total_cycles == sim.cycles + SYNC_EXTRA
    assert rep.cycle_ratio == pytest.approx((sim.cycles + SYNC_EXTRA) / sim.cycles)
    assert rep.steps[0].step == 1 and rep.steps[0].diff == SYNC_EXTRA
    assert rep.steps[0].label == "EXCHANGE 3 transfers, 1536 bytes"
    assert rep.steps[1].diff == 0 and rep.steps_compared == 3
    assert rep.step_max_rel == pytest.approx(SYNC_EXTRA / int(sim.cycles_per_step[1]))
    assert rep.tile_max_rel == 0.0
    (o,) = rep.outputs
    ref = sim.outputs["out"].astype(np.float64)
    assert o.max_abs == pytest.approx(DELTA)
    assert o.rel_fro == pytest.approx(DELTA / np.linalg.norm(ref))
    assert o.nonfinite == 0
    text = rep.text()
    assert "SYNTHETIC" in text and "EXCHANGE 3 transfers" in text and "hw/sim 1." in text
    assert rep.violations(cycle_tolerance=1.0, max_abs_tolerance=1.0) == []
    bad = rep.violations(cycle_tolerance=1e-3, rel_fro_tolerance=1e-9)
    assert len(bad) == 2 and bad[0].startswith("cycle ratio")


def test_step_loops_and_labels() -> None:
    pkg = repeat_program(load_device("tiny"), 4)
    # COPY | BEGIN | ADD | EXCHANGE | END | COPY
    assert step_loops(pkg).tolist() == [-1, -1, 1, 1, -1, -1]
    assert step_label(pkg, 1) == "REPEAT_BEGIN x4"
    assert step_label(pkg, 2) == "COMPUTE 1xADD on 1 tiles"


def test_seeded_values_are_deterministic(ksplit: tuple[Package, dict, dict]) -> None:
    pkg = ksplit[0]
    p1, i1 = seeded_values(pkg, 3)
    p2, i2 = seeded_values(pkg, 3)
    assert sorted(p1) == ["b", "bias"] and sorted(i1) == ["a"]
    assert all(np.array_equal(p1[k], p2[k]) for k in p1)
    assert not np.array_equal(seeded_values(pkg, 4)[1]["a"], i1["a"])


def test_cli_crosscheck(ksplit: tuple[Package, dict, dict], tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    pkg = ksplit[0]
    pdir = save_package(pkg, tmp_path / "pkg")
    params, inputs = seeded_values(pkg, 5)  # what a runner given value_seed 5 would load
    hdir = save_hardware_result(synthetic_result(pkg, params, inputs, seed=5), tmp_path / "hw")
    assert main(["crosscheck", str(pdir), str(hdir), "--cycle-tolerance", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out and f"max abs {DELTA:.6g}" in out
    assert main(["crosscheck", str(pdir), str(hdir), "--max-abs-tolerance", "0.1"]) == 1
    assert "outside tolerance: output out: max abs" in capsys.readouterr().out
    unseeded = synthetic_result(pkg, params, inputs, seed=None)
    udir = save_hardware_result(unseeded, tmp_path / "hw-unseeded")
    assert main(["crosscheck", str(pdir), str(udir), "--max-abs-tolerance", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "outputs not compared: the result records no value_seed" in out
    assert "output  none compared" in out
    _corrupt(hdir, version=9)
    assert main(["crosscheck", str(pdir), str(hdir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hwresult.json: field 'version'" in err[0]


def test_crosscheck_rows_name_the_graph_ops() -> None:
    """On a planner package each listed step names the ops it serves (from
    the package's provenance) beside what it holds."""
    import planner
    from simulator.hardware import seeded_values

    g = planner.load_model("vit-micro")
    pkg = planner.plan(g, load_device("tiny"),
                       planner.PipelineConfig(optimization_steps=0)).package
    params, inputs = seeded_values(pkg, 0)
    hw = synthetic_result(pkg, params, inputs)
    rep = crosscheck(pkg, run(pkg, params=params, inputs=inputs), hw, top=4)
    ops = {op.name for op in g.ops} | {f"{r.name}/{o.name}" for r in g.ops
                                       if hasattr(r, "body") for o in r.body.ops}
    assert len(rep.steps) == 4
    for r in rep.steps:
        served = pkg.provenance[r.step]
        assert {op for op, _, _ in served} <= ops | {"(control)"}, r.ops
        assert r.ops.startswith(f"{served[0][0]} {served[0][2]}")
        assert f"{r.ops}: {r.label}" in rep.text()


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nonfinite_hardware_outputs_are_a_mismatch(ksplit: tuple[Package, dict, dict],
                                                   tmp_path: Path, value: float,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A NaN or Inf in what the hardware wrote fails the check under any (or no)
    tolerance, without numpy warnings on the way."""
    pkg = ksplit[0]
    pdir = save_package(pkg, tmp_path / "pkg")
    params, inputs = seeded_values(pkg, 5)
    r = synthetic_result(pkg, params, inputs, seed=5)
    r.outputs["out"][0, 0] = np.float32(value)
    hdir = save_hardware_result(r, tmp_path / "hw")
    assert main(["crosscheck", str(pdir), str(hdir)]) == 1
    captured = capsys.readouterr()
    assert "outside tolerance: output out: 1 non-finite value(s)" in captured.out
    assert "RuntimeWarning" not in captured.err


@pytest.mark.parametrize("cycles", [2 ** 63, 2 ** 70, -1])
def test_cycles_beyond_int64_are_refused(ksplit: tuple[Package, dict, dict], tmp_path: Path,
                                         cycles: int,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    pkg, params, inputs = ksplit
    pdir = save_package(pkg, tmp_path / "pkg")
    hdir = save_hardware_result(synthetic_result(pkg, params, inputs), tmp_path / "hw")
    _corrupt(hdir, total_cycles=cycles)
    assert main(["crosscheck", str(pdir), str(hdir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field 'total_cycles'" in err[0]
