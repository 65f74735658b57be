"""Domain errors shared by all three packages.

Every error names where it came from: a file and field, an op, a stage and
tile, or the package part that is wrong.  The CLI maps each class to one line
and an exit status (ConfigError/Unsupported → 2, BuildFailure → 3,
PackageInvalid/SimulationFault → 1).
"""

from __future__ import annotations

from typing import Any


class TileplanError(Exception):
    """Base class of every error tileplan raises on purpose."""


class ConfigError(TileplanError):
    """Bad model, device or profile input.

    `source` is the file (or preset name), `field` the offending key (dotted
    path), `value` what was found.
    """

    def __init__(self, source: str, field: str, message: str, value: Any = None) -> None:
        self.source = str(source)
        self.field = field
        self.value = value
        self.message = message
        shown = "" if value is None else f" (got {value!r})"
        super().__init__(f"{self.source}: field '{field}': {message}{shown}")


class HardwareResultInvalid(ConfigError):
    """A recorded hardware result (simulator/hardware.py) is corrupt or does not
    belong to the package it is checked against: wrong version, a missing or
    mistyped field, a package hash, device, step count, tile count or output
    shape that disagrees.  A ConfigError (bad user input: exit status 2) whose
    `source` is the result file and `field` the offending field."""


class Unsupported(TileplanError):
    """An op or feature the tool does not handle, named with the reason."""

    def __init__(self, op: str, reason: str) -> None:
        self.op = op
        self.reason = reason
        super().__init__(f"unsupported {op}: {reason}")


class GraphError(TileplanError):
    """The graph verifier rejected a graph; names the op and what is wrong."""

    def __init__(self, op: str, message: str) -> None:
        self.op = op
        super().__init__(f"op {op}: {message}")


class BuildFailure(TileplanError):
    """A build stage could not succeed.

    `stage` ∈ lower/expand/schedule/allocate/link, `tile` the physical tile
    (or -1 when not tile-specific), `need`/`have` bytes, `profile` a mapping
    kind → bytes of that tile's memory at the point of failure.
    """

    def __init__(
        self,
        stage: str,
        tile: int,
        need: int,
        have: int,
        detail: str,
        profile: dict[str, int] | None = None,
    ) -> None:
        self.stage = stage
        self.tile = tile
        self.need = need
        self.have = have
        self.detail = detail
        self.profile = dict(profile or {})
        where = f"tile {tile}" if tile >= 0 else "device"
        # the bytes only where memory is what failed (a refused recipe or a
        # grid that does not divide has none to name)
        size = f" (need {need} bytes, have {have})" if need or have else ""
        super().__init__(f"{stage}: {where}: {detail}{size}")


class PackageInvalid(TileplanError):
    """A package failed static verification, or its files are corrupt."""


class SimulationFault(TileplanError):
    """A simulation recorded faults; `faults` lists them (step, tile, address, what)."""

    def __init__(self, message: str, faults: list[Any] | None = None) -> None:
        self.faults = list(faults or [])
        super().__init__(message)
