"""The device: a frozen description of one IPU-class chip and its cost model.

A `Device` holds the hardware facts (tiles, clock, tile memory, SRAM element,
alignment, workers, AMP peak rates) and a `Costs` table: every constant a cycle
or footprint model uses — the kernels' call, panel, row and vector costs
(kernels.tile.KERNEL_COSTS), the exchange (sync, setup, payload bytes per
cycle, send and receive control cycles), Repeat loops and the bytes of code,
exchange tables and runtime state a tile holds (`SIM_COSTS`, plus one
executable image size per kernel).

TOML (presets in `simulator/devices/<name>.toml`, or any user file):

    name = "mine"
    base = "c600"          # optional: a preset name or a path (relative to this file)
    tiles = 736            # hardware fields ...
    [costs]                # ... and cost constants; with `base`, only what differs
    sync_cycles = 700
    [costs.kernel_image_bytes]
    MATMUL = 4096

Without `base` every hardware field is required; the cost table then must be
complete, or absent: a flat table with no `[costs]` (the first wave's format)
takes c600's costs, and its old top-level cost fields are read as the `[costs]`
field of the same meaning (`sync_cycles`, `loop_overhead_cycles`,
`exchange_in_bytes_per_cycle`, `exchange_out_bytes_per_cycle`, `support_bytes`;
`code_bytes_per_vertex` = `vertex_code_bytes`; `exchange_table_bytes_per_transfer`
= `xt_send_bytes` = `xt_receive_bytes`); `vertex_overhead_cycles`,
`vector_fp16` and `vector_fp32`, which no model reads any more, are accepted and
ignored.  An unknown, missing, mistyped or out-of-range field raises
`ConfigError` naming the file and the field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernels.registry import KERNELS
from kernels.tile import KERNEL_COSTS, TileDesc
from tilecommon.config import Limits, check_fields, is_path, read_toml
from tilecommon.errors import ConfigError

PRESET_DIR = Path(__file__).resolve().parent / "devices"
DEFAULT_COSTS = "c600"

# (name, minimum, maximum, meaning) of the exchange, loop and footprint constants
SIM_COSTS: tuple[tuple[str, int, int, str], ...] = (
    ("sync_cycles", 0, 1 << 24, "cycles of the global sync before each exchange phase"),
    ("exchange_setup_cycles", 0, 1 << 20,
     "cycles of each exchange phase beyond its transfers (entry, pointer setup, exit)"),
    ("exchange_in_bytes_per_cycle", 1, 1 << 12, "payload bytes a tile receives per cycle"),
    ("exchange_out_bytes_per_cycle", 1, 1 << 12, "payload bytes a tile sends per cycle"),
    ("send_cycles", 0, 1 << 12, "supervisor cycles to issue one send instruction"),
    ("send_max_bytes", 4, 1 << 20, "payload bytes one send instruction carries at most"),
    ("receive_cycles", 0, 1 << 12, "control cycles per received transfer (control + pointer)"),
    ("arrival_latency_cycles", 0, 1 << 16,
     "cycles from a word leaving its sender to its arrival on a receiver of the same row"),
    ("arrival_latency_row_cycles", 0, 1 << 12,
     "further arrival cycles per physical row between sender and receiver"),
    ("tiles_per_row", 1, 1 << 20, "tiles per physical row (tile t sits on row t // tiles_per_row)"),
    ("loop_overhead_cycles", 0, 1 << 20, "cycles of one hardware Repeat iteration"),
    ("patch_word_cycles", 0, 1 << 12,
     "cycles per patched word on the busiest tile at each Repeat transition"),
    ("runtime_bytes", 0, 1 << 24, "linked runtime executable bytes on every tile"),
    ("vertex_code_bytes", 0, 1 << 16, "generated code per vertex call (vertex state + call)"),
    ("step_code_bytes", 0, 1 << 16, "generated code per compute step a tile takes part in"),
    ("loop_code_bytes", 0, 1 << 16, "generated code per Repeat loop on a tile"),
    ("xt_send_bytes", 0, 1 << 12, "exchange-table bytes per send"),
    ("xt_send_long_bytes", 0, 1 << 12, "extra bytes per send longer than xt_long_bytes"),
    ("xt_long_bytes", 1, 1 << 20, "payload bytes above which a send needs the long encoding"),
    ("xt_receive_bytes", 0, 1 << 12, "exchange-table bytes per receive"),
    ("xt_jump_bytes", 0, 1 << 12,
     "extra bytes per receive whose address does not follow the previous receive"),
    ("xt_phase_bytes", 0, 1 << 12,
     "exchange-table bytes per exchange phase on a tile (entry + return)"),
    ("support_bytes", 0, 1 << 30, "runtime state per tile (worker and supervisor stacks)"),
)

COST_FIELDS: tuple[str, ...] = tuple(f for f, *_ in KERNEL_COSTS + SIM_COSTS)
COST_DOCS: dict[str, str] = {f: doc for f, _, _, doc in KERNEL_COSTS + SIM_COSTS}
IMAGE_TABLE = "kernel_image_bytes"
KERNEL_NAMES: tuple[str, ...] = tuple(KERNELS[k].name for k in sorted(KERNELS))

# first-wave top-level cost fields -> the [costs] fields they now set
LEGACY_FIELDS: dict[str, tuple[str, ...]] = {
    "sync_cycles": ("sync_cycles",),
    "loop_overhead_cycles": ("loop_overhead_cycles",),
    "exchange_in_bytes_per_cycle": ("exchange_in_bytes_per_cycle",),
    "exchange_out_bytes_per_cycle": ("exchange_out_bytes_per_cycle",),
    "support_bytes": ("support_bytes",),
    "code_bytes_per_vertex": ("vertex_code_bytes",),
    "exchange_table_bytes_per_transfer": ("xt_send_bytes", "xt_receive_bytes"),
    "vertex_overhead_cycles": (),
    "vector_fp16": (),
    "vector_fp32": (),
}


_COST_INDEX = {name: i for i, name in enumerate(COST_FIELDS)}  # a planner reads ~10⁵ a plan


@dataclass(frozen=True)
class Costs:
    """The cost constants of one device: `values` in COST_FIELDS order and
    `images`, the executable image bytes of each kernel in KERNEL_NAMES order.
    Read a constant as an attribute (`costs.sync_cycles`)."""

    values: tuple[int, ...]
    images: tuple[int, ...]

    def __getattr__(self, name: str) -> int:
        if name in ("values", "images"):  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        try:
            return self.values[_COST_INDEX[name]]
        except KeyError:
            raise AttributeError(name) from None

    def image_bytes(self, kernel_id: int) -> int:
        """Executable image bytes of kernel `kernel_id` (KeyError if unknown)."""
        return self.images[KERNEL_NAMES.index(KERNELS[kernel_id].name)]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(zip(COST_FIELDS, self.values, strict=True))
        out[IMAGE_TABLE] = dict(zip(KERNEL_NAMES, self.images, strict=True))
        return out

    def replace(self, **changes: int) -> Costs:
        """A copy with the named constants changed (KeyError for an unknown name)."""
        for k in changes:
            if k not in COST_FIELDS:
                raise KeyError(f"unknown cost constant {k!r}")
        return Costs(tuple(int(changes.get(f, v)) for f, v in zip(COST_FIELDS, self.values,
                                                                   strict=True)), self.images)


@dataclass(frozen=True)
class Device:
    """One chip.  Units: cycles, bytes, Hz.

    Memory addresses on a tile run from `memory_base` to
    `memory_base + memory_size`; the SRAM is split into `element_bytes`
    elements (two operand streams of one vertex in one element conflict).
    `amp_macs_fp8/fp16` are the AMP's peak MACs per cycle per tile (the
    roofline); the cycle models' own constants are in `costs`.
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
    costs: Costs

    @property
    def memory_end(self) -> int:
        return self.memory_base + self.memory_size

    @property
    def fixed_bytes(self) -> int:
        """Bytes of every tile in use that no plan can use: the runtime state
        and the linked runtime (kernel images and generated code come on top,
        with what the tile runs)."""
        return self.costs.support_bytes + self.costs.runtime_bytes

    @property
    def exchange_fixed_cycles(self) -> int:
        """Cycles of an exchange phase beyond its transfers (sync + setup)."""
        return self.costs.sync_cycles + self.costs.exchange_setup_cycles

    @property
    def peak_fp8_flops(self) -> float:
        """Peak fp8 FLOP/s of the whole chip (2 FLOPs per MAC)."""
        return self.tiles * 2.0 * self.amp_macs_fp8 * self.clock_hz

    def tile_desc(self) -> TileDesc:
        """The part of the device one tile's kernels see."""
        fields = {"workers": self.workers, "element_bytes": self.element_bytes,
                  "memory_base": self.memory_base}
        fields.update(dict(zip(COST_FIELDS, self.costs.values, strict=True)))
        return TileDesc.from_mapping(fields)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "costs"}
        out["costs"] = self.costs.to_dict()
        return out

    def with_costs(self, **changes: int) -> Device:
        """A copy with the named cost constants changed."""
        return dataclasses.replace(self, costs=self.costs.replace(**changes))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Device:
        """A device from a table in the TOML format (`base` resolved against
        the presets and the current directory)."""
        return _from_table(data, source, Path.cwd(), ())


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
}
_COST_LIMITS: Limits = {f: (int, lo, hi) for f, lo, hi, _ in KERNEL_COSTS + SIM_COSTS}
_IMAGE_LIMITS: Limits = {k: (int, 0, 1 << 20) for k in KERNEL_NAMES}


