"""The `tileplan` CLI: listings, reference run, and one-line errors with exit statuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli import COMMANDS, exit_status, main
from simulator.device import PRESET_DIR
from tilecommon.errors import (
    BuildFailure,
    ConfigError,
    GraphError,
    PackageInvalid,
    SimulationFault,
    TileplanError,
    Unsupported,
)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_devices_lists_presets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "devices")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["device", "tiles"]
    assert lines[1].split() == ["c600", "1472", "624", "KiB", "1.5", "GHz", "565.2"]
    assert lines[2].split()[:2] == ["c600-ideal", "1472"]
    assert lines[3].split()[:2] == ["tiny", "16"]


def test_devices_shows_user_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text((PRESET_DIR / "tiny.toml").read_text().replace("tiles = 16", "tiles = 32"))
    code, out, _ = _run(capsys, "devices", str(path))
    assert code == 0
    assert "tiles" in out and any(line.split() == ["tiles", "32"] for line in out.splitlines())
    assert any(line.split() == ["memory_base", "0x4c000"] for line in out.splitlines())


def test_models_lists_zoo(capsys: pytest.CaptureFixture[str], micro_toml: Path) -> None:
    code, out, _ = _run(capsys, "models")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert sorted(rows) == ["bert-base", "minilm-l6", "pe-core-l14", "qwen2.5-0.5b",
                            "siglip-so400m", "siglip-so400m-map", "vit-micro", "vit-tiny"]
    assert rows["siglip-so400m"][9] == "412,987,248"
    assert rows["siglip-so400m-map"][9] == "428,225,600"  # the whole tower with the MAP head
    assert rows["siglip-so400m"][10] == "666.45"  # GFLOP per image, 27 layers
    assert rows["bert-base"][1:2] + rows["bert-base"][5:6] == ["encoder", "-"]
    assert rows["qwen2.5-0.5b"][1] == "decoder" and rows["qwen2.5-0.5b"][9] == "494,032,768"
    code, out, _ = _run(capsys, "models", str(micro_toml), "--layers", "1")
    assert code == 0 and out.splitlines()[1].split()[:9] == [
        "vit-micro", "vit", "32", "2", "64", "4", "10", "1", "2"]


def test_reference_prints_stats(capsys: pytest.CaptureFixture[str], micro_toml: Path) -> None:
    code, out, err = _run(capsys, "reference", str(micro_toml), "--seed", "3")
    assert code == 0 and err == ""
    assert "layers 2, batch 2" in out and "seed 3" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("out "))
    assert row[1] == "20x32" and row[-1] == "0"
    assert abs(float(row[2])) < 0.1 and 0.5 < float(row[3]) < 1.5  # LayerNorm output
    assert "forward" in out.splitlines()[-1]


def _bad_device(tmp_path: Path) -> Path:
    path = tmp_path / "bad-device.toml"
    path.write_text((PRESET_DIR / "tiny.toml").read_text().replace("tiles = 16", "tiles = -4"))
    return path


def _bad_model(tmp_path: Path, micro_toml: Path) -> Path:
    path = tmp_path / "bad-model.toml"
    path.write_text(micro_toml.read_text().replace("heads = 2", "heads = 5"))
    return path


def test_bad_inputs_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, micro_toml: Path
) -> None:
    bad_dev, bad_model = _bad_device(tmp_path), _bad_model(tmp_path, micro_toml)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(micro_toml.read_text() + "dropout = 0.1\n")
    cases = [
        (["devices", str(bad_dev)], str(bad_dev), "tiles"),
        (["devices", "c700"], "c700", "device"),
        (["models", str(bad_model)], str(bad_model), "heads"),
        (["models", str(unknown)], str(unknown), "dropout"),
        (["reference", str(bad_model)], str(bad_model), "heads"),
        (["reference", str(micro_toml), "--layers", "0"], "tileplan reference", "--layers"),
    ]
    for argv, source, field in cases:
        code, out, err = _run(capsys, *argv)
        assert code == 2, argv
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("tileplan: error: "), err
        assert source in err and f"field '{field}'" in err, err


def test_console_script_and_module(tmp_path: Path, micro_toml: Path) -> None:
    bad = _bad_model(tmp_path, micro_toml)
    proc = subprocess.run([sys.executable, "-m", "planner", "models", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"tileplan: error: {bad}: field 'heads': must divide hidden (32) (got 5)"]
    bad_dev = _bad_device(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "planner", "devices", str(bad_dev)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        f"tileplan: error: {bad_dev}: field 'tiles': out of range [1, 1048576] (got -4)"]


def test_exit_status_mapping() -> None:
    assert exit_status(ConfigError("f.toml", "x", "bad")) == 2
    assert exit_status(Unsupported("Conv", "no kernel")) == 2
    assert exit_status(GraphError("mm", "bad")) == 2
    assert exit_status(BuildFailure("allocate", 3, 10, 5, "no room")) == 3
    assert str(BuildFailure("allocate", 3, 10, 5, "no room")) == \
        "allocate: tile 3: no room (need 10 bytes, have 5)"
    # not a memory failure: no bytes clause
    assert str(BuildFailure("lower", -1, 0, 0, "no grid divides")) == \
        "lower: device: no grid divides"
    assert exit_status(PackageInvalid("bad")) == 1
    assert exit_status(SimulationFault("fault")) == 1
    assert exit_status(TileplanError("other")) == 1


def test_registry_names_and_argparse_errors(capsys: pytest.CaptureFixture[str]) -> None:
    names = [c.name for c in COMMANDS]
    assert names[:3] == ["devices", "models", "reference"] and len(set(names)) == len(names)
    assert main(["nosuchcommand"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nosuchcommand" in err[0]
