"""experiments/bench_planning.py: the small variant runs and writes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_planning as mod


def test_bench_planning_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--out-dir", str(tmp_path)])
    assert (tmp_path / "bench_planning.txt").read_text().strip() == text.strip()
    rows = text.splitlines()[2:]
    assert len(rows) == len(mod.SMALL_CASES)
    cells = rows[0].split()
    assert cells[0] == "vit-tiny" and cells[-1] == "ok"
    assert int(cells[3].replace(",", "")) > 0  # cycles
    assert float(cells[4].rstrip("%")) > 0  # roofline percent
