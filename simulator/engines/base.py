"""What every engine shares: the memory image it runs on, the output it
returns, the fault codes it reports, and the registry that names engines.

An engine is a function `(pkg, image) -> EngineOutput`: it runs a package
whose structure is already checked (`verify.check_structure`) for timing, and
for numerics too when `image` is a `MemoryImage` (simulator.run builds it and
reads the outputs back).  `ENGINES` names the built-in ones — "numba" (the
jitted superstep loop, simulator/engines/numba.py) and "simpy" (the
event-level twin for small packages, simulator/engines/simpy.py); `engine`
looks one up, importing its module only then.

Run-time invariants, checked at every execution of every vertex and
transfer in both modes (timing only and numerics), in this order, each a
fault: the kernel's argument check (`kernels.dispatch.vertex_check`,
F_ARGS); per operand region, then per transfer end (source first), the
live tensor buffer that must hold it (`simulator.access.live_buffer` over
`simulator.verify.access_index`: F_NO_BUFFER, F_SRC_BUFFER, F_DST_BUFFER)
and its natural alignment (F_MISALIGNED).  With numerics the engine then
checks the image window (F_RANGE, F_XFER_RANGE), reads of unwritten bytes
(F_UNINIT), races (F_RACE) and the kernels' status (F_KERNEL).  A vertex
or transfer with a SKIPPING fault does not run; a vertex rejected by its
argument check costs no cycles.

Faults are rows of `faults[:, F_*]` — (code, step, tile, address, loop,
iteration, item, detail); `loop` is the BEGIN step of the innermost open loop
(-1 outside loops) and `iteration` its counter.  At most `MAX_FAULTS` are
kept; `EngineOutput.n_faults` counts all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from tilecommon.errors import ConfigError

if TYPE_CHECKING:
    from simulator.package import Package

MAX_FAULTS = 256

# fault codes
F_RANGE = 1  # vertex operand outside the tile's memory
F_MISALIGNED = 2  # region start not on its natural alignment
F_UNINIT = 3  # read of never-written bytes
F_RACE = 4  # two writers / writer + reader of one byte within a step
F_XFER_RANGE = 5  # transfer endpoint outside the tile's memory
F_KERNEL = 6  # the kernel body returned a non-zero status (detail = status)
F_NO_REGIONS = 7  # the kernel has no region description
F_OUTPUT = 8  # an output byte was never written (reported by run)
F_ARGS = 9  # the kernel's argument check rejected the vertex (detail = status)
F_NO_BUFFER = 10  # an operand region is not inside one live tensor buffer (detail = bytes)
F_SRC_BUFFER = 11  # a transfer source is not inside one live tensor buffer (detail = bytes)
F_DST_BUFFER = 12  # a transfer destination is not inside one live tensor buffer (detail)
F_PATCH = 13  # two patches rewrite one argument (item = the later patch, detail = the first)
# the exchange schedule is violated (simulator.xschedule: tile, address = cycle or byte
# offset, item = piece or send, detail = violation kind)
F_SCHEDULE = 14
FAULT_NAMES = {
    F_RANGE: "out-of-range access",
    F_MISALIGNED: "misaligned access",
    F_UNINIT: "read of never-written memory",
    F_RACE: "race within a step",
    F_XFER_RANGE: "transfer endpoint outside tile memory",
    F_KERNEL: "kernel error status",
    F_NO_REGIONS: "kernel without region description",
    F_OUTPUT: "output never written",
    F_ARGS: "arguments rejected by the kernel",
    F_NO_BUFFER: "operand region outside every live tensor buffer",
    F_SRC_BUFFER: "transfer source outside every live tensor buffer",
    F_DST_BUFFER: "transfer destination outside every live tensor buffer",
    F_PATCH: "two patches rewrite one argument",
    F_SCHEDULE: "exchange schedule violated",
}
# the faults that skip the vertex or transfer they name (memory safety): the
# others are reported and the item still runs
SKIPPING = (F_RANGE, F_XFER_RANGE, F_NO_REGIONS, F_ARGS, F_NO_BUFFER, F_SRC_BUFFER,
            F_DST_BUFFER)
FAULT_COLS = 8

# the engine counters' layout
C_FAULTS, C_VERTICES, C_CYCLES, C_TRANSFERS = range(4)


class MemoryImage(NamedTuple):
    """Per-tile memory for numerics (a NamedTuple of arrays: the Numba engine
    takes it as one argument).  Tile t's image is `mem[tile_row[t]]`; its
    index 0 is address `tile_base[t]` and the first `tile_size[t]` bytes are
    the tile's window (simulator.run: the span of its tensor buffers — code,
    exchange-table and support memory hold no values a vertex or transfer may
    touch).  An access outside the window, or on a tile with `tile_row == -1`,
    is out of range.  `written` is a bitmap, one bit per image byte (bit b & 63
    of word b >> 6): bytes that hold a value; reading an unmarked byte is a
    fault.  A bitmap moves 1/8 of the memory traffic of a byte mask."""

    mem: np.ndarray  # uint8 [rows, width]
    written: np.ndarray  # uint64 [rows, ceil(width / 64)]
    tile_row: np.ndarray  # int64 [tiles]
    tile_base: np.ndarray  # int64 [tiles], absolute address of index 0
    tile_size: np.ndarray  # int64 [tiles], window bytes (<= width)


def no_image(tiles: int) -> MemoryImage:
    """The image of a timing-only run: no tile has memory."""
    none = np.full(tiles, -1, dtype=np.int64)
    return MemoryImage(np.zeros((1, 1), np.uint8), np.zeros((1, 1), np.uint64), none, none,
                       none)


@dataclass(frozen=True)
class EngineOutput:
    """Raw counters of one run; units are cycles and bytes."""

    cycles: int
    cycles_per_step: np.ndarray  # int64 [S], summed over iterations
    tile_busy: np.ndarray  # int64 [tiles], summed vertex cycles
    tile_bytes_in: np.ndarray  # int64 [tiles]
    tile_bytes_out: np.ndarray  # int64 [tiles], each send of the schedule once
    tile_send_busy: np.ndarray  # int64 [tiles], exchange cycles its send lane is booked
    tile_receive_busy: np.ndarray  # int64 [tiles], ... its receive port
    faults: np.ndarray  # int64 [min(n_faults, MAX_FAULTS), FAULT_COLS]
    n_faults: int
    vertex_invocations: int
    transfers: int
    # seconds per phase of the run (engines that measure it: the Numba one)
    profile: dict[str, float] = field(default_factory=dict)


Engine = Callable[["Package", "MemoryImage | None"], EngineOutput]

# name -> module defining `execute` (imported when first asked for)
ENGINES: dict[str, str] = {"numba": "simulator.engines.numba",
                           "simpy": "simulator.engines.simpy"}


def engine(name: str) -> Engine:
    """The engine called `name`; ConfigError naming the engines."""
    if name not in ENGINES:
        raise ConfigError("--engine", "engine", f"unknown; engines: {sorted(ENGINES)}", name)
    fn: Engine = importlib.import_module(ENGINES[name]).execute
    return fn
