"""What proposal kinds work from: `Around` (the incumbent and what was measured
of it) and `Proposal` (one neighbour of the incumbent, with its estimated gain).

A proposal kind is a function `(around) -> list[Proposal]` registered by name
(planner.search.registry.PROPOSALS; the built-in kinds are the modules of
planner.search.kinds).  `Around` holds the graph and device, the incumbent
plan with its parameter-home rotation pinned (`plan`, so that a change of one
op leaves every other op's homes where they were), its lowering, its measured
cycles (`prof`, planner.search.profile.Profile), the catalogue shortlist
length and the planning context, and the helpers the kinds share: an op's
current recipe and shortlist, the gain of replacing it, the measured cycles
of a lowered step or of the moves of a tensor, and the closed canonical
boundaries that may open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planner.decide import catalogue as cat
from planner.decide import fusion
from planner.decide.plan import Plan
from planner.ir.graph import Graph, OpSite, op_sites
from planner.lowering.lower import Lowered, arrives_narrow, lower, moves_only, must_materialise
from planner.lowering.lowered import Step
from planner.lowering.provenance import move_role
from planner.search.profile import Profile
from simulator.device import Device

if TYPE_CHECKING:
    from planner.lowering.state import BuildState


@dataclass(frozen=True)
class Proposal:
    """One neighbour of the incumbent: `plan` differs from it in one decision
    (two for `joint`).  `gain` is estimated cycles saved (may be ≤ 0)."""

    kind: str
    description: str
    gain: int
    plan: Plan = field(repr=False)

    @property
    def order_key(self) -> tuple[int, str, str]:
        return (-self.gain, self.kind, self.description)

    def __lt__(self, other: Proposal) -> bool:
        return self.order_key < other.order_key


class Around:
    """What proposals are made from: the graph and device, the incumbent plan
    with its parameter-home rotation pinned (`plan`), its lowering, its
    measured cycles (`prof`, a Profile: per lowered step and per op),
    the catalogue shortlist length and the planning context (module
    docstring)."""

    def __init__(self, g: Graph, device: Device, plan: Plan, prof: Profile,
                 limit: int, ctx: BuildState | None = None) -> None:
        self.g = g
        self.device = device
        self.ctx = ctx
        self.cache = ctx.catalogue if ctx is not None else cat.CatalogueCache()
        lowered = lower(g, device, plan, ctx)
        self.lowered = lowered
        # every proposal starts from the incumbent with its rotation pinned
        self.plan = plan.with_rotation(lowered.rotation)
        self.prof = prof
        self.costs = prof.ops
        # the labels of the incumbent's moves by (move_role, moved tensor), in program order
        self.moves: dict[tuple[str, str], list[str]] = {}
        for st in lowered.steps:
            if st.kind == "redistribute":
                key = (move_role(lowered, st), lowered.values[st.outputs[0]].tensor)
                labels = self.moves.setdefault(key, [])
                if st.label not in labels:
                    labels.append(st.label)
        self.limit = limit
        self.sites = op_sites(g)
        # qualified names of the ops the incumbent runs in fused sibling groups
        self.fused_ops = {f"{scope}{op.name}" for g_, scope, _ in self.graphs()
                          for grp in fusion.sibling_groups(g_)
                          if self.plan.is_fused(fusion.group_key(scope, grp)) for op in grp}

    def measured(self, label: str) -> int:
        """Measured cycles of one lowered step (by its label)."""
        return self.prof.moves.get(label, 0)

    def measured_moves(self, role: str, tensor: str) -> int:
        """Measured cycles of the incumbent's moves of `tensor` (qualified)
        in `role` (planner.lowering.provenance.move_role)."""
        return sum(self.measured(label) for label in self.moves.get((role, tensor), ()))

    def narrow(self, site: OpSite) -> bool:
        """`site`'s `a` operand arrives narrow under the incumbent's cast
        orders (planner.lowering.lower.arrives_narrow)."""
        return arrives_narrow(site.graph, site.op, self.plan, site.scope)

    def current(self, site: OpSite) -> tuple[tuple[cat.Recipe, ...], cat.Recipe]:
        packing = self.plan.packing
        narrow = self.narrow(site)
        short = cat.catalogue(site.graph, site.op, self.device, self.limit, packing,
                              self.cache, narrow)
        key = self.plan.recipe(site.name)
        if key is None:
            return short, short[0]
        for r in short:
            if r.key == key:
                return short, r
        return short, cat.recipe_from_key(site.graph, site.op, self.device, key, packing,
                                          self.cache, narrow)

    def op_gain(self, site: OpSite, cur: cat.Recipe, alt: cat.Recipe) -> int:
        est = site.trips * cur.cycles
        meas = self.costs.get(site.name, 0)
        calib = min(4.0, max(0.25, meas / est)) if est > 0 and meas > 0 else 1.0
        return int(round(site.trips * (cur.cycles - alt.cycles) * calib))


    def boundaries(self) -> list[tuple[OpSite, OpSite, str]]:
        """(producer, single consumer, qualified tensor) of every closed
        canonical boundary that may open (not a graph output, Repeat
        init/final/yield, nor a Cast or Repeat edge: opening a Cast's
        output into a MatMul moved siglip-so400m-map's gelu_fp8 from the
        fc1 layout's cells row by row, 1.5 M transfers for 1 % of the cycles,
        30 -> 43 s of planning at batch 2).  A move op (SplitHeads,
        MergeHeads) may read its input where the producer leaves it: its
        redistribution then starts from the producer's cells and the move to
        canonical before it goes (siglip-so400m-map 1 layer: q and k into
        their splits, 2.5 k cycles and one exchange step)."""
        out = []
        for site in self.sites:
            g = site.graph
            if site.op.CONVERSION or site.op.FAMILY == "move":
                continue
            t = site.op.outputs[0]
            q = f"{site.scope}{t}"
            if self.plan.is_open(q) or must_materialise(g, t):
                continue
            users = g.consumers(t)
            if len(users) != 1 or (moves_only(users[0]) and users[0].FAMILY != "move"):
                continue
            consumer = next(s for s in self.sites
                            if s.graph is g and s.op is users[0])
            out.append((site, consumer, q))
        return out

    def graphs(self) -> list[tuple[Graph, str, int]]:
        """(graph, scope, trips) of the top graph and every Repeat body (as op_sites walks them)."""
        seen: dict[str, tuple[Graph, str, int]] = {"": (self.g, "", 1)}
        for s in self.sites:
            seen.setdefault(s.scope, (s.graph, s.scope, s.trips))
        return list(seen.values())


def pinned(g: Graph, device: Device, plan: Plan, ctx: BuildState | None = None) -> Plan:
    """`plan` with every parameter-home rotation base pinned where its
    lowering puts it: the common base of all proposals around `plan`."""
    return plan.with_rotation(lower(g, device, plan, ctx).rotation)


def lowered_moves(lw: Lowered) -> dict[tuple[str, str, str], list[Step]]:
    """The redistribute steps of a lowering by (kind of move, source tensor,
    destination tensor): names that do not depend on placement (value names
    count the values made before them)."""
    out: dict[tuple[str, str, str], list[Step]] = {}
    for st in lw.steps:
        if st.kind == "redistribute":
            key = (move_role(lw, st), lw.values[st.inputs[0]].tensor,
                   lw.values[st.outputs[0]].tensor)
            out.setdefault(key, []).append(st)
    return out
