"""Expand a lowered graph into a symbolic `Program` (planner/program.py).

`expand_program(graph, device, plan)` lowers (planner/lower.py) and then
creates, per value cell and replica, one logical buffer on its tile, and per
step the phases of vertices and transfers:

- buffers: parameter homes are persistent `parameter` buffers; graph inputs
  and outputs persistent `activation` buffers; other values `activation`
  (canonical and op outputs) or `exchange-landing` (operand copies);
  K-split partials `scratch`, partial landing blocks `exchange-landing`;
- the Repeat body is expanded once between LoopMark(begin, trips) and
  LoopMark(end).  An iterated parameter home cell is one sequence buffer of
  `trips` per-layer blocks; its refs carry `iter_stride` = block bytes.
  Invariant parameters are plain refs.  A loop-carried value uses two
  buffer sets in ping-pong: iteration i reads the argument from set i % 2
  and writes the yield to set (i + 1) % 2 (refs with a per-iteration `seq`;
  the linker makes a table patch for 3+ trips, an arithmetic one for 2), so
  nothing is copied at the end of an iteration.  The outer init value is set
  0, the outer final value set trips % 2;
- I/O blocks for every input, parameter (home cells; an iterated parameter's
  cell is one block covering all layers: lo = (0, r0, c0), hi = (trips, r1,
  c1), ld0 = per-layer block bytes) and output (a rank-3 tensor gets one
  block per batch index a cell touches).

Incremental expansion: a step's expansion reads only the step, the `Value`s
it names and the state (buffers, items, placed values — all append-only)
left by the steps before it.  `expand_program` therefore keeps the last few
expansions (a build state's `PrefixStore`) with that state's prefix lengths after
every step, and resumes from the one sharing the longest prefix of step
signatures with the new lowering: an optimizer proposal that changes one op
re-expands only from the first lowered step that differs.  The result is the
same Program (same buffer ids, same items) as a from-scratch expansion; the
prefix objects are shared with the base, and no stage mutates a Program.

Raises BuildFailure(stage="expand", tile, need, have, detail, profile) when a
value cell, or a tile's persistent buffers, do not fit a tile.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from planner.decide.layout import Layout, view2d
from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.expand_redist import Loc, moves, shareable
from planner.lowering.families.rows import expand_cast_step
from planner.lowering.lower import Lowered, Step, Value, lower
from planner.lowering.placement import PLACEMENTS
from planner.lowering.program import TENSOR_KINDS, Buf, IOBlock, LoopMark, Phase, Program
from simulator.device import Device
from tilecommon.errors import BuildFailure, Unsupported

if TYPE_CHECKING:
    from planner.lowering.state import BuildState


class Expander:
    def __init__(self, lw: Lowered, device: Device) -> None:
        self.lw = lw
        self.device = device
        self.prog = Program()
        self.placed: dict[str, list[list[Loc]]] = {}
        self.persistent = set(lw.inputs.values()) | set(lw.outputs.values())
        self.limit = device.memory_size - device.fixed_bytes  # bytes a tile can hold

    # ------------------------------------------------------------ helpers

    def value(self, name: str) -> Value:
        return self.lw.values[name]

    def locs(self, name: str) -> list[list[Loc]]:
        return self.placed[name]

    def emit(self, item: Phase | LoopMark) -> None:
        if isinstance(item, Phase) and not (item.vertices or item.transfers):
            return
        self.prog.items.append(item)

    def new_cell_buf(self, v: Value, tile: int, nbytes: int, kind: str, name: str,
                     persistent: bool) -> int:
        self.check_cell(v, tile, nbytes, name)
        return self.prog.new_buf(tile, nbytes, kind, name, persistent)

    def check_cell(self, v: Value, tile: int, nbytes: int, name: str) -> None:
        """Raise BuildFailure when a cell buffer of `nbytes` cannot fit a tile."""
        if nbytes > self.limit:
            raise BuildFailure("expand", tile, nbytes, self.limit,
                               f"cell {name} of {v.tensor} does not fit one tile",
                               self.profile(tile))

    def profile(self, tile: int) -> dict[str, int]:
        """Bytes by buffer kind of the buffers expand has put on `tile`."""
        out: dict[str, int] = {}
        for b in self.prog.bufs:
            if b.tile == tile:
                key = f"persistent {b.kind}" if b.persistent else b.kind
                out[key] = out.get(key, 0) + b.nbytes
        return dict(sorted(out.items()))

    def check_persistent(self) -> None:
        """Persistent buffers (parameter homes, graph inputs/outputs) are live
        all program long: if they alone overflow a tile, no schedule or
        allocation can help — fail here, naming the worst tile."""
        per: dict[int, int] = {}
        for b in self.prog.bufs:
            if b.persistent:
                per[b.tile] = per.get(b.tile, 0) + b.nbytes
        if not per:
            return
        tile = max(sorted(per), key=lambda t: per[t])
        if per[tile] > self.limit:
            raise BuildFailure("expand", tile, per[tile], self.limit,
                               "persistent buffers (parameter homes, inputs, outputs) "
                               "exceed the tile", self.profile(tile))

    def materialise(self, v: Value, kind: str | None = None,
                    skip: dict[tuple[int, int], Loc] | None = None) -> None:
        """Give every cell replica of `v` a buffer (unless bound already);
        `skip` supplies shared storage for some (cell, replica) pairs.
        Buffers are appended directly (10⁴–10⁵ per build): `kind` is one of
        TENSOR_KINDS and cells are never empty, what `Program.new_buf` checks."""
        if v.name in self.placed:
            return
        lay = v.layout
        persistent = v.name in self.persistent or v.role == "parameter"
        if kind is None:
            kind = "parameter" if v.role == "parameter" else "activation"
        assert kind in TENSOR_KINDS, kind
        layers = max(1, v.trips)
        sizes = cell_bytes(lay, v.elem)  # one layer's block
        bufs = self.prog.bufs
        out: list[list[Loc]] = []
        for cell, owners in enumerate(lay.owners):
            nbytes = sizes[cell]
            stride = nbytes if v.trips else 0
            stem = f"{v.name}[{cell // lay.nc},{cell % lay.nc}]"
            first = len(bufs)
            if not skip:
                if nbytes * layers > self.limit:
                    self.check_cell(v, owners[0], nbytes * layers, f"{stem}0")
                bufs += [Buf(first + k, tile, nbytes * layers, kind, f"{stem}{k}", persistent)
                         for k, tile in enumerate(owners)]
                out.append([(b, 0, stride, ()) for b in range(first, len(bufs))])
                continue
            locs: list[Loc] = []
            for k, tile in enumerate(owners):
                if (cell, k) in skip:
                    locs.append(skip[cell, k])
                    continue
                self.check_cell(v, tile, nbytes * layers, f"{stem}{k}")
                locs.append((len(bufs), 0, stride, ()))
                bufs.append(Buf(len(bufs), tile, nbytes * layers, kind, f"{stem}{k}",
                                persistent))
            out.append(locs)
        self.placed[v.name] = out

    # ------------------------------------------------------------ carries

    def bind_carries(self) -> None:
        for c in self.lw.carries:
            keep = c.final in self.persistent  # the last yield is a graph output
            if keep:
                self.persistent.add(c.init)
            iv = self.value(c.init)
            self.materialise(iv)
            x0 = self.placed[c.init]
            x1: list[list[Loc]] = []
            av = self.value(c.arg)
            lay = av.layout
            for ri, ci in lay.cells():
                cell = ri * lay.nc + ci
                r0, r1, c0, c1 = lay.rect(ri, ci)
                tile = lay.owners[cell][0]
                buf = self.new_cell_buf(av, tile, (r1 - r0) * (c1 - c0) * av.elem,
                                        "activation", f"{c.arg}[{ri},{ci}]pong", keep)
                x1.append([(buf, 0, 0, ())])
            sets = (x0, x1)
            self.placed[c.arg] = self._seq(sets, c.trips, 0)
            self.placed[c.yld] = self._seq(sets, c.trips, 1)
            self.placed[c.final] = sets[c.trips % 2]

    @staticmethod
    def _seq(sets: tuple[list[list[Loc]], list[list[Loc]]], trips: int,
             shift: int) -> list[list[Loc]]:
        out: list[list[Loc]] = []
        for cell in range(len(sets[0])):
            bufs = [sets[(i + shift) % 2][cell][0][0] for i in range(trips)]
            if trips == 1:
                out.append([(bufs[0], 0, 0, ())])
            else:
                out.append([(bufs[0], 0, 0, tuple((b, 0) for b in bufs))])
        return out

    # ------------------------------------------------------------ steps

    def mark(self) -> tuple[int, int, int]:
        """The expansion state as prefix lengths (everything is append-only
        until `io`): buffers, program items, placed values."""
        return len(self.prog.bufs), len(self.prog.items), len(self.placed)

    def run(self, base: Expansion | None = None, reuse: int = -1,
            sig: Signature | None = None) -> Expansion:
        """Expand every step; with `base` (an expansion of a lowering whose
        header and first `reuse` step signatures equal this one's, `reuse` ≥
        0), start from `base`'s state after its first `reuse` steps."""
        marks: list[tuple[int, int, int]] = []
        steps = self.lw.steps
        while 0 < reuse < len(steps) and steps[reuse].fused and \
                steps[reuse].fused == steps[reuse - 1].fused:
            reuse -= 1  # never restart inside a fused group (its phases interleave)
        if base is None or reuse < 0:
            self.bind_carries()
            for v in self.lw.inputs.values():
                self.materialise(self.value(v))
            start = 0
        else:
            nb, ni, npl = base.marks[reuse]
            self.prog.bufs = base.program.bufs[:nb]
            self.prog.items = base.program.items[:ni]
            self.placed = dict(islice(base.placed.items(), npl))
            self.persistent = set(base.persistent)
            marks.extend(base.marks[:reuse])
            start = reuse
        marks.append(self.mark())
        i = start
        while i < len(steps):
            if not steps[i].fused:
                self.step(steps[i])
                marks.append(self.mark())
                i += 1
                continue
            j = i
            while j < len(steps) and steps[j].fused == steps[i].fused:
                j += 1
            self.fused_steps(steps[i:j])
            marks.extend([marks[-1]] * (j - i - 1) + [self.mark()])
            i = j
        placed = dict(self.placed)
        persistent = frozenset(self.persistent)
        self.io()
        self.check_persistent()
        return Expansion(self.prog, self.device, sig or signature(self.lw), tuple(marks), placed,
                         persistent, start)

    def fused_steps(self, group: list[Step]) -> None:
        """A fused sibling group's steps (consecutive, one grid): each is
        expanded, then their phases are emitted interleaved (every member's
        first phase, then every second, ...), so the scheduler runs the
        members' partials, partial sums and reductions in one step each."""
        items = self.prog.items
        per_step = []
        for s in group:
            start = len(items)
            self.step(s)
            per_step.append(items[start:])
            del items[start:]
        for k in range(max(len(p) for p in per_step)):
            for p in per_step:
                if k < len(p):
                    item = p[k]
                    if isinstance(item, Phase):
                        item.group = group[0].fused
                    items.append(item)

    def step(self, s: Step) -> None:
        if s.kind == "loop_begin":
            self.emit(LoopMark(True, s.trips, s.label))
        elif s.kind == "loop_end":
            self.emit(LoopMark(False, s.trips, s.label))
        elif s.kind == "redistribute":
            self.redistribute(s.inputs[0], s.outputs[0], s.segments, s.label, s.row_moves)
        elif s.kind == "cast":
            expand_cast_step(self, s)
        else:  # compute: its family's placement expands it
            assert s.op is not None
            PLACEMENTS[s.op.FAMILY].expand(self, s)

    def params(self, s: Step) -> None:
        for name in s.inputs:
            v = self.value(name)
            if v.role == "parameter":
                self.materialise(v)

    def redistribute(self, src: str, dst: str, segments: tuple, label: str,
                     row_moves: int = 0) -> None:
        sv, dv = self.value(src), self.value(dst)
        if sv.role == "parameter":
            self.materialise(sv)
        skip: dict[tuple[int, int], Loc] = {}
        if dst not in self.placed and shareable(sv.layout, dv.layout, segments):
            slocs = self.placed[src]
            for cell, owners in enumerate(dv.layout.owners):
                for k, tile in enumerate(owners):
                    if tile in sv.layout.owners[cell]:
                        skip[cell, k] = slocs[cell][sv.layout.owners[cell].index(tile)]
        kind = "activation" if dv.role in ("canonical", "output") else "exchange-landing"
        self.materialise(dv, kind=kind, skip=skip)
        mv = moves(self.prog, label, sv.layout, self.placed[src], dv.layout, self.placed[dst],
                   sv.elem, segments, set(skip), row_moves)
        self.emit(Phase("compute", f"{label} pack", vertices=mv.pack, source=label,
                        part="pack"))
        self.emit(Phase("exchange", label, transfers=mv.transfers))
        self.emit(Phase("compute", f"{label} unpack", vertices=mv.unpack, source=label,
                        part="unpack"))

    # ------------------------------------------------------------ I/O

    def io(self) -> None:
        lw = self.lw
        entries = []
        for name, vname in lw.inputs.items():
            entries.append((name, "input", vname))
        for name in sorted(lw.homes):
            entries.append((name, "parameter", lw.homes[name]))
        for name, vname in lw.outputs.items():
            entries.append((name, "output", vname))
        for name, role, vname in entries:
            v = self.value(vname)
            shape = v.shape if not v.trips else (v.trips, *v.shape)
            self.prog.io_tensors.append({"name": name, "role": role, "shape": list(shape),
                                         "dtype": v.dtype, "scale_exp": v.scale_exp})
            self.materialise(v)
            self.io_blocks(name, role, v)

    def io_blocks(self, name: str, role: str, v: Value) -> None:
        if len(v.shape) > 3 or (len(v.shape) == 3 and v.trips):
            raise Unsupported(name, f"I/O tensor of rank {len(v.shape)}")
        lay = v.layout
        locs = self.placed[v.name]
        if len(v.shape) == 3:
            self.io_blocks_3d(name, role, v)
            return
        for ri, ci in lay.cells():
            r0, r1, c0, c1 = lay.rect(ri, ci)
            cell = ri * lay.nc + ci
            buf, off, _, _ = locs[cell][0]
            ld1 = (c1 - c0) * v.elem
            nbytes = (r1 - r0) * ld1
            if len(v.shape) == 2 and v.trips:
                lo, hi, ld0 = (0, r0, c0), (v.trips, r1, c1), nbytes
            elif len(v.shape) == 2:
                lo, hi, ld0 = (0, r0, c0), (1, r1, c1), nbytes
            elif v.trips:  # [trips, N]: layer l is row l, blocks of one layer apart
                lo, hi, ld0, ld1 = (0, 0, c0), (1, v.trips, c1), nbytes * v.trips, nbytes
            else:
                lo, hi, ld0 = (0, 0, c0), (1, 1, c1), nbytes
            self.prog.io.append(IOBlock(name, role, buf, off, lo, hi, ld0, ld1))

    def io_blocks_3d(self, name: str, role: str, v: Value) -> None:
        """A [Bt, T, d] tensor's cell covers rows of its Bt·T view: one block
        per batch index the cell's rows touch."""
        t = v.shape[1]
        lay = v.layout
        locs = self.placed[v.name]
        for ri, ci in lay.cells():
            r0, r1, c0, c1 = lay.rect(ri, ci)
            buf, off, _, _ = locs[ri * lay.nc + ci][0]
            ld1 = (c1 - c0) * v.elem
            row = r0
            while row < r1:
                b, t0 = divmod(row, t)
                t1 = min(t, t0 + r1 - row)
                self.prog.io.append(IOBlock(name, role, buf, off + (row - r0) * ld1,
                                            (b, t0, c0), (b + 1, t1, c1), (t1 - t0) * ld1, ld1))
                row += t1 - t0