def _check_costs(data: Any, source: str, base: Costs | None) -> Costs:
    """Validate a [costs] table; with `base`, missing fields are taken from it."""
    if not isinstance(data, dict):
        raise ConfigError(source, "costs", "must be a table", type(data).__name__)
    data = dict(data)
    images = data.pop(IMAGE_TABLE, {})
    if not isinstance(images, dict):
        raise ConfigError(source, f"costs.{IMAGE_TABLE}", "must be a table",
                          type(images).__name__)
    base_values = dict(zip(COST_FIELDS, base.values, strict=True)) if base else None
    base_images = dict(zip(KERNEL_NAMES, base.images, strict=True)) if base else None
    values = check_fields(data, source, _COST_LIMITS, base_values, prefix="costs.", named=False)
    imgs = check_fields(images, source, _IMAGE_LIMITS, base_images,
                        prefix=f"costs.{IMAGE_TABLE}.", named=False)
    return Costs(tuple(values[f] for f in COST_FIELDS), tuple(imgs[k] for k in KERNEL_NAMES))


def _from_table(data: Any, source: str, here: Path, seen: tuple[str, ...]) -> Device:
    if not isinstance(data, dict):
        raise ConfigError(source, "table", "must be a table", type(data).__name__)
    data = dict(data)
    if "device" in data and isinstance(data["device"], dict) and len(data) == 1:
        data = dict(data["device"])
    base_ref = data.pop("base", None)
    costs_table = data.pop("costs", None)
    legacy = {k: data.pop(k) for k in sorted(LEGACY_FIELDS) if k in data}
    defaults: dict[str, Any] | None = None
    base_costs: Costs | None = None
    if base_ref is not None:
        if not isinstance(base_ref, str) or not base_ref:
            raise ConfigError(source, "base", "must be a preset name or a path", base_ref)
        base_dev = _load(base_ref, here, seen + (source,), source)
        defaults = {k: v for k, v in base_dev.to_dict().items() if k != "costs"}
        defaults["name"] = Path(source).stem if source.endswith(".toml") else base_dev.name
        base_costs = base_dev.costs
    elif costs_table is None:  # a flat first-wave table: c600's costs
        base_costs = _load(DEFAULT_COSTS, PRESET_DIR, seen + (source,), source).costs
    values = check_fields(data, source, _LIMITS, defaults)
    if legacy:
        if costs_table is not None:
            raise ConfigError(source, sorted(legacy)[0],
                              "a top-level cost field beside a [costs] table; move it into "
                              "[costs]")
        costs_table = {}
        for old, value in legacy.items():
            for new in LEGACY_FIELDS[old]:
                costs_table[new] = value
    costs = _check_costs(costs_table if costs_table is not None else {}, source, base_costs)
    align = values["alignment"]
    if align & (align - 1):
        raise ConfigError(source, "alignment", "must be a power of two", align)
    if values["memory_size"] % align or values["memory_base"] % align:
        raise ConfigError(source, "alignment", "memory_base and memory_size must be multiples",
                          align)
    if values["element_bytes"] > values["memory_size"]:
        raise ConfigError(source, "element_bytes", f"must fit in memory_size "
                          f"({values['memory_size']} bytes)", values["element_bytes"])
    if costs.support_bytes >= values["memory_size"]:
        raise ConfigError(source, "costs.support_bytes", "must leave room in memory_size",
                          costs.support_bytes)
    return Device(costs=costs, **values)


MAX_BASE_DEPTH = 32  # `base =` links followed before a chain is refused


def _load(ref: str, here: Path, seen: tuple[str, ...], source: str) -> Device:
    """The device `ref` names: a preset, or a path relative to `here`."""
    target: str | Path = (here / ref) if is_path(ref) and not Path(ref).is_absolute() else ref
    data, src = read_toml(target, PRESET_DIR, "device")
    if src in seen:
        raise ConfigError(source, "base", f"devices inherit in a circle: "
                                          f"{' -> '.join(seen + (src,))}", ref)
    if len(seen) >= MAX_BASE_DEPTH:
        raise ConfigError(source, "base", f"more than {MAX_BASE_DEPTH} devices inherit one "
                                          f"from another (from {seen[0]})", ref)
    return _from_table(data, src, Path(src).parent, seen)


def preset_names() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_device(name_or_path: str | Path) -> Device:
    """Load a preset by name (`c600`, `c600-ideal`, `tiny`) or a user TOML file
    by path.  Raises ConfigError naming the file and field on any bad input."""
    data, source = read_toml(name_or_path, PRESET_DIR, "device")
    return _from_table(data, source, Path(source).parent, ())
