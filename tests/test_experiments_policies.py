"""experiments/baseline_policies.py: the small variant runs both policies,
writes its table and plot; values are consistent; a failed baseline is a row
naming the BuildFailure's stage and tile."""

from __future__ import annotations

from pathlib import Path

from experiments import baseline_policies as mod


def test_policies_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--out-dir", str(tmp_path)])
    assert (tmp_path / "baseline_policies.txt").read_text().strip() == text.strip()
    assert (tmp_path / "baseline_policies.png").stat().st_size > 0
    lines = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]
    assert [r[3] for r in rows] == list(mod.POLICIES) * len(mod.SMALL_CASES)
    for r in rows:
        assert r[:3] == ["vit-tiny", "1", "1"] and r[4] == "ok"
        cycles, peak, live = (int(r[i].replace(",", "")) for i in (5, 7, 8))
        assert cycles > 0 and 0 < peak <= 638976
        # every tile's peak live tensor bytes is at most its tensor range
        assert live <= 1472 * peak
        assert 0 < float(r[6].rstrip("%")) < 100 and float(r[9]) > 0
    assert "observed, capacity policy:" in text and mod.COMMAND in text


def test_policy_failure_row() -> None:
    # vit-tiny's patch weight cell does not fit the 64 KiB `tiny` tile
    for policy in mod.POLICIES:
        row = mod.measure("vit-tiny", 1, 1, policy, "tiny")
        assert not row.ok and row.stage == "expand" and row.tile == 0
        assert row.failure.startswith("expand: tile 0:") and "need" in row.failure
        cells = mod.cells(row)
        assert cells[4] == "FAIL expand" and cells[5] == "-"
    text = mod.report([row], "tiny")
    assert f"- vit-tiny 1L b1 {policy}: expand: tile 0:" in text
