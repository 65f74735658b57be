"""experiments/scaling.py: the small variant runs, writes its table and plot,
and its values are consistent (cycles grow with layers and batch, planning
time is reported, a device too small for the model fails with stage and tile)."""

from __future__ import annotations

from pathlib import Path

from experiments import scaling as mod


def _rows(text: str) -> list[list[str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[1:]]


def test_scaling_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--out-dir", str(tmp_path)])
    assert (tmp_path / "scaling.txt").read_text().strip() == text.strip()
    assert (tmp_path / "scaling.png").stat().st_size > 0
    rows = _rows(text)
    small = mod.SMALL
    by: dict[str, list[list[str]]] = {}
    for r in rows:
        by.setdefault(r[0], []).append(r)
    assert [int(r[2]) for r in by["layers"]] == list(small.layers)
    assert [int(r[4]) for r in by["device"]] == list(small.tiles)
    for name in ("layers", "batch"):
        pts = by[name]
        assert all(r[5] == "ok" for r in pts)
        cycles = [int(r[6].replace(",", "")) for r in pts]
        assert cycles == sorted(cycles) and cycles[0] < cycles[-1], (name, cycles)
        assert all(float(r[9]) > 0 for r in pts)
    # the shared point (1 layer, batch 1, device_tiles) is one measurement
    one = [r for r in rows if r[2] == "1" and r[3] == "1" and r[4] == str(small.device_tiles)]
    assert len(one) == 3 and len({tuple(r[1:]) for r in one}) == 1
    fail, ok = by["device"]
    assert fail[5] == "FAIL expand" and fail[6] == "-" and ok[5] == "ok"
    failure_line = next(ln for ln in text.splitlines() if ln.startswith("- vit-tiny 1L b1 1 tiles"))
    assert "expand: tile 0:" in failure_line and "need" in failure_line
    assert float(ok[7].rstrip("%")) > 0 and int(ok[8].replace(",", "")) > 0


def test_device_toml_is_the_c600_tile(tmp_path: Path) -> None:
    from simulator.device import load_device

    dev = load_device(mod.device_toml(368, tmp_path))
    c600 = load_device("c600")
    assert dev.tiles == 368
    assert {**dev.to_dict(), "tiles": 0, "name": ""} == {**c600.to_dict(), "tiles": 0, "name": ""}
