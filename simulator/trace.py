"""Chrome-trace / Perfetto JSON export of a simulation.

`trace_events(package, sim, tiles=(), unit="cycles")` walks the package's
program in execution order (Repeat loops run `trips` times, as in the engine)
and lays every step execution on one timeline (open the file in
chrome://tracing or https://ui.perfetto.dev):

- process 0 "device", thread 0 "steps": one complete ("X") event per step
  execution, named by the graph ops and roles it serves (the package's
  provenance; "step s" without it, with the ops also in `args.ops`) —
  category `compute`, `exchange` or `loop` (the REPEAT_END
  overhead of one iteration).  An exchange span holds a nested `sync` span
  (its first `sync_cycles`).  The `compute`/`exchange`/`loop` spans tile the
  timeline without gaps: their durations sum to `sim.cycles`.
- process 0, thread 1 + depth: one `repeat` span per loop iteration.
- process 1 "tiles", one thread per selected tile: a `tile` span per compute
  step execution in which the tile is busy (its summed vertex cycles, from the
  step's start).  The whole chip (1472 tiles × every step) would be far too
  big for a trace viewer, so at most `MAX_TRACE_TILES` tiles may be selected.
  Each selected tile also has a counter track "tile t live tensor bytes":
  the bytes of its tensor buffers live at each step.

Durations: a COMPUTE execution's cycles are recomputed exactly for its
iteration (patched vertex arguments applied; a jitted twin of the engine's
compute timing, checked against `sim.cycles_per_step`); an EXCHANGE step's
summed cycles are split evenly over its executions (exact unless patched
source addresses change its multicast grouping between iterations, which
planner packages do not do); REPEAT_END costs `loop_overhead_cycles` (plus
`patch_word_cycles` per patched word before a jump back, simulator.timing).

`unit="us"` puts microseconds at the device clock in the `ts`/`dur` fields,
which Perfetto shows as they are; `unit="cycles"` puts device cycles there (the
viewer labels them µs: read 1 µs as 1 cycle; `otherData.unit` says which).
Programs with more than `MAX_STEP_EXECUTIONS` step executions are refused
(ValueError).  `save_trace` writes the JSON atomically (temp file + os.replace).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from kernels.abi import (
    MAX_REGIONS,
    N_ARGS,
    REGION_COLS,
    STEP_COMPUTE,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TENSOR_KINDS,
)
from kernels.dispatch import vertex_cost
from simulator.access import patched
from simulator.hardware import step_label, step_ops
from simulator.package import Package
from simulator.run import SimResult
from simulator.timing import loop_patch_words
from simulator.verify import patch_index
from tilecommon.files import write_file_atomic
from tilecommon.jit import kjit

MAX_TRACE_TILES = 64
MAX_STEP_EXECUTIONS = 2_000_000
UNITS = ("cycles", "us")


def step_executions(package: Package) -> np.ndarray:
    """int64 [S]: how often each step runs in one execution of the program
    (a REPEAT_END once per iteration, a BEGIN once per entry of its loop)."""
    a = package.arrays
    mult = np.ones(package.n_steps, dtype=np.int64)
    for b in np.flatnonzero(a["step_kind"] == STEP_REPEAT_BEGIN).tolist():
        e = int(a["step_match"][b])
        if b < e:
            mult[b + 1 : e + 1] *= int(a["step_trips"][b])
    return mult


@kjit
def _compute_step(i0, i1, v_tile, v_kernel, v_args, vp_ptr, vp_list, ctr, p_arg, p_loop,
                  p_mode, p_base, p_stride, p_table, table_values, desc, acc, sel,
                  sel_out):  # type: ignore[no-untyped-def]
    """Cycles of one COMPUTE execution at loop counters `ctr` (max over tiles of
    summed vertex cycles, as the engine); `sel_out[j]` = cycles of tile sel[j]."""
    row = np.zeros(N_ARGS, dtype=np.int64)
    vr = np.zeros((MAX_REGIONS, REGION_COLS), dtype=np.int64)
    for v in range(i0, i1):
        for j in range(N_ARGS):
            row[j] = v_args[v, j]
        for q in range(vp_ptr[v], vp_ptr[v + 1]):
            p = vp_list[q]
            row[p_arg[p]] = patched(p_mode[p], p_base[p], p_stride[p], p_table[p],
                                    ctr[p_loop[p]], table_values)
        c, n = vertex_cost(v_kernel[v], row, desc, vr)
        acc[v_tile[v]] += max(c, 0)
    m = 0
    for v in range(i0, i1):
        m = max(m, acc[v_tile[v]])
    for j in range(sel.shape[0]):
        sel_out[j] = acc[sel[j]]
    for v in range(i0, i1):
        acc[v_tile[v]] = 0
    return m


class _Twin:
    """Exact cycles of COMPUTE executions; unpatched steps computed once."""

    def __init__(self, package: Package, tiles: np.ndarray) -> None:
        self.a = package.arrays
        self.vp_ptr, self.vp_list, _, _ = patch_index(package)
        self.desc = package.device.tile_desc().as_array()
        self.acc = np.zeros(package.tiles, dtype=np.int64)
        self.tiles = tiles
        self.memo: dict[int, tuple[int, np.ndarray]] = {}

    def cycles(self, s: int, ctr: np.ndarray) -> tuple[int, np.ndarray]:
        if s in self.memo:
            return self.memo[s]
        a = self.a
        i0, i1 = int(a["step_vtx"][s]), int(a["step_vtx"][s + 1])
        sel_out = np.zeros(self.tiles.size, dtype=np.int64)
        m = int(_compute_step(i0, i1, a["v_tile"], a["v_kernel"], a["v_args"], self.vp_ptr,
                              self.vp_list, ctr, a["p_arg"], a["p_loop"], a["p_mode"],
                              a["p_base"], a["p_stride"], a["p_table"], a["table_values"],
                              self.desc, self.acc, self.tiles, sel_out))
        if self.vp_ptr[i0] == self.vp_ptr[i1]:  # no patched vertex: same every iteration
            self.memo[s] = (m, sel_out)
        return m, sel_out


def _ops_arg(package: Package, s: int) -> dict[str, Any]:
    if not package.provenance:
        return {}
    return {"ops": [list(e) for e in package.provenance[s]]}


class Span(NamedTuple):
    """One laid-out piece of a run (`walk`): `what` is "compute",
    "exchange", "loop" (a REPEAT_END's overhead) or "repeat" (one loop
    iteration, `step` = its REPEAT_BEGIN); `iteration`: the counters of the
    loops around it, outermost first, as (begin step, counter); `busy`: for
    "compute", the cycles of each selected tile (else None)."""

    what: str
    step: int
    start: int
    cycles: int
    iteration: tuple[tuple[int, int], ...]
    busy: np.ndarray | None


def walk(package: Package, sim: SimResult, tiles: np.ndarray) -> Iterator[Span]:
    """Every step execution of `sim` in time order (module docstring:
    durations), then each loop iteration's span as it closes.  `tiles`:
    int64 tile ids whose compute busy cycles the compute spans carry.
    Raises ValueError when the spans do not add up to `sim` per step (a
    simulation of another package)."""
    a, dev = package.arrays, package.device
    if sim.cycles_per_step.shape != (package.n_steps,):
        raise ValueError(f"simulation has {sim.cycles_per_step.shape[0]} steps, package "
                         f"{package.name!r} has {package.n_steps}")
    execs = step_executions(package)
    twin = _Twin(package, tiles)
    got = np.zeros(package.n_steps, dtype=np.int64)  # cycles laid out per step
    seen = np.zeros(package.n_steps, dtype=np.int64)  # executions laid out per step
    ctr = np.zeros(max(package.n_steps, 1), dtype=np.int64)
    patch_words = loop_patch_words(package)
    start: dict[int, int] = {}
    stack: list[int] = []
    t = 0
    s = 0
    while s < package.n_steps:
        kind = int(a["step_kind"][s])
        it = tuple((b, int(ctr[b])) for b in stack)
        if kind == STEP_REPEAT_BEGIN:
            ctr[s] = 0
            stack.append(s)
            start[s] = t
            s += 1
            continue
        if kind == STEP_REPEAT_END:
            b = int(a["step_match"][s])
            dur = dev.costs.loop_overhead_cycles
            if int(ctr[b]) + 1 < int(a["step_trips"][b]):  # patches before the jump back
                dur += dev.costs.patch_word_cycles * int(patch_words[b])
            yield Span("loop", s, t, dur, it, None)
            t += dur
            got[s] += dur
            yield Span("repeat", b, start[b], t - start[b], it[:-1] + ((b, int(ctr[b])),),
                       None)
            ctr[b] += 1
            if ctr[b] < int(a["step_trips"][b]):
                start[b] = t
                s = b + 1
            else:
                stack.pop()
                s += 1
            continue
        if kind == STEP_COMPUTE:
            dur, busy = twin.cycles(s, ctr)
            yield Span("compute", s, t, dur, it, busy)
        else:
            total, n = int(sim.cycles_per_step[s]), int(execs[s])
            dur = total // n + (1 if int(seen[s]) < total % n else 0)
            yield Span("exchange", s, t, dur, it, None)
        seen[s] += 1
        got[s] += dur
        t += dur
        s += 1
    bad = np.flatnonzero(got != sim.cycles_per_step)
    if bad.size:
        s = int(bad[0])
        raise ValueError(f"step {s}: traced {int(got[s])} cycles, simulation has "
                         f"{int(sim.cycles_per_step[s])} (a simulation of another package?)")


def check_tiles(package: Package, tiles: Sequence[int], most: int | None) -> np.ndarray:
    """`tiles` as a sorted int64 array of distinct ids; ValueError when more
    than `most` (None: any number) or outside the package's tiles."""
    sel = np.array(sorted(set(int(t) for t in tiles)), dtype=np.int64)
    if most is not None and sel.size > most:
        raise ValueError(f"{sel.size} trace tiles selected; at most {most}")
    if sel.size and (sel[0] < 0 or sel[-1] >= package.tiles):
        raise ValueError(f"trace tiles must lie in 0..{package.tiles - 1}, got {sel.tolist()}")
    return sel


