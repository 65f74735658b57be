"""experiments/sweeps/*.toml parse into the studies they describe, and
experiments/run_sweeps.py runs one and publishes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import run_sweeps
from planner.sweep import load_sweep


def test_the_study_sweeps_parse() -> None:
    got = {p.stem: load_sweep(p) for p in sorted(run_sweeps.SWEEPS.glob("*.toml"))}
    assert sorted(got) == ["baseline-policies", "scaling-batch", "scaling-devices",
                           "scaling-layers"]
    assert [c["layers"] for c in got["scaling-layers"].cases] == [1, 2, 4, 8, 27]
    assert {c["baseline"] for c in got["baseline-policies"].cases} == {"default", "element",
                                                                       "capacity"}
    devices = {Path(c["device"]).name for c in got["scaling-devices"].cases}
    assert devices == {"c600-368.toml", "c600-736.toml", "c600"}
    assert all(Path(c["device"]).is_file() for c in got["scaling-devices"].cases
               if c["device"].endswith(".toml"))


def test_run_one_publishes_the_table(tmp_path: Path) -> None:
    f = tmp_path / "mini.toml"
    f.write_text('[sweep]\nmodel = ["vit-micro"]\ndevice = ["tiny"]\nlayers = [1, 2]\n'
                 'optimization_steps = [0]\nnumerics = [false]\n'
                 '[plot]\nmetric = "cycles"\naxis = "layers"\n')
    text = run_sweeps.run_one(f, workers=1, out_root=tmp_path)
    assert (tmp_path / "mini.txt").read_text().strip() == text.strip()
    assert (tmp_path / "sweeps" / "mini" / "cycles-vs-layers.png").is_file()
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["layers", "status", "cycles"] and len(lines) >= 4
