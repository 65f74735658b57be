"""Modelled per-tile load of the phases of one superstep, from lowered layouts.

The `tiles` proposal (planner.proposals) asks: two phases merged into one
step (planner.schedule) that sit on the same tiles pay the sum of their
loads there — what if one op's placement moved?  This module answers from
the `Lowered` steps alone (no expansion), with the engine's cost model
(simulator/engine.py) applied to modelled loads:

- an exchange phase (a `redistribute` step, or a heads op: the move is the
  op) brings every byte of the destination layout into its tiles
  (`Layout.tile_bytes`, replicas included) and sends every byte of the
  source's primary cells once (multicast); a tile's exchange load is
  max(ceil(bytes in / in_bw), ceil(bytes out / out_bw)) over the phases of
  the step summed per direction, plus one sync per step; a K-split
  matmul's `partial sums` exchange is modelled as its output layout's bytes
  into and out of each of its tiles (it stays within the op's tiles);
- a compute phase of an op (its own label or a K-split `partials` /
  `partial sums` / `reduce` phase) costs its recipe's `compute_cycles` on
  every tile of its output layout (an overestimate for the reduce phase);
  a move's `pack` (`unpack`) COPY phase costs its bytes / LDST_BYTES_PER_CYCLE
  + the vertex overhead on the source (destination) tiles; an absorbed cast
  its elements / the fp16 vector rate + the overhead on its tiles; a
  compute step costs the max over tiles of the summed loads.

Bytes already on the destination tile are counted as moved (locality is
not modelled), so moving the tiles of a phase changes its modelled cost only
through what it shares a step with.  Loads are dense arrays by tile, so one
side of a phase can be moved (`shifted`) without lowering again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.cost import LDST_BYTES_PER_CYCLE
from planner.graph import MergeHeads, SplitHeads
from planner.lowered import Lowered, Step
from simulator.device import Device

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


def phase_load(lowered: Lowered, step: Step, label: str, exchange: bool,
               device: Device) -> PhaseLoad:
    """The modelled load of the phase `label` (a schedule label: the step's
    label with expand's suffix, or `cast <op>`) of lowered `step`, in an
    exchange (`exchange`) or compute step."""
    n = device.tiles
    zero = np.zeros(n, dtype=np.int64)
    overhead = device.vertex_overhead_cycles
    if exchange and step.kind == "compute" and not is_heads(step):
        # a K-split matmul's `partial sums`: within the op's own tiles
        on = _tiles_of(lowered, step.outputs[0], n)
        return PhaseLoad(zero, on, on)
    if exchange:
        src, dst = step.inputs[0], step.outputs[0]
        return PhaseLoad(zero, _tiles_of(lowered, dst, n), _tiles_of(lowered, src, n, True))
    if label.endswith(" pack") or label.endswith(" unpack"):
        pack = label.endswith(" pack")
        side = _tiles_of(lowered, step.inputs[0] if pack else step.outputs[0], n, pack)
        return PhaseLoad(np.where(side > 0, side // LDST_BYTES_PER_CYCLE + overhead, 0),
                         zero, zero)
    out = lowered.values[step.outputs[0]]
    on = _tiles_of(lowered, out.name, n)
    if step.kind == "cast":
        rate = device.vector_fp16
        return PhaseLoad(np.where(on > 0, on // out.elem // rate + overhead, 0), zero, zero)
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
    cin, cout = device.exchange_in_bytes_per_cycle, device.exchange_out_bytes_per_cycle
    bytes_in, bytes_out = total["bytes_in"], total["bytes_out"]
    worst = np.maximum(-(-bytes_in // cin), -(-bytes_out // cout)).max(initial=0)
    return device.sync_cycles + int(worst)


def shifted(load: PhaseLoad, parts: tuple[str, ...], by: int) -> PhaseLoad:
    """`load` with the tiles of `parts` (of PARTS) moved `by` physical tiles
    (cyclically)."""
    return PhaseLoad(*(np.roll(getattr(load, p), by) if p in parts else getattr(load, p)
                       for p in PARTS))


def is_heads(step: Step) -> bool:
    """True for a SplitHeads/MergeHeads step (expand makes it an exchange)."""
    return isinstance(step.op, (SplitHeads, MergeHeads))
