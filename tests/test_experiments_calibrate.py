"""The calibration experiment recovers perturbed timing constants (SYNTHETIC measurements)
from hand-built packages, and fits results saved in the hardware-result format."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from simulator import Package, load_device, run, save_package
from simulator.hardware import HardwareResult, load_hardware_result, save_hardware_result
from simulator.testing import ksplit_matmul, repeat_program

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import calibrate  # noqa: E402


@pytest.fixture(scope="module")
def packages() -> list[Package]:
    dev = load_device("tiny")
    return [repeat_program(dev, 5), repeat_program(dev, 2), ksplit_matmul(dev)[0]]


def _truth(pkg: Package) -> np.ndarray:
    return calibrate.constants(calibrate.on_device(pkg, **calibrate.PERTURBED).device)


def test_synthetic_fit_recovers_perturbed_constants(packages: list[Package],
                                                     tmp_path: Path) -> None:
    text = calibrate.main(packages, tmp_path)
    assert (tmp_path / "calibrate.txt").read_text() == text + "\n"
    assert (tmp_path / "calibrate.png").stat().st_size > 1000
    assert text.startswith("SYNTHETIC calibration")
    assert "no siglip-so400m 1-layer package" in text
    _, res, nominal = calibrate.synthetic(packages)
    truth = _truth(packages[0])
    assert truth.tolist() == pytest.approx([1.0, 760 + 40, 1 / 3, 35])
    assert res.identified.all()
    # exact up to the per-execution ceil of exchange cycles at 3 bytes/cycle
    assert res.values == pytest.approx(truth, rel=5e-3)
    assert np.abs(res.residuals).max() <= 2.0
    assert nominal == [run(p, numerics=False).cycles for p in packages]


def test_features_reproduce_the_nominal_simulation(packages: list[Package]) -> None:
    for pkg in packages:
        linear = calibrate.on_device(pkg, **calibrate.LINEAR)
        f, offset = calibrate.features(linear)
        sim = run(linear, numerics=False).cycles_per_step
        assert np.array_equal(f @ calibrate.constants(pkg.device) + offset, sim)


def test_unidentifiable_constant_is_reported(packages: list[Package]) -> None:
    ksplit = packages[2]  # no Repeat: the loop overhead has no feature
    f, _ = calibrate.features(ksplit)
    y = run(calibrate.on_device(ksplit, **calibrate.PERTURBED), numerics=False).cycles_per_step
    res = calibrate.fit(f[f.any(axis=1)], y[f.any(axis=1)].astype(np.float64))
    assert not res.identified[3] and np.isnan(res.values[3])


def test_fit_from_saved_results(packages: list[Package], tmp_path: Path) -> None:
    """--from: results in the hardware format (SYNTHETIC ones here) matched by hash."""
    pdirs, rdirs = [], []
    for i, pkg in enumerate(packages):
        sim = run(calibrate.on_device(pkg, **calibrate.PERTURBED), numerics=False)
        r = HardwareResult(pkg.content_hash(), pkg.device.name, sim.cycles,
                           step_cycles=sim.cycles_per_step.copy(), meta={"synthetic": True})
        pdirs.append(str(save_package(pkg, tmp_path / f"p{i}")))
        rdirs.append(str(save_hardware_result(r, tmp_path / f"r{i}", pkg)))
    out = tmp_path / "art"
    assert calibrate._cli(["--packages", *pdirs, "--from", *rdirs, "--out", str(out)]) == 0
    text = (out / "calibrate.txt").read_text()
    assert "3 SYNTHETIC results (per-step cycles)" in text
    _, res = calibrate.measured(rdirs, packages)
    assert res.values == pytest.approx(_truth(packages[0]), rel=5e-3)
    # totals only: three rows cannot identify four constants, and the rank says so
    tdirs = []
    for i, (pkg, d) in enumerate(zip(packages, rdirs, strict=True)):
        r = load_hardware_result(d)
        tdirs.append(str(save_hardware_result(dataclasses.replace(r, step_cycles=None),
                                              tmp_path / f"t{i}", pkg)))
    text, res = calibrate.measured(tdirs, packages)
    assert "(total cycles), rank 3" in text and res.rank == 3
    with pytest.raises(ValueError, match="not among --packages"):
        calibrate.measured(rdirs[:1], packages[1:])