def cell_bytes(lay: Layout, elem: int) -> list[int]:
    """Bytes of each cell of `lay` (row-major cell order) at `elem` bytes per element."""
    rows = [b - a for a, b in zip(lay.row_cuts, lay.row_cuts[1:], strict=False)]
    cols = [b - a for a, b in zip(lay.col_cuts, lay.col_cuts[1:], strict=False)]
    return [r * c * elem for r in rows for c in cols]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: expansion allocates ~10⁶ small
    acyclic objects, and the collections they trigger cost as much as the
    expansion itself.

    When the outermost pause ends, the objects alive then move to the
    collector's permanent generation (`gc.freeze`) before it is enabled
    again: what builds keep (a state's expansions, cached trials) would
    otherwise be scanned by the very next collection and by every full one.
    Frozen objects are still freed by reference counting; only a reference
    cycle among them is never collected (a handful per optimizer run)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.enable()


def expand_lowered(lw: Lowered, device: Device) -> Program:
    with gc_paused():
        return Expander(lw, device).run().program


def expand_program(g: Graph, device: Device, plan: Plan,
                   state: BuildState | None = None) -> Program:
    """The symbolic program of `g` on `device` under `plan` (module docstring).
    With a build `state`, resumes from the longest common step prefix of one
    of its recent expansions (`state.prefixes`); the result equals a
    from-scratch expansion."""
    lw = lower(g, device, plan, state)
    if state is None:
        return expand_lowered(lw, device)
    return state.prefixes.expand(lw, device).program


@dataclass(frozen=True)
class Signature:
    """What an expansion depends on, split so that prefixes compare: the
    header (everything read before the first step: carries and the values
    they bind, graph inputs and outputs) and, per lowered step, the step
    and the `Value`s it names (a step's expansion reads nothing else besides
    the state its predecessors left)."""

    header: tuple[Any, ...]
    steps: tuple[tuple[Any, ...], ...]


def signature(lw: Lowered) -> Signature:
    carry_values = tuple(lw.values[n] for c in lw.carries for n in (c.init, c.arg, c.yld,
                                                                      c.final))
    header = (tuple(lw.carries), carry_values, tuple(lw.inputs.items()),
              tuple(lw.values[v] for v in lw.inputs.values()), tuple(lw.outputs.items()))
    steps = tuple((s, tuple(lw.values[n] for n in s.inputs),
                   tuple(lw.values[n] for n in s.outputs)) for s in lw.steps)
    return Signature(header, steps)


@dataclass(frozen=True)
class Expansion:
    """A finished expansion and what a later one needs to resume from any
    of its step boundaries: `marks[i]` = (buffers, items, placed values)
    after the header (i = 0) and after step i − 1; `placed` and `persistent`
    as they were before `io`.  `resumed`: steps taken from a base (0: from
    scratch).  The program's lists are never mutated after expansion, so a
    resumed program may share its prefix objects with its base."""

    program: Program
    device: Device
    sig: Signature
    marks: tuple[tuple[int, int, int], ...]
    placed: dict[str, list[list[Loc]]]
    persistent: frozenset[str]
    resumed: int


def common_prefix(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] is not b[i] and a[i] != b[i]:
            return i
    return n


class PrefixStore:
    """The last `max_entries` expansions of this process, fewer while their
    programs' vertices and transfer rows sum to more than `max_rows` (the
    newest always stays).  `expand` resumes
    from the one sharing the longest step prefix with the new lowering
    (ties: the most recent), so a proposal that changes one op re-expands
    only from the first step whose signature differs (`max_entries` 0: every
    expansion from scratch).  `steps_reused` /
    `steps_expanded` count steps over all calls."""

    def __init__(self, max_entries: int = 4, max_rows: int = 1 << 62) -> None:
        self.max_entries = max_entries
        self.max_rows = max_rows
        self.rows: list[int] = []
        self.entries: list[Expansion] = []
        self.steps_reused = 0
        self.steps_expanded = 0
        self.lock = threading.Lock()

    def best(self, device: Device, sig: Signature) -> tuple[Expansion | None, int]:
        best: Expansion | None = None
        reuse = -1
        with self.lock:
            entries = list(self.entries)
        for e in reversed(entries):
            if e.device != device or e.sig.header != sig.header:
                continue
            k = common_prefix(e.sig.steps, sig.steps)
            if k > reuse:
                best, reuse = e, k
        return best, reuse

    def expand(self, lw: Lowered, device: Device) -> Expansion:
        sig = signature(lw)
        base, reuse = self.best(device, sig)
        with gc_paused():
            exp = Expander(lw, device).run(base, reuse, sig)
        rows = sum(len(p.vertices) + len(p.transfers) for p in exp.program.items
                   if isinstance(p, Phase))
        with self.lock:
            self.steps_reused += max(reuse, 0)
            self.steps_expanded += len(sig.steps) - max(reuse, 0)
            self.entries.append(exp)
            self.rows.append(rows)
            drop = max(0, len(self.entries) - self.max_entries)
            while drop < len(self.entries) - 1 and sum(self.rows[drop:]) > self.max_rows:
                drop += 1
            del self.entries[:drop]
            del self.rows[:drop]
        return exp


__all__ = ["expand_program", "expand_lowered", "view2d",
           "Expansion", "PrefixStore", "signature"]
