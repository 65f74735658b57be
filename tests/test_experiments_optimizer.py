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
    arows = [line.split() for line in anchor.splitlines()[2:]]
    assert len(arows) == len(mod.SMALL_ANCHOR_CASES)
    assert [r[3] for r in arows] == ["1", "2"] and arows[0][-1] == arows[1][-1]
    assert arows[0][5] == arows[1][5] and float(arows[0][7]) > 0.05  # cycles; RSS in GB
