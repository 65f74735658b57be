"""experiments/bench_import.py: deepened fixtures import with every layer."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_import as mod


def test_bench_import_small(tmp_path: Path) -> None:
    text = mod.main(["--layers", "2,4", "--repeats", "1", "--out-dir", str(tmp_path)])
    assert (tmp_path / "bench_import.txt").read_text().strip() == text.strip()
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [int(r[0]) for r in rows] == [2, 4]
    assert [int(r[2]) for r in rows] == [1 + 3 + 10 * d + 1 for d in (2, 4)]  # parts found
