"""experiments/bench_optimizer.py: the small variant runs and writes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_optimizer as mod


def test_bench_optimizer_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--out-dir", str(tmp_path)])
    assert (tmp_path / "bench_optimizer.txt").read_text().strip() == text.strip()
    first, anchor = text.split("\n\n")
    rows = first.splitlines()[2:]
    assert len(rows) == len(mod.SMALL_CASES)
    cells = rows[0].split()
    assert cells[0] == "vit-tiny" and cells[2] == str(mod.SMALL_STEPS)
    base, final = (int(c.replace(",", "")) for c in cells[3:5])
    assert 0 < final <= base
    assert float(cells[5].rstrip("%")) == round(100 * (base - final) / base, 1)
    assert int(cells[7]) == mod.SMALL_STEPS  # evaluated proposals
    # the per-process cases: one row each, the same package serial and with two jobs
    lines = anchor.splitlines()
    arows = [line.split() for line in lines[2:2 + len(mod.SMALL_ANCHOR_CASES)]]
    assert [r[3] for r in arows] == ["1", "2"] and arows[0][-1] == arows[1][-1]
    assert arows[0][5] == arows[1][5] and float(arows[0][9]) > 0.05  # cycles; RSS in GB
    plan_s, trials_s = float(arows[0][6]), float(arows[0][7])
    assert 0 < trials_s < plan_s and int(arows[0][8]) <= mod.SMALL_STEPS
    # two jobs against serial, and the ceiling: serial / (serial - trials / 2)
    spec = lines[-1]
    assert spec.startswith("vit-tiny 1 layers batch 1: 2 jobs ")
    ceiling = float(spec.split("for free ")[1].split("x")[0])
    assert abs(ceiling - plan_s / (plan_s - trials_s / 2)) < 0.02
