"""The SimPy event-level engine: an independent model of the package semantics.

`execute(pkg, image)` is an engine (simulator.engines.base) like the Numba one and gives
the same `EngineOutput` (cycles, cycles per step, per-tile busy cycles and
exchange bytes, faults); `simulator.run(..., engine="simpy")` selects it.  It is
the slow, obvious twin of the Numba engine: the *cycle model* of a
vertex is shared (`kernels.dispatch.vertex_cycles`) and so is the kernels'
numeric code (`vertex_execute`) and region description (`vertex_regions`);
the *scheduling*, patching, exchange, memory images and checks are written
here again, in plain Python and numpy, from docs/contracts.md §3.  Meant for
small packages: every vertex and port transfer is an event (vit-tiny, 1 layer
on c600, 31,849 vertex invocations and 78,875 transfers: about 14 s, 27x the
Numba engine; experiments/crosscheck_engines.py).

The model (one `simpy.Environment`, time in device cycles):

- A **supervisor** process walks the program with its own loop stack and
  counters, applies Repeat patches itself (`base + i*stride` or `table[i]`)
  and runs one superstep at a time.
- **COMPUTE**: the supervisor hands each tile its vertices of the step (a
  `simpy.Store` per tile); a **tile process** runs them back to back, each a
  timeout of its kernel cycles (the tile's six workers are inside a vertex's
  cycle model: busiest worker + overhead + element conflicts), and signals its
  done event.  The superstep ends at the **barrier**: `AllOf` the tiles' done
  events, i.e. the max over tiles of their summed vertex cycles.
- **EXCHANGE**: the sync is a timeout of `sync_cycles + exchange_setup_cycles`;
  then every source is read (the exchange reads the pre-step state) and each
  **piece** of the step's static schedule (docs/contracts.md §3) is a
  process: at its start it books its sender's lane, and one **arrival**
  process per receiver of its send books that receiver's port after the
  receiver's latency (52 + 2 x row distance on c600).  A booking that meets
  one still running, a send whose bytes its pieces do not cover once, or a
  booking past the window is F_SCHEDULE.  The step lasts the schedule's
  window; the transfers' bytes are written into their destinations when it
  closes.  Bytes out count each send once (a multicast leaves its tile
  once); a tile's send and receive busy cycles are the lengths of its lane's
  and its port's bookings.
- **REPEAT_END**: a timeout of `loop_overhead_cycles` per iteration, plus,
  before a jump back, `patch_word_cycles` per patched word of the loop on its
  busiest tile (a multicast send's source patched once, one word per send
  instruction); charged to the END step.

Event order is SimPy's: (time, priority, insertion sequence); processes are
created in tile order, so a run is deterministic.

Run-time invariants (both modes, simulator.engines.base): before a vertex
costs anything its kernel's argument check runs (F_ARGS: the vertex is
skipped and costs 0 cycles), then each of its regions must lie in one tensor
buffer live at the step (F_NO_BUFFER, skipped) on its natural alignment
(F_MISALIGNED); a transfer's source, then destination, likewise
(F_SRC_BUFFER / F_DST_BUFFER, skipped; F_MISALIGNED).  The live buffers come
from `simulator.verify.access_index`, the table verify and the Numba engine
use, but the lookup is written here again (`_in_live_buffer`).

Numerics (when `image` is given): each tile has its own numpy image over the
span of its tensor buffers (computed here from the memory map; it must agree
with the loader's `MemoryImage` window, which the run's inputs were written
into) and a byte-per-byte boolean written mask.  When a tile starts a step,
every region of each of its vertices is checked against the pre-step state:
inside the tile's image (else F_RANGE and the vertex is skipped), reads only
of written bytes (F_UNINIT).  Transfer endpoints outside the image are
F_XFER_RANGE (the transfer is skipped); unwritten source bytes F_UNINIT.
**Races**: after a compute step's barrier, and before an exchange's ports
start, the bytes of every in-range region (transfers: source read,
destination written) are checked per tile with a byte -> writer map: a
byte written by two owners, or read by one and written by another, is one
F_RACE per step (the first tile; on it, the first such byte in owner order;
the Numba engine may name another byte or pair when a step has several).
A compute step's faults are listed checks first, then the race, then kernel
status faults (F_KERNEL), each in vertex order, as the Numba engine does.
A racy step still runs: vertices of one tile in vertex order, transfers
landing on one tile in transfer order, every source read before any
destination is written — the same results as the Numba engine.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from kernels.abi import (
    MAX_REGIONS,
    PATCH_ARITH,
    PATCH_VERTEX_ARG,
    PATCH_XFER_SRC,
    REGION_COLS,
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TENSOR_KINDS,
)
from kernels.dispatch import vertex_check, vertex_cycles, vertex_execute, vertex_regions
from simulator.access import B_ADDR, B_END, B_FIRST, B_LAST
from simulator.engines.base import (
    F_ARGS,
    F_DST_BUFFER,
    F_KERNEL,
    F_MISALIGNED,
    F_NO_BUFFER,
    F_NO_REGIONS,
    F_RACE,
    F_RANGE,
    F_SCHEDULE,
    F_SRC_BUFFER,
    F_UNINIT,
    F_XFER_RANGE,
    FAULT_COLS,
    MAX_FAULTS,
    EngineOutput,
    MemoryImage,
)
from simulator.package import Package
from simulator.verify import access_index
from simulator.xschedule import V_COVER, V_LANE, V_LATE, V_PORT

Proc = Generator[simpy.Event, Any, None]


@dataclass
class _Tile:
    """One tile's memory image (numerics only): bytes base..base+size."""

    base: int
    mem: np.ndarray  # uint8 [size]
    written: np.ndarray  # bool [size]


