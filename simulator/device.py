"""The device: a frozen description of one IPU-class chip (DESIGN §3).

Presets live in `simulator/devices/<name>.toml`; a user may pass any TOML file
with the same fields.  Every field is required; an unknown, missing, mistyped
or out-of-range field raises `ConfigError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.exceptions import ConfigError
from kernels.tile import TileDesc
from simulator.config import Limits, check_fields, read_toml

PRESET_DIR = Path(__file__).resolve().parent / "devices"


@dataclass(frozen=True)
class Device:
    """One chip.  Units: cycles, bytes, Hz.

    Memory addresses on a tile run from `memory_base` to
    `memory_base + memory_size`; the SRAM is split into `element_bytes`
    elements (two operand streams of one vertex in one element conflict).
    """

    name: str
    tiles: int
    clock_hz: float
    memory_base: int
    memory_size: int
    element_bytes: int
    alignment: int
    workers: int
    amp_macs_fp8: int
    amp_macs_fp16: int
    vector_fp32: int
    vector_fp16: int
    exchange_in_bytes_per_cycle: int
    exchange_out_bytes_per_cycle: int
    sync_cycles: int
    exchange_table_bytes_per_transfer: int
    code_bytes_per_vertex: int
    vertex_overhead_cycles: int
    loop_overhead_cycles: int
    support_bytes: int

    @property
    def memory_end(self) -> int:
        return self.memory_base + self.memory_size

    @property
    def peak_fp8_flops(self) -> float:
        """Peak fp8 FLOP/s of the whole chip (2 FLOPs per MAC)."""
        return self.tiles * 2.0 * self.amp_macs_fp8 * self.clock_hz

    def tile_desc(self) -> TileDesc:
        """The part of the device one tile's kernels see."""
        return TileDesc(
            amp_macs_fp8=self.amp_macs_fp8,
            amp_macs_fp16=self.amp_macs_fp16,
            vector_fp32=self.vector_fp32,
            vector_fp16=self.vector_fp16,
            workers=self.workers,
            element_bytes=self.element_bytes,
            memory_base=self.memory_base,
            vertex_overhead=self.vertex_overhead_cycles,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Device:
        return _validate(data, source)


# field -> (type, minimum, maximum); ints must be ints, floats accept ints.
_LIMITS: Limits = {
    "tiles": (int, 1, 1 << 20),
    "clock_hz": (float, 1e6, 1e11),
    "memory_base": (int, 0, 1 << 40),
    "memory_size": (int, 1024, 1 << 32),
    "element_bytes": (int, 64, 1 << 30),
    "alignment": (int, 1, 4096),
    "workers": (int, 1, 64),
    "amp_macs_fp8": (int, 1, 1 << 16),
    "amp_macs_fp16": (int, 1, 1 << 16),
    "vector_fp32": (int, 1, 1 << 12),
    "vector_fp16": (int, 1, 1 << 12),
    "exchange_in_bytes_per_cycle": (int, 1, 1 << 12),
    "exchange_out_bytes_per_cycle": (int, 1, 1 << 12),
    "sync_cycles": (int, 0, 1 << 24),
    "exchange_table_bytes_per_transfer": (int, 0, 1 << 12),
    "code_bytes_per_vertex": (int, 0, 1 << 12),
    "vertex_overhead_cycles": (int, 0, 1 << 20),
    "loop_overhead_cycles": (int, 0, 1 << 20),
    "support_bytes": (int, 0, 1 << 30),
}


def _validate(data: dict[str, Any], source: str) -> Device:
    values = check_fields(data, source, _LIMITS)
    align = values["alignment"]
    if values["memory_size"] % align or values["memory_base"] % align:
        raise ConfigError(source, "alignment", "memory_base and memory_size must be multiples",
                          align)
    if values["support_bytes"] >= values["memory_size"]:
        raise ConfigError(source, "support_bytes", "must leave room in memory_size",
                          values["support_bytes"])
    return Device(**values)


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_device(name_or_path: str | Path) -> Device:
    """Load a preset by name (`c600`, `tiny`) or a user TOML file by path.

    Raises ConfigError naming the file and field on any bad input.
    """
    data, source = read_toml(name_or_path, PRESET_DIR, "device")
    if "device" in data and isinstance(data["device"], dict) and len(data) == 1:
        data = data["device"]
    return _validate(data, source)
