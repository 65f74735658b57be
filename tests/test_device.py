"""Devices: the presets' facts, user TOMLs, and every kind of bad device input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import simulator
from kernels.exceptions import ConfigError
from simulator.device import PRESET_DIR, Device, load_device, preset_names


def test_c600_facts() -> None:
    d = load_device("c600")
    assert (d.tiles, d.memory_base, d.memory_size, d.element_bytes) == (1472, 0x4C000, 638976,
                                                                        16384)
    assert (d.workers, d.clock_hz, d.amp_macs_fp8, d.amp_macs_fp16) == (6, 1.5e9, 128, 64)
    assert (d.exchange_in_bytes_per_cycle, d.exchange_out_bytes_per_cycle) == (4, 4)
    assert d.sync_cycles == 600 and d.alignment == 8
    assert d.memory_end == 0x4C000 + 638976
    assert d.peak_fp8_flops == pytest.approx(1472 * 2 * 128 * 1.5e9)  # 565.2 TFLOP/s
    assert d.tile_desc().amp_macs_fp8 == 128 and d.tile_desc().memory_base == 0x4C000


def test_presets_and_roundtrip(tmp_path: Path) -> None:
    assert preset_names() == ["c600", "tiny"]
    assert simulator.load_device is load_device
    tiny = load_device("tiny")
    assert (tiny.tiles, tiny.memory_size) == (16, 65536)
    assert Device.from_dict(tiny.to_dict()) == tiny
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.tiles = 3  # type: ignore[misc]
    # a user file, flat or wrapped in a [device] table, loads by path
    flat = tmp_path / "mine.toml"
    flat.write_text((PRESET_DIR / "tiny.toml").read_text().replace('"tiny"', '"mine"'))
    assert load_device(flat) == dataclasses.replace(tiny, name="mine")
    wrapped = tmp_path / "wrapped.toml"
    wrapped.write_text("[device]\n" + flat.read_text())
    assert load_device(str(wrapped)).name == "mine"


def _tiny_text() -> str:
    return (PRESET_DIR / "tiny.toml").read_text()


@pytest.mark.parametrize(
    "text, field, message",
    [
        (_tiny_text().replace("tiles = 16\n", ""), "tiles", "missing"),
        (_tiny_text() + "hbm_bytes = 0\n", "hbm_bytes", "unknown field"),
        (_tiny_text().replace("tiles = 16", 'tiles = "16"'), "tiles", "must be int"),
        (_tiny_text().replace("tiles = 16", "tiles = 16.5"), "tiles", "must be an integer"),
        (_tiny_text().replace("workers = 6", "workers = true"), "workers", "must be int"),
        (_tiny_text().replace("tiles = 16", "tiles = 0"), "tiles", "out of range"),
        (_tiny_text().replace("clock_hz = 1.5e9", "clock_hz = -1.0"), "clock_hz", "out of range"),
        (_tiny_text().replace("memory_size = 65536", "memory_size = 65537"), "alignment",
         "multiples"),
        (_tiny_text().replace("support_bytes = 2048", "support_bytes = 65536"),
         "support_bytes", "must leave room"),
        (_tiny_text().replace('name = "tiny"', "name = 7"), "name", "non-empty string"),
        ("tiles = = 3\n", "toml", "not valid TOML"),
        ("this is not toml at all {\n", "toml", "not valid TOML"),
    ],
)
def test_bad_device_toml(tmp_path: Path, text: str, field: str, message: str) -> None:
    path = tmp_path / "dev.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_device(path)
    assert info.value.field == field and info.value.source == str(path)
    assert str(info.value).startswith(f"{path}: field '{field}'")


def test_binary_file_and_missing_file_and_bad_preset(tmp_path: Path) -> None:
    binary = tmp_path / "dev.toml"
    binary.write_bytes(b"\xff\xfe\x00\x81 tiles")
    with pytest.raises(ConfigError, match="not a text file") as info:
        load_device(binary)
    assert info.value.field == "toml"
    with pytest.raises(ConfigError, match="file not found") as info:
        load_device(tmp_path / "absent.toml")
    assert info.value.field == "device"
    with pytest.raises(ConfigError, match="no such preset") as info:
        load_device("c700")
    assert info.value.source == "c700" and info.value.field == "device"
    assert "c600" in str(info.value)
