"""experiments/bench_optimizer.py: the small variant runs and writes its table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_optimizer_small(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_optimizer",
                                                  ROOT / "experiments" / "bench_optimizer.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "bench.txt"
    text = mod.main(["--small", "--out", str(out)])
    assert out.read_text().strip() == text.strip()
    rows = text.splitlines()[2:]
    assert len(rows) == len(mod.SMALL_CASES)
    cells = rows[0].split()
    assert cells[0] == "vit-tiny" and cells[2] == str(mod.SMALL_STEPS)
    base, final = (int(c.replace(",", "")) for c in cells[3:5])
    assert 0 < final <= base
    assert float(cells[5].rstrip("%")) == round(100 * (base - final) / base, 1)
    assert int(cells[7]) == mod.SMALL_STEPS  # evaluated proposals
