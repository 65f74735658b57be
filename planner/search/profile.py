"""The incumbent's simulated cycles mapped back to what it is made of.

`step_profile(built, cycles_per_step)` maps a package's simulated per-step
cycles to the lowered steps the schedule's phases expand (Step.phases) and to
graph ops through the package's provenance, and keeps every merged step's own
cycles.  No label is parsed: a step's phases carry the lowered step they came
from, and the provenance names the graph op and role of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.lowering.provenance import CONTROL

if TYPE_CHECKING:
    from planner.lowering.stages import Built


@dataclass(frozen=True)
class Merged:
    """A measured step of several phases: its kind, its phases in program
    order as (label, lowered step, part) (planner.lowering.schedule.Step) and
    its cycles summed over Repeat iterations."""

    kind: str
    phases: tuple[tuple[str, str, str], ...]
    cycles: int


@dataclass(frozen=True)
class Profile:
    """The incumbent's simulated cycles mapped back to what it is made of:
    `moves` per lowered step (an op's compute, a move, `cast <op>`; each
    step's cycles summed over Repeat iterations and split evenly among the
    phases merged into it), `ops` per graph op through the package's
    provenance (its compute, the conversions lowered for it and the move of
    its result to canonical: planner.lowering.provenance), `reduction` the
    K-split reduction phases' share and `merged` every step of several
    phases."""

    moves: dict[str, int]
    ops: dict[str, int]
    reduction: int
    merged: tuple[Merged, ...]

    @classmethod
    def empty(cls) -> Profile:
        """Nothing measured (proposals from catalogue estimates alone)."""
        return cls({}, {}, 0, ())


def step_profile(built: Built, cycles_per_step: np.ndarray) -> Profile:
    """The Profile of `built` from its simulated per-step cycles."""
    moves: dict[str, int] = {}
    ops: dict[str, int] = {}
    reduction = 0
    merged = []
    prov = built.package.provenance
    for s, (st, c) in enumerate(zip(built.schedule.steps, cycles_per_step.tolist(),
                                    strict=True)):
        if not st.phases:
            continue
        c = int(c)
        if len(st.phases) > 1:
            merged.append(Merged(st.kind, tuple((lab, src, part) for lab, (src, part)
                                                in zip(st.labels, st.phases, strict=True)),
                                 c))
        share = c // len(st.phases)
        served = prov[s] if prov else ()
        for i, (src, part) in enumerate(st.phases):
            moves[src] = moves.get(src, 0) + share
            if part == "reduce":
                reduction += share
            if i < len(served) and served[i][0] != CONTROL:
                ops[served[i][0]] = ops.get(served[i][0], 0) + share
    return Profile(moves, ops, reduction, tuple(merged))