def check_length(package: Package) -> None:
    """ValueError for a program with more step executions than a trace holds."""
    n = int(step_executions(package).sum())
    if n > MAX_STEP_EXECUTIONS:
        raise ValueError(f"{n} step executions; a trace holds at most {MAX_STEP_EXECUTIONS}")


def trace_events(package: Package, sim: SimResult, tiles: Sequence[int] = (),
                 unit: str = "cycles") -> dict[str, Any]:
    """The Chrome-trace JSON object of simulation `sim` of `package` (module
    docstring).  Raises ValueError for an unknown unit, too many or unknown
    tiles, a program too long to trace, or a `sim` of another package."""
    if unit not in UNITS:
        raise ValueError(f"unknown trace unit {unit!r}; units: {list(UNITS)}")
    sel = check_tiles(package, tiles, MAX_TRACE_TILES)
    check_length(package)
    dev = package.device
    scale = 1.0 if unit == "cycles" else 1e6 / dev.clock_hz
    labels = [step_label(package, s) for s in range(package.n_steps)]
    names = [step_ops(package, s) for s in range(package.n_steps)]
    live = live_tensor_bytes(package, sel)
    last_live = np.full(sel.size, -1, dtype=np.int64)
    events: list[dict[str, Any]] = []

    def span(name: str, cat: str, pid: int, tid: int, t0: int, dur: int,
             args: dict[str, Any]) -> None:
        events.append({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                       "ts": t0 * scale, "dur": dur * scale, "args": args})

    for sp in walk(package, sim, sel):
        s, t, dur = sp.step, sp.start, sp.cycles
        it = {f"iteration@{b}": c for b, c in sp.iteration}
        if sp.what == "repeat":
            span(f"repeat@{s} iteration {sp.iteration[-1][1]}", "repeat", 0,
                 len(sp.iteration), t, dur, {"step": s, "trips": int(package["step_trips"][s])})
            continue
        if sp.what == "loop":
            span(f"loop overhead @{int(package['step_match'][s])}", "loop", 0, 0, t, dur,
                 {"step": s, **it})
            continue
        span(names[s], sp.what, 0, 0, t, dur, {"step": s, "label": labels[s],
                                               **_ops_arg(package, s), **it})
        if sp.what == "compute":
            assert sp.busy is not None
            for j, tile in enumerate(sel.tolist()):
                if sp.busy[j] > 0:
                    span(names[s], "tile", 1, tile, t, int(sp.busy[j]), {"step": s, **it})
        else:
            span("sync", "sync", 0, 0, t, min(dev.exchange_fixed_cycles, dur), {"step": s})
        for j, tile in enumerate(sel.tolist()):  # a memory counter track per traced tile
            if live[j, s] != last_live[j]:
                last_live[j] = live[j, s]
                events.append({"name": f"tile {tile} live tensor bytes", "ph": "C", "pid": 1,
                               "tid": tile, "ts": t * scale, "dur": 0,
                               "args": {"bytes": int(live[j, s])}})
    events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"], -e["dur"]))
    meta = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
             "args": {"name": f"device {dev.name}"}},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "steps"}}]
    depth = int(np.max(_depths(package), initial=0))
    meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": d,
              "args": {"name": f"repeat depth {d}"}} for d in range(1, depth + 1)]
    if sel.size:
        meta.append({"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
                     "args": {"name": "tiles (compute busy)"}})
        meta += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tile,
                  "args": {"name": f"tile {tile}"}} for tile in sel.tolist()]
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ns",
        "otherData": {"package": package.name, "package_hash": package.content_hash(),
                      "device": dev.name, "clock_hz": dev.clock_hz, "unit": unit,
                      "cycles": int(sim.cycles), "tiles": sel.tolist()},
    }


