"""Devices: the presets' facts, the cost table, inheritance, first-wave flat
TOMLs, user TOMLs, and every kind of bad device input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import simulator
from kernels.tile import D_LEN, DESC_FIELDS, KERNEL_COSTS
from simulator.device import (
    COST_FIELDS,
    KERNEL_NAMES,
    PRESET_DIR,
    Device,
    load_device,
    preset_names,
)
from tilecommon.errors import ConfigError


def test_c600_facts() -> None:
    d = load_device("c600")
    assert (d.tiles, d.memory_base, d.memory_size, d.element_bytes) == (1472, 0x4C000, 638976,
                                                                        16384)
    assert (d.workers, d.clock_hz, d.amp_macs_fp8, d.amp_macs_fp16) == (6, 1.5e9, 128, 64)
    c = d.costs
    assert (c.exchange_in_bytes_per_cycle, c.exchange_out_bytes_per_cycle) == (4, 4)
    assert c.sync_cycles == 600 and d.alignment == 8
    assert d.memory_end == 0x4C000 + 638976
    assert d.peak_fp8_flops == pytest.approx(1472 * 2 * 128 * 1.5e9)  # 565.2 TFLOP/s
    desc = d.tile_desc()
    assert desc.memory_base == 0x4C000 and desc.mm_panel == c.mm_panel
    assert d.exchange_fixed_cycles == c.sync_cycles + c.exchange_setup_cycles


def test_descriptor_indices_follow_the_field_list() -> None:
    """One source: the D_* constants of kernels.tile are the positions of
    DESC_FIELDS, and every kernel cost constant is a device cost field."""
    import kernels.tile as tile

    for i, name in enumerate(DESC_FIELDS):
        assert getattr(tile, f"D_{name.upper()}") == i, name
    assert D_LEN == len(DESC_FIELDS)
    assert {f for f, *_ in KERNEL_COSTS} <= set(COST_FIELDS)


def test_presets_and_roundtrip(tmp_path: Path) -> None:
    assert preset_names() == ["c600", "c600-ideal", "tiny"]
    assert simulator.load_device is load_device
    tiny = load_device("tiny")
    assert (tiny.tiles, tiny.memory_size) == (16, 65536)
    assert Device.from_dict(tiny.to_dict()) == tiny
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny.tiles = 3  # type: ignore[misc]
    # tiny takes c600's cycle costs, with a toy footprint
    c600 = load_device("c600")
    for f in ("mm_call", "mm_panel", "reduce_chunk", "sync_cycles", "gelu_block"):
        assert getattr(tiny.costs, f) == getattr(c600.costs, f)
    assert tiny.costs.runtime_bytes == 0 < c600.costs.runtime_bytes
    # a user file, flat or wrapped in a [device] table, loads by path
    mine = tmp_path / "mine.toml"
    mine.write_text(Path(PRESET_DIR / "tiny.toml").read_text().replace('"tiny"', '"mine"')
                    .replace('base = "c600"', f'base = "{PRESET_DIR / "c600.toml"}"'))
    assert load_device(mine) == dataclasses.replace(tiny, name="mine")
    wrapped = tmp_path / "wrapped.toml"
    wrapped.write_text("[device]\n" + mine.read_text().replace("[costs", "[device.costs"))
    assert load_device(str(wrapped)).name == "mine"


def test_inheritance_sets_only_what_differs(tmp_path: Path) -> None:
    (tmp_path / "half.toml").write_text('base = "c600"\ntiles = 736\n[costs]\nsync_cycles = 700\n')
    (tmp_path / "halfer.toml").write_text('name = "q"\nbase = "half.toml"\n'
                                          '[costs.kernel_image_bytes]\nMATMUL = 4096\n')
    c600 = load_device("c600")
    half = load_device(tmp_path / "half.toml")
    assert half.name == "half" and half.tiles == 736 and half.costs.sync_cycles == 700
    assert half.costs.mm_call == c600.costs.mm_call
    q = load_device(tmp_path / "halfer.toml")  # a base given relative to the file
    assert (q.name, q.tiles, q.costs.sync_cycles) == ("q", 736, 700)
    assert q.costs.image_bytes(1) == 4096 and q.costs.image_bytes(2) == c600.costs.image_bytes(2)
    (tmp_path / "a.toml").write_text('base = "b.toml"\n')
    (tmp_path / "b.toml").write_text('base = "a.toml"\n')
    with pytest.raises(ConfigError, match="circle") as info:
        load_device(tmp_path / "a.toml")
    assert info.value.field == "base"


def test_first_wave_flat_toml_takes_c600_costs(tmp_path: Path) -> None:
    flat = tmp_path / "old.toml"
    flat.write_text("\n".join([
        'name = "old"', "tiles = 64", "clock_hz = 1.5e9", "memory_base = 0x4C000",
        "memory_size = 638976", "element_bytes = 16384", "alignment = 8", "workers = 6",
        "amp_macs_fp8 = 128", "amp_macs_fp16 = 64", "vector_fp32 = 2", "vector_fp16 = 4",
        "exchange_in_bytes_per_cycle = 4", "exchange_out_bytes_per_cycle = 4",
        "sync_cycles = 760", "exchange_table_bytes_per_transfer = 12",
        "code_bytes_per_vertex = 16", "vertex_overhead_cycles = 40",
        "loop_overhead_cycles = 20", "support_bytes = 8192", ""]))
    d = load_device(flat)
    c600 = load_device("c600")
    assert d.tiles == 64 and d.costs.mm_panel == c600.costs.mm_panel
    assert d.costs.sync_cycles == 760 and d.costs.support_bytes == 8192
    assert d.costs.vertex_code_bytes == 16
    assert d.costs.xt_send_bytes == d.costs.xt_receive_bytes == 12


def _tiny_text() -> str:
    return (PRESET_DIR / "tiny.toml").read_text()


def _full_text() -> str:
    return (PRESET_DIR / "c600.toml").read_text()


@pytest.mark.parametrize(
    "text, field, message",
    [
        (_full_text().replace("tiles = 1472\n", ""), "tiles", "missing"),
        (_full_text().replace("mm_panel = ", "# mm_panel = "), "costs.mm_panel", "missing"),
        (_full_text().replace("\nMATMUL = ", "\n# MATMUL = "), "costs.kernel_image_bytes.MATMUL",
         "missing"),
        (_tiny_text() + "hbm_bytes = 0\n", "costs.kernel_image_bytes.hbm_bytes",
         "unknown field"),
        (_tiny_text().replace("tiles = 16", "hbm = 0\ntiles = 16"), "hbm", "unknown field"),
        (_tiny_text().replace("[costs]", "[costs]\nmm_paanel = 3"), "costs.mm_paanel",
         "unknown field"),
        (_tiny_text().replace("tiles = 16", 'tiles = "16"'), "tiles", "must be int"),
        (_tiny_text().replace("tiles = 16", "tiles = 16.5"), "tiles", "must be an integer"),
        (_tiny_text().replace("[costs]", "[costs]\nmm_row = 2.5"), "costs.mm_row",
         "must be an integer"),
        (_tiny_text().replace("[costs]", "[costs]\nconflict_percent = 50"),
         "costs.conflict_percent", "out of range"),
        (_tiny_text().replace("tiles = 16", "workers = true\ntiles = 16"), "workers",
         "must be int"),
        (_tiny_text().replace("tiles = 16", "tiles = 0"), "tiles", "out of range"),
        (_tiny_text().replace("tiles = 16", "clock_hz = -1.0\ntiles = 16"), "clock_hz",
         "out of range"),
        (_tiny_text().replace("memory_size = 65536", "memory_size = 65537"), "alignment",
         "multiples"),
        (_tiny_text().replace("support_bytes = 2048", "support_bytes = 65536"),
         "costs.support_bytes", "must leave room"),
        (_tiny_text().replace('name = "tiny"', "name = 7"), "name", "non-empty string"),
        (_tiny_text().replace('base = "c600"', "base = 3"), "base", "preset name or a path"),
        (_tiny_text().replace('base = "c600"', "sync_cycles = 700\nbase = \"c600\""),
         "sync_cycles", r"beside a \[costs\] table"),
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


def test_bad_base_names_the_base(tmp_path: Path) -> None:
    path = tmp_path / "dev.toml"
    path.write_text('base = "c700"\n')
    with pytest.raises(ConfigError, match="no such preset") as info:
        load_device(path)
    assert info.value.source == "c700"


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


def test_cost_table_lists_every_kernel() -> None:
    d = load_device("c600")
    assert tuple(d.costs.to_dict()["kernel_image_bytes"]) == KERNEL_NAMES
    assert d.with_costs(sync_cycles=1).costs.sync_cycles == 1
    with pytest.raises(KeyError):
        d.with_costs(nope=1)