@dataclass(frozen=True)
class _Access:
    """Bytes one vertex or transfer (`owner`) touches on a tile in one step;
    offsets are relative to the tile's image."""

    owner: int
    is_write: bool
    offsets: np.ndarray  # int64


@dataclass
class _Work:
    """One compute step's vertices for one tile: (vertex, patched args, cycles)."""

    tile: int
    step: int
    loop: int
    iteration: int
    vertices: list[tuple[int, np.ndarray, int]]
    done: simpy.Event
    accesses: list[_Access] = field(default_factory=list)  # in-range regions (race check)


@dataclass
class _Counters:
    busy: np.ndarray
    bytes_in: np.ndarray
    bytes_out: np.ndarray
    xsend: np.ndarray
    xrecv: np.ndarray
    faults: list[tuple[int, ...]] = field(default_factory=list)
    n_faults: int = 0
    vertices: int = 0
    transfers: int = 0


def execute(pkg: Package, image: MemoryImage | None = None) -> EngineOutput:
    """Run `pkg` (already structure-checked) as a SimPy model; numerics if `image`.
    The image is read at the start and written back at the end (outputs are
    read from it by `simulator.run`)."""
    return _Machine(pkg, image).run()


class _Bookings:
    """The lanes and ports of one exchange step as its pieces take them, and
    the first schedule violation seen (smallest (kind, tile, cycle, item))."""

    def __init__(self) -> None:
        self.lanes: dict[int, list[tuple[int, int, int]]] = {}  # tile -> (start, end, piece)
        self.ports: dict[int, list[tuple[int, int, int]]] = {}
        self.ends: list[tuple[int, int, int]] = []  # (tile, end, piece) of every booking
        self.covered: dict[int, list[tuple[int, int]]] = {}  # send -> (offset, bytes)
        self.first: tuple[int, int, int, int] | None = None
        self.held: dict[int, dict[int, int]] = {}  # id(table) -> tile -> cycles booked

    def flag(self, kind: int, tile: int, cycle: int, item: int) -> None:
        row = (kind, tile, cycle, item)
        if self.first is None or row < self.first:
            self.first = row

    def take(self, kind: int, table: dict[int, list[tuple[int, int, int]]], tile: int,
             start: int, end: int, q: int) -> None:
        """Book [start, end) on `tile`'s lane or port for piece q; a booking
        still running then is a double booking, named by the later of the two
        in (start, piece) order."""
        # bookings come in time order: one over by `start` can clash with none
        held = [b for b in table.get(tile, ()) if b[1] > start]
        for b0, _, bq in held:
            later = max((b0, bq), (start, q))
            self.flag(kind, tile, later[0], later[1])
        held.append((start, end, q))
        table[tile] = held
        self.ends.append((tile, end, q))
        booked = self.held.setdefault(id(table), {})
        booked[tile] = booked.get(tile, 0) + end - start