def live_tensor_bytes(package: Package, tiles: np.ndarray) -> np.ndarray:
    """int64 [len(tiles), S]: bytes of the tensor buffers of each tile live at
    each step (the memory counter tracks)."""
    a = package.arrays
    row = np.full(package.tiles, -1, dtype=np.int64)
    row[tiles] = np.arange(tiles.size)
    bt = a["buf_tile"]
    on = np.flatnonzero(np.isin(a["buf_kind"], TENSOR_KINDS) & (bt >= 0) & (bt < package.tiles))
    on = on[row[bt[on]] >= 0]
    r = row[a["buf_tile"][on]]
    out = np.zeros((tiles.size, package.n_steps + 1), dtype=np.int64)
    lo = np.clip(a["buf_first"][on], 0, package.n_steps)
    hi = np.clip(a["buf_last"][on] + 1, 0, package.n_steps)
    np.add.at(out, (r, lo), a["buf_bytes"][on])
    np.add.at(out, (r, hi), -a["buf_bytes"][on])
    return np.cumsum(out, axis=1)[:, : package.n_steps]


def _depths(package: Package) -> np.ndarray:
    kind = package["step_kind"]
    d = np.cumsum((kind == STEP_REPEAT_BEGIN).astype(np.int64)
                  - (kind == STEP_REPEAT_END).astype(np.int64))
    return d


def save_trace(trace: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `trace` as JSON to `path` atomically (temp file + os.replace)."""
    target = Path(path)
    return write_file_atomic(target, lambda f: json.dump(trace, f, separators=(",", ":")))
