"""experiments/bench_planning.py: the small variant runs and writes its table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_planning_small(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_planning",
                                                  ROOT / "experiments" / "bench_planning.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "bench.txt"
    text = mod.main(["--small", "--out", str(out)])
    assert out.read_text().strip() == text.strip()
    rows = text.splitlines()[2:]
    assert len(rows) == len(mod.SMALL_CASES)
    cells = rows[0].split()
    assert cells[0] == "vit-tiny" and cells[-1] == "ok"
    assert int(cells[3].replace(",", "")) > 0  # cycles
    assert float(cells[4].rstrip("%")) > 0  # roofline percent
