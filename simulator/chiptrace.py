"""A full-chip trace of a simulation in Perfetto's protobuf format
(`tileplan simulate PKG --trace OUT.pftrace`; open it at ui.perfetto.dev or
load it in the `perfetto` package's TraceProcessor).

Where the Chrome-trace JSON of `simulator.trace` shows at most 64 tiles, this
holds every tile: the packets are Perfetto's own generated messages (the
`perfetto` package's `TracePacket`), framed as a `Trace` — a field-1 length
prefix per packet, which is what a serialized `Trace` is — and written
straight to the file, so a 27-layer run of 1472 tiles never sits in memory
as one message.

Tracks (`TrackDescriptor`, uuids below):

- "steps" (uuid 1): one slice per step execution named by the graph ops it
  serves (`simulator.hardware.step_ops`), an exchange holding a nested
  "sync" slice (its first `sync_cycles`), and "loop overhead" slices of
  REPEAT_END; "repeat depth d" (uuid 10 + d): one slice per loop iteration;
- "tile t" (uuid 1000 + t, children of "tiles", uuid 2): a slice per
  compute execution in which the tile is busy, as long as its summed vertex
  cycles, named by the step's ops; and per exchange execution in which the
  tile sends or receives, "xchg " + the ops, from its first booking on the
  schedule to the end of its last (`simulator.xschedule.tile_windows`; the
  window starts after the sync and the exchange setup);
- counters "live tensor bytes, fullest tile" (uuid 3) and "live tensor
  bytes, mean tile" (uuid 4): at each step execution (per-tile memory is in
  the report's memory map and in a run's tiles.npz).

Timestamps are nanoseconds at the device clock (cycle c at
round(c * 1e9 / clock_hz)), which is what Perfetto's timeline shows; the
slice durations are rounded the same way, so a span of one cycle at 1.5 GHz
can show as 0 or 1 ns.  Names are interned (`InternedData.event_names`) on
one packet sequence.  The spans come from `simulator.trace.walk`: they add
up to the simulation's cycles per step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from kernels.abi import STEP_COMPUTE, STEP_EXCHANGE
from simulator.hardware import step_ops
from simulator.package import Package
from simulator.run import SimResult
from simulator.trace import _depths, check_length, live_tensor_bytes, step_executions, walk
from simulator.xschedule import tile_windows
from tilecommon.files import write_file_atomic

STEPS_UUID, TILES_UUID, LIVE_MAX_UUID, LIVE_MEAN_UUID = 1, 2, 3, 4
DEPTH_UUID = 10  # + loop depth
TILE_UUID = 1000  # + tile id
SEQUENCE = 1  # trusted_packet_sequence_id of every packet


@dataclass(frozen=True)
class ChipTrace:
    """What `write_chip_trace` wrote."""

    path: Path
    packets: int
    tile_slices: int
    tiles: int
    bytes: int


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Writer:
    """Packets of one sequence, interned names, framed into a Trace stream."""

    def __init__(self, f: IO[bytes], clock_hz: float) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackEvent

        self.f = f
        self.packet_type = TracePacket
        self.ev = TrackEvent
        self.ns = 1e9 / clock_hz
        self.names: dict[str, int] = {}
        self.packets = 0
        self.first = True

    def ts(self, cycle: int) -> int:
        return int(round(cycle * self.ns))

    def write(self, p: object) -> None:
        data = p.SerializeToString()  # type: ignore[attr-defined]
        self.f.write(b"\x0a" + _varint(len(data)) + data)
        self.packets += 1

    def packet(self) -> object:
        p = self.packet_type()
        p.trusted_packet_sequence_id = SEQUENCE
        if self.first:  # the sequence's interned names start here
            p.sequence_flags = p.SEQ_INCREMENTAL_STATE_CLEARED
            self.first = False
        else:
            p.sequence_flags = p.SEQ_NEEDS_INCREMENTAL_STATE
        return p

    def track(self, uuid: int, name: str, parent: int = 0, counter: bool = False) -> None:
        p = self.packet()
        d = p.track_descriptor  # type: ignore[attr-defined]
        d.uuid = uuid
        d.name = name
        if parent:
            d.parent_uuid = parent
        if counter:
            d.counter.unit = d.counter.UNIT_SIZE_BYTES
        self.write(p)

    def begin(self, cycle: int, track: int, name: str) -> None:
        p = self.packet()
        p.timestamp = self.ts(cycle)  # type: ignore[attr-defined]
        iid = self.names.get(name)
        if iid is None:
            iid = self.names[name] = len(self.names) + 1
            e = p.interned_data.event_names.add()  # type: ignore[attr-defined]
            e.iid = iid
            e.name = name
        t = p.track_event  # type: ignore[attr-defined]
        t.type = self.ev.TYPE_SLICE_BEGIN
        t.track_uuid = track
        t.name_iid = iid
        self.write(p)

    def end(self, cycle: int, track: int) -> None:
        p = self.packet()
        p.timestamp = self.ts(cycle)  # type: ignore[attr-defined]
        t = p.track_event  # type: ignore[attr-defined]
        t.type = self.ev.TYPE_SLICE_END
        t.track_uuid = track
        self.write(p)

    def counter(self, cycle: int, track: int, value: int) -> None:
        p = self.packet()
        p.timestamp = self.ts(cycle)  # type: ignore[attr-defined]
        t = p.track_event  # type: ignore[attr-defined]
        t.type = self.ev.TYPE_COUNTER
        t.track_uuid = track
        t.counter_value = int(value)
        self.write(p)


def write_chip_trace(package: Package, sim: SimResult, path: str | os.PathLike[str],
                     progress: Callable[[int, int], None] | None = None) -> ChipTrace:
    """Write the full-chip trace of `sim` (a simulation of `package`) to
    `path` atomically (module docstring).  `progress(done, total)` is called
    per step execution laid out.  Raises ValueError for a program too long to
    trace or a simulation of another package."""
    check_length(package)
    tiles = np.arange(package.tiles, dtype=np.int64)
    names = [step_ops(package, s) for s in range(package.n_steps)]
    live = live_tensor_bytes(package, tiles)
    live_max = live.max(axis=0) if live.size else np.zeros(package.n_steps, dtype=np.int64)
    live_mean = np.round(live.mean(axis=0)).astype(np.int64) if live.size else live_max
    sync = package.device.costs.sync_cycles
    depth = int(np.max(_depths(package), initial=0))
    kind = package["step_kind"]
    total = int((step_executions(package)
                 * ((kind == STEP_COMPUTE) | (kind == STEP_EXCHANGE))).sum())
    counts = {"slices": 0}
    x_step, x_tile, x_first, x_end = tile_windows(package.device, package.arrays)
    x_ptr = np.searchsorted(x_step, np.arange(package.n_steps + 1))
    x_at = package.device.exchange_fixed_cycles  # the window after sync and setup

    def body(f: IO[bytes]) -> int:
        w = _Writer(f, package.device.clock_hz)
        w.track(STEPS_UUID, f"device {package.device.name}: steps")
        for d in range(1, depth + 1):
            w.track(DEPTH_UUID + d, f"repeat depth {d}")
        w.track(LIVE_MAX_UUID, "live tensor bytes, fullest tile", counter=True)
        w.track(LIVE_MEAN_UUID, "live tensor bytes, mean tile", counter=True)
        w.track(TILES_UUID, f"tiles ({package.tiles}: compute busy, exchange bookings)")
        for t in tiles.tolist():
            w.track(TILE_UUID + t, f"tile {t}", parent=TILES_UUID)
        last = (-1, -1)
        done = 0
        for sp in walk(package, sim, tiles):
            s, t0, dur = sp.step, sp.start, sp.cycles
            if sp.what == "repeat":
                track = DEPTH_UUID + len(sp.iteration)
                w.begin(t0, track, f"repeat@{s} iteration {sp.iteration[-1][1]}")
                w.end(t0 + dur, track)
                continue
            if sp.what == "loop":
                w.begin(t0, STEPS_UUID, f"loop overhead @{int(package['step_match'][s])}")
                w.end(t0 + dur, STEPS_UUID)
                continue
            if (int(live_max[s]), int(live_mean[s])) != last:
                last = (int(live_max[s]), int(live_mean[s]))
                w.counter(t0, LIVE_MAX_UUID, last[0])
                w.counter(t0, LIVE_MEAN_UUID, last[1])
            w.begin(t0, STEPS_UUID, names[s])
            if sp.what == "exchange":
                w.begin(t0, STEPS_UUID, "sync")
                w.end(t0 + min(sync, dur), STEPS_UUID)
                for k in range(int(x_ptr[s]), int(x_ptr[s + 1])):
                    t = int(x_tile[k])
                    w.begin(t0 + x_at + int(x_first[k]), TILE_UUID + t, "xchg " + names[s])
                    w.end(t0 + x_at + int(x_end[k]), TILE_UUID + t)
                    counts["slices"] += 1
            else:
                assert sp.busy is not None
                for t in np.flatnonzero(sp.busy > 0).tolist():
                    w.begin(t0, TILE_UUID + t, names[s])
                    w.end(t0 + int(sp.busy[t]), TILE_UUID + t)
                    counts["slices"] += 1
            w.end(t0 + dur, STEPS_UUID)
            done += 1
            if progress is not None:
                progress(done, total)
        return w.packets

    packets: list[int] = []
    target = write_file_atomic(Path(path), lambda f: packets.append(body(f)), mode="wb")
    return ChipTrace(target, packets[0], counts["slices"], package.tiles,
                     target.stat().st_size)