class _Machine:
    """State of one event-level run (module docstring)."""

    def __init__(self, pkg: Package, image: MemoryImage | None) -> None:
        self.pkg = pkg
        self.a = pkg.arrays
        dev = pkg.device
        self.desc = dev.tile_desc().as_array()
        c = dev.costs
        self.in_bw, self.out_bw = c.exchange_in_bytes_per_cycle, c.exchange_out_bytes_per_cycle
        self.sync = c.sync_cycles + c.exchange_setup_cycles
        self.loop_overhead = c.loop_overhead_cycles
        self.send_cycles, self.send_max, self.recv_cycles = (c.send_cycles, c.send_max_bytes,
                                                             c.receive_cycles)
        self.latency, self.latency_row = c.arrival_latency_cycles, c.arrival_latency_row_cycles
        self.tiles_per_row = c.tiles_per_row
        self.members: dict[int, list[int]] = {}  # send leader -> its transfers
        for x, lead in enumerate(pkg.arrays["x_send"].tolist()):
            self.members.setdefault(lead, []).append(x)
        # patched words of each loop on its busiest tile, counted here from the patches
        self.loop_patch = self._loop_patch_words(pkg)
        self.patch_cycles = c.patch_word_cycles
        self.env = simpy.Environment()
        n = pkg.tiles
        self.c = _Counters(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                           np.zeros(n, np.int64), np.zeros(n, np.int64))
        self.cycles_per_step = np.zeros(pkg.n_steps, dtype=np.int64)
        self.patches = _patch_map(pkg)
        # the buffers an access may lie in, per tile: (addr, end, first, last)
        idx = access_index(pkg)
        self.live: dict[int, list[tuple[int, int, int, int]]] = {}
        for t in range(n):
            rows = idx.table[int(idx.ptr[t]):int(idx.ptr[t + 1])]
            self.live[t] = [(int(r[B_ADDR]), int(r[B_END]), int(r[B_FIRST]), int(r[B_LAST]))
                            for r in rows]
        self.image = image
        self.tiles = _load_tiles(pkg, image) if image is not None else {}
        # writer of each byte, one tile at a time (race checks; reset after each tile)
        width = max((tile.mem.size for tile in self.tiles.values()), default=0)
        self.writer = np.full(width, -1, dtype=np.int64)
        self.step_faults: list[tuple[int, int, tuple[int, ...]]] = []
        self.inbox: dict[int, simpy.Store] = {}
        for t in sorted(set(self.a["v_tile"].tolist())):
            self.inbox[t] = simpy.Store(self.env)
            self.env.process(self._tile(t))

    def run(self) -> EngineOutput:
        done = self.env.process(self._supervisor())
        self.env.run(until=done)
        if self.image is not None:
            _store_tiles(self.tiles, self.image)
        c = self.c
        rows = np.array(c.faults, dtype=np.int64).reshape(-1, FAULT_COLS)
        return EngineOutput(
            cycles=int(self.env.now), cycles_per_step=self.cycles_per_step, tile_busy=c.busy,
            tile_bytes_in=c.bytes_in, tile_bytes_out=c.bytes_out, tile_send_busy=c.xsend,
            tile_receive_busy=c.xrecv, faults=rows,
            n_faults=c.n_faults, vertex_invocations=c.vertices, transfers=c.transfers)

    # ---- supervisor ------------------------------------------------------------

    def _supervisor(self) -> Proc:
        a = self.a
        kinds, match, trips = a["step_kind"], a["step_match"], a["step_trips"]
        counter: dict[int, int] = {}
        loops: list[int] = []  # BEGIN steps of the open loops, innermost last
        s = 0
        while s < self.pkg.n_steps:
            kind = int(kinds[s])
            t0 = self.env.now
            if kind == STEP_REPEAT_BEGIN:
                counter[s] = 0
                loops.append(s)
                s += 1
                continue
            if kind == STEP_REPEAT_END:
                yield self.env.timeout(self.loop_overhead)
                b = int(match[s])
                counter[b] += 1
                if counter[b] < int(trips[b]):
                    yield self.env.timeout(self.patch_cycles * self.loop_patch.get(b, 0))
                    self.cycles_per_step[s] += self.env.now - t0
                    s = b + 1
                else:
                    self.cycles_per_step[s] += self.env.now - t0
                    loops.pop()
                    s += 1
                continue
            loop = loops[-1] if loops else -1
            it = counter[loop] if loops else 0
            if kind == STEP_COMPUTE:
                yield from self._compute(s, loop, it, counter)
            elif kind == STEP_EXCHANGE:
                yield from self._exchange(s, loop, it, counter)
            self.cycles_per_step[s] += self.env.now - t0
            s += 1

    def _loop_patch_words(self, pkg: Package) -> dict[int, int]:
        """REPEAT_BEGIN step -> patched words it drives on its busiest tile: a
        vertex or destination patch is one word on its tile; a source patch
        one word per send instruction of its send, each send once (a
        multicast shares one: same step, source, bytes and patch)."""
        a = pkg.arrays
        per: dict[tuple[int, int], int] = {}
        sends: set[tuple[int, ...]] = set()
        for p in range(pkg.n_patches):
            i = int(a["p_index"][p])
            target = int(a["p_target"][p])
            loop = int(a["p_loop"][p])
            words = 1
            if target == PATCH_VERTEX_ARG:
                tile = int(a["v_tile"][i])
            elif target == PATCH_XFER_SRC:
                tile = int(a["x_src_tile"][i])
                step = int(np.searchsorted(a["step_xfer"], i, side="right")) - 1
                nbytes = int(a["x_bytes"][i])
                send = (loop, step, tile, int(a["x_src_addr"][i]), nbytes,
                        int(a["p_mode"][p]), int(a["p_stride"][p]), int(a["p_table_addr"][p]))
                if send in sends:
                    continue
                sends.add(send)
                words = -(-nbytes // self.send_max)
            else:
                tile = int(a["x_dst_tile"][i])
            per[(loop, tile)] = per.get((loop, tile), 0) + words
        out: dict[int, int] = {}
        for (loop, _), n in per.items():
            out[loop] = max(out.get(loop, 0), n)
        return out

    def _patched(self, target: int, index: int, counter: dict[int, int]) -> dict[int, int]:
        """{arg: value} of the patches on vertex (target 0) or transfer (1, 2) `index`."""
        a = self.a
        out = {}
        for p in self.patches.get((target, index), ()):
            i = counter[int(a["p_loop"][p])]
            if int(a["p_mode"][p]) == PATCH_ARITH:
                out[int(a["p_arg"][p])] = int(a["p_base"][p]) + i * int(a["p_stride"][p])
            else:
                out[int(a["p_arg"][p])] = int(a["table_values"][int(a["p_table"][p]) + i])
        return out

    def _compute(self, s: int, loop: int, it: int, counter: dict[int, int]) -> Proc:
        a = self.a
        per_tile: dict[int, list[tuple[int, np.ndarray, int]]] = {}
        for v in range(int(a["step_vtx"][s]), int(a["step_vtx"][s + 1])):
            args = np.array(a["v_args"][v], dtype=np.int64)
            for k, val in self._patched(0, v, counter).items():
                args[k] = val
            kid = int(a["v_kernel"][v])
            # a vertex its kernel rejects costs nothing (and does not run)
            cyc = max(int(vertex_cycles(kid, args, self.desc)), 0) if not int(
                vertex_check(kid, args)) else 0
            per_tile.setdefault(int(a["v_tile"][v]), []).append((v, args, cyc))
        self.step_faults = []
        works = [_Work(t, s, loop, it, per_tile[t], self.env.event()) for t in sorted(per_tile)]
        for work in works:
            yield self.inbox[work.tile].put(work)
        yield simpy.AllOf(self.env, [w.done for w in works])  # the superstep barrier
        race = self._race(s, loop, it, {w.tile: w.accesses for w in works})
        if race is not None:
            self.step_faults.append((1, 0, race))
        # checks first, then the race, then kernel faults, each in vertex order
        for _, _, row in sorted(self.step_faults, key=lambda f: (f[0], f[1])):
            self._record(row)
        self.c.vertices += int(a["step_vtx"][s + 1] - a["step_vtx"][s])

    def _exchange(self, s: int, loop: int, it: int, counter: dict[int, int]) -> Proc:
        a = self.a
        yield self.env.timeout(self.sync)
        receives_in_order: list[tuple[int, int, int, np.ndarray | None]] = []
        accesses: dict[int, list[_Access]] = {}
        items = []
        for x in range(int(a["step_xfer"][s]), int(a["step_xfer"][s + 1])):
            st, dt, nb = int(a["x_src_tile"][x]), int(a["x_dst_tile"][x]), int(a["x_bytes"][x])
            src = self._patched(1, x, counter).get(0, int(a["x_src_addr"][x]))
            dst = self._patched(2, x, counter).get(0, int(a["x_dst_addr"][x]))
            clean = self._check_transfer(s, loop, it, x, st, src, dt, dst, nb)
            items.append((x, st, dt, nb, src, dst, clean))
        # every transfer's run-time checks first, then the image checks (numerics)
        for x, st, dt, nb, src, dst, clean in items:
            data = self._gather(s, loop, it, x, st, src, dt, dst, nb) if clean else None
            if data is not None:
                for t, addr, w in ((st, src, False), (dt, dst, True)):
                    offs = np.arange(nb, dtype=np.int64) + (addr - self.tiles[t].base)
                    accesses.setdefault(t, []).append(_Access(x, w, offs))
            if int(a["x_send"][x]) == x:  # a send leaves its tile once
                self.c.bytes_out[st] += nb
            receives_in_order.append((x, dt, dst, data))
            self.c.bytes_in[dt] += nb
            self.c.transfers += 1
        race = self._race(s, loop, it, accesses)
        if race is not None:
            self._record(race)
        t0 = int(self.env.now)
        book = _Bookings()
        pieces = range(int(a["step_piece"][s]), int(a["step_piece"][s + 1]))
        procs = [self.env.process(self._piece(q, t0, book)) for q in pieces]
        yield simpy.AllOf(self.env, procs)
        window = int(a["step_xcycles"][s])
        for t, cyc in book.held.get(id(book.lanes), {}).items():
            self.c.xsend[t] += cyc
        for t, cyc in book.held.get(id(book.ports), {}).items():
            self.c.xrecv[t] += cyc
        # every send covered once: its pieces' bytes, in offset order
        for x in range(int(a["step_xfer"][s]), int(a["step_xfer"][s + 1])):
            if int(a["x_send"][x]) == x:
                at = 0
                for off, nb in sorted(book.covered.get(x, [])):
                    if off != at:
                        break
                    at = off + nb
                if at != int(a["x_bytes"][x]) or len(book.covered.get(x, [])) == 0:
                    book.flag(V_COVER, int(a["x_src_tile"][x]), min(at, int(a["x_bytes"][x])), x)
        for tile, end, q in book.ends:
            if end > window:
                book.flag(V_LATE, tile, end, q)
        if book.first is not None:
            kind, tile, cycle, item = book.first
            self._record((F_SCHEDULE, s, tile, cycle, loop, it, item, kind))
        if self.env.now < t0 + window:  # the transfer window is the schedule's
            yield self.env.timeout(t0 + window - self.env.now)
        for _, dt, dst, data in receives_in_order:
            if data is not None:  # written when the window closes, in transfer order
                into = self.tiles[dt]
                off = dst - into.base
                into.mem[off:off + data.size] = data
                into.written[off:off + data.size] = True

    # ---- tiles, lanes and ports --------------------------------------------------------

    def _tile(self, t: int) -> Proc:
        """Tile t: runs the vertices it is handed, back to back, forever."""
        while True:
            work = yield self.inbox[t].get()
            # every check sees the pre-step state (as in a bulk-synchronous step)
            oks = [self._check_vertex(work, t, v, args) for v, args, _ in work.vertices]
            for (v, args, cyc), ok in zip(work.vertices, oks, strict=True):
                yield self.env.timeout(cyc)
                self.c.busy[t] += cyc
                if ok and self.image is not None:
                    self._execute_vertex(work, t, v, args)
            work.done.succeed()

    def _piece(self, q: int, t0: int, book: _Bookings) -> Proc:
        """Piece q: leaves its sender's lane at its start and is heard by every
        receiver of its send after that receiver's latency."""
        a = self.a
        lead, nb, off = int(a["q_send"][q]), int(a["q_bytes"][q]), int(a["q_offset"][q])
        yield self.env.timeout(int(a["q_start"][q]))
        st = int(a["x_src_tile"][lead])
        start = int(self.env.now) - t0
        lane = max(-(-nb // self.out_bw), -(-nb // self.send_max) * self.send_cycles)
        book.take(V_LANE, book.lanes, st, start, start + lane, q)
        book.covered.setdefault(lead, []).append((off, nb))
        arrivals = [self.env.process(self._arrive(q, st, int(a["x_dst_tile"][x]), nb, off, t0,
                                                  book))
                    for x in self.members[lead]]
        yield simpy.AllOf(self.env, arrivals)

    def _arrive(self, q: int, st: int, dt: int, nb: int, off: int, t0: int,
                book: _Bookings) -> Proc:
        rows = abs(st // self.tiles_per_row - dt // self.tiles_per_row)
        yield self.env.timeout(self.latency + self.latency_row * rows)
        port = -(-nb // self.in_bw)
        if off == 0:
            port = max(port, self.recv_cycles)
        start = int(self.env.now) - t0
        book.take(V_PORT, book.ports, dt, start, start + port, q)
        yield self.env.timeout(port)

    # ---- numerics and checks -------------------------------------------------------

    def _record(self, row: tuple[int, ...]) -> None:
        if len(self.c.faults) < MAX_FAULTS:  # keep the first MAX_FAULTS, count all
            self.c.faults.append(row)
        self.c.n_faults += 1

    def _in_live_buffer(self, t: int, lo: int, hi: int, rows: int, step: int) -> bool:
        """The access rule (simulator.engines.base): [lo, hi) lies in one tensor
        buffer of tile t live at `step` with at least `rows` bytes."""
        return any(addr <= lo and hi <= end and first <= step <= last and rows <= end - addr
                   for addr, end, first, last in self.live.get(t, ()))

    def _check_transfer(self, s: int, loop: int, it: int, x: int, st: int, src: int, dt: int,
                        dst: int, nb: int) -> bool:
        """Run-time invariants of transfer x, source then destination; False if
        it must be skipped (an end outside every live buffer)."""
        ok = True
        g = _granule(nb, [])
        for code, tile_id, addr in ((F_SRC_BUFFER, st, src), (F_DST_BUFFER, dt, dst)):
            if not self._in_live_buffer(tile_id, addr, addr + nb, 1, s):
                self._record((code, s, tile_id, addr, loop, it, x, nb))
                ok = False
                continue
            if addr % g:
                self._record((F_MISALIGNED, s, tile_id, addr, loop, it, x, g))
        return ok

    def _check_vertex(self, w: _Work, t: int, v: int, args: np.ndarray) -> bool:
        """Run-time checks of vertex v on tile t (both modes), then, with
        numerics, its image checks; False if it must be skipped."""
        kid = int(self.a["v_kernel"][v])
        where = (w.step, t)
        st = int(vertex_check(kid, args))
        if st:
            self.step_faults.append((0, v, (F_ARGS, *where, 0, w.loop, w.iteration, v, st)))
            return False
        regs = np.zeros((MAX_REGIONS, REGION_COLS), dtype=np.int64)
        n = int(vertex_regions(kid, args, regs))
        if n < 0:
            self.step_faults.append((0, v, (F_NO_REGIONS, *where, 0, w.loop, w.iteration, v,
                                            kid)))
            return False
        spans = []
        ok = True
        for r in range(n):
            addr, outer, ostride, rows, ld, nb, is_write = (int(x) for x in regs[r])
            if outer <= 0 or rows <= 0 or nb <= 0:
                continue
            d_outer, d_rows = (outer - 1) * ostride, (rows - 1) * ld
            lo = addr + min(d_outer, 0) + min(d_rows, 0)
            hi = addr + nb + max(d_outer, 0) + max(d_rows, 0)
            if not self._in_live_buffer(t, lo, hi, outer * rows, w.step):
                self.step_faults.append((0, v, (F_NO_BUFFER, *where, lo, w.loop, w.iteration,
                                                v, hi - lo)))
                ok = False
                continue
            g = _granule(nb, ([ld] if rows > 1 else []) + ([ostride] if outer > 1 else []))
            if addr % g:
                self.step_faults.append((0, v, (F_MISALIGNED, *where, addr, w.loop,
                                                w.iteration, v, g)))
            spans.append((lo, hi, addr, outer, ostride, rows, ld, nb, is_write))
        if not ok or self.image is None:
            return ok
        tile = self.tiles.get(t)
        for lo, hi, addr, outer, ostride, rows, ld, nb, is_write in spans:
            if tile is None or lo < tile.base or hi > tile.base + tile.mem.size:
                self.step_faults.append((0, v, (F_RANGE, *where, lo, w.loop, w.iteration, v,
                                                hi - lo)))
                ok = False
                continue
            offs = _region_offsets(addr - tile.base, outer, ostride, rows, ld, nb)
            w.accesses.append(_Access(v, bool(is_write), offs))
            if not is_write:
                bad = _first_unwritten(tile, offs)
                if bad >= 0:
                    self.step_faults.append((0, v, (F_UNINIT, *where, bad, w.loop,
                                                    w.iteration, v, 0)))
        return ok

    def _execute_vertex(self, w: _Work, t: int, v: int, args: np.ndarray) -> None:
        tile = self.tiles[t]
        kid = int(self.a["v_kernel"][v])
        status = int(vertex_execute(kid, tile.mem, tile.base, args))
        if status:
            self.step_faults.append((2, v, (F_KERNEL, w.step, t, 0, w.loop, w.iteration, v,
                                            status)))
            return
        regs = np.zeros((MAX_REGIONS, REGION_COLS), dtype=np.int64)
        for r in range(int(vertex_regions(kid, args, regs))):
            addr, outer, ostride, rows, ld, nb, is_write = (int(x) for x in regs[r])
            if not is_write:
                continue
            for o in range(outer):
                for k in range(rows):
                    off = addr + o * ostride + k * ld - tile.base
                    tile.written[off:off + nb] = True

    def _race(self, s: int, loop: int, it: int,
              accesses: dict[int, list[_Access]]) -> tuple[int, ...] | None:
        """The F_RACE fault row of the first racing byte of a step, or None: tiles
        in order; on a tile, writes in order (a byte written by two owners), then
        reads (a byte read by one owner and written by another)."""
        for t in sorted(accesses):
            acc = accesses[t]
            if len({x.owner for x in acc}) < 2 or not any(x.is_write for x in acc):
                continue
            found = None
            written = [x for x in acc if x.is_write]
            for phase in (written, [x for x in acc if not x.is_write]):
                for x in phase:
                    prev = self.writer[x.offsets]
                    bad = np.flatnonzero((prev >= 0) & (prev != x.owner))
                    if bad.size:
                        k = int(bad[0])
                        found = (int(x.offsets[k]), x.owner, int(prev[k]))
                        break
                    if x.is_write:
                        self.writer[x.offsets] = x.owner
                if found is not None:
                    break
            for x in written:
                self.writer[x.offsets] = -1
            if found is not None:
                off, owner, other = found
                return (F_RACE, s, t, off + self.tiles[t].base, loop, it, owner, other)
        return None

    def _gather(self, s: int, loop: int, it: int, x: int, st: int, src: int, dt: int, dst: int,
                nb: int) -> np.ndarray | None:
        """Checks of transfer x and its source bytes (pre-step state), or None when
        it is skipped (an endpoint outside its tile's image) or without numerics."""
        if self.image is None:
            return None
        skip = False
        for tile_id, addr in ((st, src), (dt, dst)):
            tile = self.tiles.get(tile_id)
            if tile is None or addr < tile.base or addr + nb > tile.base + tile.mem.size:
                self._record((F_XFER_RANGE, s, tile_id, addr, loop, it, x, nb))
                skip = True
        if skip:
            return None
        tile = self.tiles[st]
        bad = _first_unwritten(tile, np.arange(src - tile.base, src - tile.base + nb))
        if bad >= 0:
            self._record((F_UNINIT, s, st, bad, loop, it, x, 0))
        return tile.mem[src - tile.base:src - tile.base + nb].copy()


def _granule(row_bytes: int, strides: list[int]) -> int:
    """Largest power of two <= 4 dividing the row bytes and every used stride."""
    bits = row_bytes
    for v in strides:
        bits |= v  # low bits of the OR are zero iff they are zero in every value
    return 4 if bits % 4 == 0 else 2 if bits % 2 == 0 else 1


def _region_offsets(off: int, outer: int, ostride: int, rows: int, ld: int,
                    nb: int) -> np.ndarray:
    """Image offsets of a region's bytes, in order: outer blocks, rows, bytes."""
    starts = (off + (np.arange(outer, dtype=np.int64) * ostride)[:, None]
              + (np.arange(rows, dtype=np.int64) * ld)[None, :]).ravel()
    return (starts[:, None] + np.arange(nb, dtype=np.int64)[None, :]).ravel()


def _first_unwritten(tile: _Tile, offsets: np.ndarray) -> int:
    """Absolute address of the first never-written byte among `offsets` (in
    their order), or -1."""
    mask = tile.written[offsets]
    if mask.all():
        return -1
    return tile.base + int(offsets[int(np.argmin(mask))])


def _patch_map(pkg: Package) -> dict[tuple[int, int], list[int]]:
    """(target, vertex/transfer index) -> the patches applying to it, in order."""
    a = pkg.arrays
    out: dict[tuple[int, int], list[int]] = {}
    for p in range(pkg.n_patches):
        out.setdefault((int(a["p_target"][p]), int(a["p_index"][p])), []).append(p)
    return out


def _load_tiles(pkg: Package, image: MemoryImage) -> dict[int, _Tile]:
    """Own per-tile images over the span of each tile's tensor buffers, filled
    from the loader's image (inputs and parameters already written)."""
    a = pkg.arrays
    span: dict[int, tuple[int, int]] = {}
    for b in range(a["buf_tile"].size):
        if int(a["buf_kind"][b]) not in TENSOR_KINDS:
            continue
        t, lo = int(a["buf_tile"][b]), int(a["buf_addr"][b])
        hi = lo + int(a["buf_bytes"][b])
        old = span.get(t, (lo, hi))
        span[t] = (min(old[0], lo), max(old[1], hi))
    tiles = {}
    for t, (lo, hi) in sorted(span.items()):
        row = int(image.tile_row[t])
        assert int(image.tile_base[t]) == lo and int(image.tile_size[t]) == hi - lo, t
        bits = np.unpackbits(image.written[row].view(np.uint8), bitorder="little")
        tiles[t] = _Tile(lo, image.mem[row, :hi - lo].copy(), bits[:hi - lo].astype(bool))
    return tiles


def _store_tiles(tiles: dict[int, _Tile], image: MemoryImage) -> None:
    """Write the final memory and written mask back into the loader's image."""
    for t, tile in tiles.items():
        row = int(image.tile_row[t])
        n = tile.mem.size
        image.mem[row, :n] = tile.mem
        bits = np.zeros(image.written.shape[1] * 64, dtype=bool)
        bits[:n] = tile.written
        image.written[row] = np.packbits(bits, bitorder="little").view(np.uint64)

