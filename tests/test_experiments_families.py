"""experiments/model_families.py: the small variant plans, splits and writes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import model_families as mod


def test_model_families_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--steps", "1", "--out-dir", str(tmp_path)])
    assert (tmp_path / "model_families.txt").read_text().strip() == text.strip()
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [r[0] for r in rows] == [m for m, _ in mod.SMALL]
    assert [r[1] for r in rows] == ["vit", "encoder"]
    for r in rows:
        assert r[-1] == "ok" and int(r[4].replace(",", "")) > 0
        shares = [float(c.rstrip("%")) for c in r[6:10]]
        assert abs(sum(shares) - 100.0) < 0.5  # compute + exchange + sync + loop
