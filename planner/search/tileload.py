"""Modelled per-tile load of the phases of one superstep, from lowered
layouts, and which of those loads move with one op's placement.

The `tiles` proposal (planner.search.kinds.tiles) asks: two phases merged into one
step (planner.lowering.schedule) that sit on the same tiles pay the sum of their
loads there — what if one op's placement moved?  This module answers from
the `Lowered` steps alone (no expansion), with the engine's cost model
(simulator/engines/numba.py) applied to modelled loads:

- an exchange phase (a `redistribute` step, or a heads op: the move is the
  op) brings every byte of the destination layout into its tiles
  (`Layout.tile_bytes`, replicas included) and sends every byte of the
  source's primary cells once (multicast); a tile's exchange load is
  max(ceil(bytes in / in_bw), ceil(bytes out / out_bw)) over the phases of
  the step summed per direction, plus one sync per step; a K-split
  matmul's `partial sums` exchange is modelled as its output layout's bytes
  into and out of each of its tiles (it stays within the op's tiles);
- a compute phase of an op (its own label or a K-split `partials` /
  `reduce` phase) costs its recipe's `compute_cycles` on
  every tile of its output layout (an overestimate for the reduce phase);
  a move's `pack` (`unpack`) COPY phase costs a copy call + its bytes at the
  copy rate on the source (destination) tiles; an absorbed cast a cast call
  + its elements' vector work on its tiles (the device's COPY / CAST cost
  constants); a compute step costs the max over tiles of the summed loads.

Bytes already on the destination tile are counted as moved (locality is
not modelled), so moving the tiles of a phase changes its modelled cost only
through what it shares a step with.  Loads are dense arrays by tile, so one
side of a phase can be moved (`shifted`) without lowering again;
`Placement` says which sides follow which op, `shift_gain` what moving one
op saves over the measured merged steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.lowering.lowered import Lowered, Step
from simulator.device import Device
from simulator.timing import exchange_estimate

PARTS = ("compute", "bytes_in", "bytes_out")


@dataclass(frozen=True, eq=False)
class PhaseLoad:
    """The modelled load of one phase, as int64 arrays [tiles] by physical
    tile: `compute` cycles (compute phases) or `bytes_in`/`bytes_out`
    (exchange phases); unused parts are zeros."""

    compute: np.ndarray
    bytes_in: np.ndarray
    bytes_out: np.ndarray


def _tiles_of(lowered: Lowered, value: str, tiles: int, primary: bool = False) -> np.ndarray:
    v = lowered.values[value]
    return v.layout.tile_load(v.elem, tiles, primary)


def phase_load(lowered: Lowered, step: Step, part: str, exchange: bool,
               device: Device) -> PhaseLoad:
    """The modelled load of the phase `part` ("" or one of
    planner.lowering.program.PARTS) of lowered `step`, in an exchange
    (`exchange`) or compute step."""
    n = device.tiles
    zero = np.zeros(n, dtype=np.int64)
    c = device.costs
    if exchange and step.kind == "compute" and not is_heads(step):
        # a K-split matmul's `partial sums`: within the op's own tiles
        on = _tiles_of(lowered, step.outputs[0], n)
        return PhaseLoad(zero, on, on)
    if exchange:
        src, dst = step.inputs[0], step.outputs[0]
        return PhaseLoad(zero, _tiles_of(lowered, dst, n), _tiles_of(lowered, src, n, True))
    if part in ("pack", "unpack"):
        pack = part == "pack"
        side = _tiles_of(lowered, step.inputs[0] if pack else step.outputs[0], n, pack)
        return PhaseLoad(np.where(side > 0, c.copy_call + side // c.copy_bytes_per_cycle, 0),
                         zero, zero)
    out = lowered.values[step.outputs[0]]
    on = _tiles_of(lowered, out.name, n)
    if step.kind == "cast":
        group = device.workers * c.cast_grain
        work = -(-(on // out.elem) // group) * device.workers * c.cast_slots
        return PhaseLoad(np.where(on > 0, c.cast_call + work, 0), zero, zero)
    assert step.recipe is not None, f"compute step {step.label} without a recipe"
    return PhaseLoad(np.where(on > 0, step.recipe.compute_cycles, 0), zero, zero)


def step_cycles(loads: list[PhaseLoad], exchange: bool, device: Device) -> int:
    """The modelled cycles of one step made of `loads` (module docstring)."""
    total = {p: np.zeros(device.tiles, dtype=np.int64) for p in PARTS}
    for ld in loads:
        for p in PARTS:
            total[p] += getattr(ld, p)
    if not exchange:
        return int(total["compute"].max(initial=0))
    return exchange_estimate(device, total["bytes_in"], total["bytes_out"])


def shifted(load: PhaseLoad, parts: tuple[str, ...], by: int) -> PhaseLoad:
    """`load` with the tiles of `parts` (of PARTS) moved `by` physical tiles
    (cyclically)."""
    return PhaseLoad(*(np.roll(getattr(load, p), by) if p in parts else getattr(load, p)
                       for p in PARTS))


def is_heads(step: Step) -> bool:
    """True for a move op's step (SplitHeads, MergeHeads, Broadcast, ...:
    expand makes it an exchange)."""
    return step.op is not None and step.op.FAMILY == "move"


# a measured merged step: (cycles, exchange?, [(phase load, {op: parts it moves})])
MergedStep = tuple[int, bool, list[tuple[PhaseLoad, dict[str, tuple[str, ...]]]]]


class Placement:
    """Which parts of the phase loads of a lowering follow which op's
    placement (`Plan.tile_shift`): an op's own phases; the destination side
    of the moves into it (inputs, parameters, absorbed casts); the source
    side of the moves out of its result; for a matmul, both sides of its
    parameter moves (its homes follow it).  Canonical values never move."""

    def __init__(self, lowered: Lowered) -> None:
        self.lowered = lowered

    def owners(self, st: Step, part: str, exchange: bool) -> dict[str, tuple[str, ...]]:
        """The parts (of PARTS) of the phase `part` of lowered step `st` that
        move with each op."""
        if st.kind == "compute" and not is_heads(st):  # its own phases move with it
            return {st.label: ("bytes_in", "bytes_out") if exchange else ("compute",)}
        src = self.producer(st.inputs[0])
        dst = None if is_heads(st) else self.consumer(st.outputs[0])
        if exchange:
            parts: dict[str, tuple[str, ...]] = {}
            if dst is not None:
                parts[dst] = ("bytes_in",)
            if src is not None:
                parts[src] = parts.get(src, ()) + ("bytes_out",)
            return parts
        if part == "pack":
            return {src: ("compute",)} if src is not None else {}
        return {dst: ("compute",)} if dst is not None else {}

    def producer(self, value: str) -> str | None:
        """The op whose placement a value's tiles follow: its compute
        producer, or the matmul reading it when it is a weight or bias home."""
        lw = self.lowered
        for st in lw.steps:
            if value in st.outputs and st.kind == "compute" and not is_heads(st):
                return st.label
        if lw.values[value].role == "parameter":
            readers = [self.consumer(st.outputs[0]) for st in lw.steps
                       if st.kind == "redistribute" and st.inputs == (value,)]
            ops = {st.label: st for st in lw.steps if st.kind == "compute"}
            op = ops[readers[0]].op if len(readers) == 1 and readers[0] is not None else None
            if op is not None and op.FAMILY == "matmul":
                return readers[0]
        return None

    def consumer(self, value: str) -> str | None:
        """The one op whose placement decides a converted value's layout
        (through an absorbed cast), or None when several read it or the value
        is canonical (canonical layouts never shift)."""
        users = [st for st in self.lowered.steps if value in st.inputs]
        if len(users) != 1 or self.lowered.values[value].role != "activation":
            return None
        if users[0].kind == "cast":
            return self.consumer(users[0].outputs[0])
        if users[0].kind != "compute" or is_heads(users[0]):
            return None
        return users[0].label

    def shift_choices(self, op: str, tiles: int) -> list[int]:
        """Candidate logical shifts of `op`: half the spacing of its tiles, its
        tile count, half the device (distinct, 0 < shift < tiles)."""
        st = next(s for s in self.lowered.steps if s.kind == "compute" and s.label == op)
        lay = self.lowered.values[st.outputs[0]].layout
        count = len({t for o in lay.owners for t in o})
        return sorted({s for s in ((tiles // count) // 2, count, tiles // 2) if 0 < s < tiles})


def shift_gain(steps: list[MergedStep], op: str, by: int, device: Device) -> int:
    """Estimated cycles saved by moving `op`'s parts `by` physical tiles: Σ
    over the merged steps it takes part in of measured cycles × (modelled −
    moved modelled) / modelled."""
    gain = 0.0
    for cycles, exchange, phases in steps:
        if not any(op in owners for _, owners in phases):
            continue
        old = step_cycles([ld for ld, _ in phases], exchange, device)
        new = step_cycles([shifted(ld, owners.get(op, ()), by) for ld, owners in phases],
                          exchange, device)
        if old > 0:
            gain += cycles * (old - new) / old
    return int(round(gain))
