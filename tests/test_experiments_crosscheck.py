"""The engine cross-check runs end to end on its small case and writes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import crosscheck_engines


def test_crosscheck_engines_small(tmp_path: Path) -> None:
    table = crosscheck_engines.main(crosscheck_engines.SMALL_CASES, out_dir=tmp_path,
                                     repeats=1)
    assert (tmp_path / "crosscheck_engines.txt").read_text() == table
    rows = table.splitlines()
    assert len(rows) == 1 + len(crosscheck_engines.SMALL_CASES) + 1
    cols = rows[1].split()
    assert cols[:3] == ["vit-micro", "tiny", "1"]
    numba_cycles, simpy_cycles, agree = int(cols[5]), int(cols[6]), cols[7]
    assert numba_cycles == simpy_cycles > 0 and agree == "yes"
