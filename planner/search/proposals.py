"""Local proposals: small neighbourhood changes to the incumbent Plan.

`proposals(graph, device, plan, profile, limit, kinds, ctx)` returns every
proposal of the `kinds` (default every registered kind: the seven below and
any a third party registers, planner.search.registry) around the incumbent
`plan`, each a frozen, hashable, sortable `Proposal` holding the changed
Plan, a `kind`, a one-line `description` and an estimated gain in cycles
(positive = expected cheaper).  The list is ordered by estimated gain,
largest first; ties by kind, then description — never by hash or set order.

Kinds (`KINDS`):

- `operator`: another shortlisted recipe of one op.  Gain = trips ×
  (current − alternative catalogue estimate) × calibration, where the
  calibration is the op's measured cycles (`Profile.ops`: its own steps plus
  the conversions lowered for it and the move of its result to canonical)
  over its own estimate, clipped to [¼, 4].
- `joint`: a producer/store + consumer change: the consumer of an activation
  takes another recipe and the producer stores its result straight into the
  consumer's layout (the boundary opens).  Gain = operator gain + open gain.
- `open`: open one canonical boundary.  Opening saves one hop only when the
  value moves twice (producer → canonical → consumer layout): gain = the
  smaller of the measured canonical redistribution (`canon <tensor>`) and
  the consumer's conversion from canonical (`to <tensor>@…`); 0 when the
  consumer reads the canonical layout as is.
- `cast`: cast before redistribution (early casting) for one absorbed Cast,
  run on its input's canonical owners (recipe `rows:<canonical rows per
  owner>`).  Gain = measured cast cycles − the catalogue estimate of that
  recipe (compute + the move of the result to its canonical layout) + the
  narrowed share of the exchange payload of the moves that carried the wide
  value.
- `packing`: another canonical packing ("element"/"half"/"double"/"rows").
  Every move to or from a canonical layout (`canon <t>`, `to <t>@…`) is
  bound by the canonical owners' bytes, which scale with the canonical rows
  per owner: gain = Σ measured payload (cycles − one sync per trip) ×
  (1 − rows per owner under the new packing / under the current one).
  Row ops that ran on the canonical owners follow them (`follow_packing`).
- `overlap`: let independent K-split reductions overlap (schedule flag).
  Gain = half the measured reduction cycles.
- `tiles`: shift one op's placement (`Plan.tile_shift`) off the tiles of
  the phases it shares a merged step with.  For every measured merged step
  (`Profile.merged`) the phases' per-tile loads are
  modelled from the lowered layouts (planner.tileload); an op owns its
  compute phases, the destination side of the moves into it (inputs,
  parameters, absorbed casts) and the source side of the moves out of its
  result (and, for a matmul, both sides of its parameter moves: its homes
  follow it).  Gain = Σ over the merged steps it takes part in of measured
  step cycles × (modelled − shifted modelled) / modelled, for the best of
  a few shifts (half the spacing of its tiles, its tile count, half the
  device), plus the measured cycles of moves the shift removes (the op
  lands where its input already is).  A shift that adds a move is not
  proposed: the new exchange phase sits between the phases that merged, so
  they no longer share a step (measured on the tiny device: two 1-tile
  GELUs merged on tile 0, one moved away, cost 14% more).  The best
  merged-step estimates are lowered first (at most TILE_LOWERINGS per
  round); at most TILE_PROPOSALS with a positive gain are proposed.  A
  global logical→physical mapping
  (`Plan.tile_offset`/`tile_stride`) is not proposed: tiles are homogeneous
  and the exchange uniform all-to-all, so a permutation of all tiles never
  changes cycles (tests/test_proposals.py shows it).

- `fuse`: run one group of sibling matmuls (the same input, weights of one
  shape: q, k, v; planner.decide.fusion) as one recipe over their
  concatenated weights.  Gain = trips × (Σ members' current estimates −
  the fused recipe's estimate) × calibration, the calibration being the
  members' measured cycles over their estimates, clipped to [¼, 4].  A
  fused member gets no `operator` or `tiles` proposals (its placement is
  the group's).

Unaffected parameter ownership stays fixed: every proposal pins the
incumbent's parameter-home rotation bases (`Plan.rotation`, read from one
lowering of the incumbent), so a recipe change moves only the homes of the op
whose recipe changes, and a tile shift only those of the shifted matmul;
packing changes the layout of every value by design.

Measured cycles (`profile`) come from `step_profile`, which maps the
incumbent's simulated per-step cycles back to the lowered steps the
schedule's phases expand (Step.phases) and to graph ops through the
package's provenance, and keeps every merged step's own cycles
(`Profile.merged`).  No label is parsed: a move is told apart by the roles
of the values it moves (planner.lowering.provenance.move_role).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.decide import catalogue as cat
from planner.decide import fusion
from planner.decide.layout import canonical_rows_per_owner, view2d
from planner.decide.plan import PACKINGS, Plan
from planner.ir.graph import DTYPE_BYTES, MOVE_OPS, Cast, Graph, Op, Repeat
from planner.lowering.lower import Lowered, arrives_narrow, lower
from planner.lowering.lowered import Step
from planner.lowering.provenance import CONTROL, move_role
from planner.lowering.schedule import EXCHANGE
from planner.search.registry import PROPOSALS
from planner.search.tileload import MergedStep, Placement, phase_load, shift_gain
from simulator.device import Device

if TYPE_CHECKING:
    from planner.lowering.stages import Built
    from planner.lowering.state import BuildState

KINDS = ("operator", "joint", "open", "cast", "packing", "overlap", "tiles", "fuse")
# consumer alternatives tried per boundary by `joint` (best estimates first)
JOINT_ALTERNATIVES = 2
# `tiles` proposals per round, and shifts lowered per round to find them (best
# merged-step estimates first; a lowering shows which moves appear or vanish)
TILE_PROPOSALS = 3
TILE_LOWERINGS = 6


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


@dataclass(frozen=True)
class OpSite:
    """A non-Repeat op with its qualified name, graph (body or top) and trips."""

    name: str
    graph: Graph
    op: Op
    trips: int
    scope: str


def op_sites(g: Graph, scope: str = "", trips: int = 1) -> list[OpSite]:
    """Every non-Repeat op in program order (Repeat bodies inlined once)."""
    out: list[OpSite] = []
    for op in g.ops:
        if isinstance(op, Repeat):
            out += op_sites(op.body, f"{scope}{op.name}/", op.trips)
        else:
            out.append(OpSite(f"{scope}{op.name}", g, op, trips, scope))
    return out


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


class Around:
    """What proposals are made from: the graph and device, the incumbent plan
    with its parameter-home rotation pinned (`plan`), its lowering, its
    measured cycles (`prof`, a Profile: per lowered step and per op),
    the catalogue shortlist length and the planning context.  A proposal
    kind (planner.search.registry.ProposalKind) is a function of it; the
    built-in kinds are its methods."""

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

    # ------------------------------------------------------------ kinds

    def operator(self) -> list[Proposal]:
        """Another shortlisted recipe for one op, by estimated cycles saved."""
        out = []
        for site in self.sites:
            if isinstance(site.op, Cast) or site.name in self.fused_ops:
                continue
            short, cur = self.current(site)
            for alt in short:
                if alt.key == cur.key:
                    continue
                out.append(Proposal(
                    "operator", f"{site.name}: {cur.key} -> {alt.key}",
                    self.op_gain(site, cur, alt), self.plan.with_recipe(site.name, alt.key)))
        return out

    def boundaries(self) -> list[tuple[OpSite, OpSite, str]]:
        """(producer, single consumer, qualified tensor) of every closed
        canonical boundary that may open (not a graph output, Repeat
        init/final/yield, nor a Cast/heads/Repeat edge)."""
        out = []
        for site in self.sites:
            g = site.graph
            if isinstance(site.op, (Cast, *MOVE_OPS)):
                continue
            t = site.op.outputs[0]
            q = f"{site.scope}{t}"
            if self.plan.is_open(q) or t in g.outputs or _feeds_repeat(g, t):
                continue
            users = g.consumers(t)
            if len(users) != 1 or isinstance(users[0], (Repeat, Cast, *MOVE_OPS)):
                continue
            consumer = next(s for s in self.sites
                            if s.graph is g and s.op is users[0])
            out.append((site, consumer, q))
        return out

    def open(self) -> list[Proposal]:
        """Remove one canonical boundary: the producer's output moves straight to its consumer."""
        out = []
        for _prod, cons, q in self.boundaries():
            gain = min(self.measured_moves("canonical", q), self.measured_moves("input", q))
            out.append(Proposal("open", f"open boundary {q} (into {cons.name})", gain,
                                self.plan.with_open(q)))
        return out

    def joint(self) -> list[Proposal]:
        """Remove a boundary and re-pick the consumer's recipe to match the producer's layout."""
        out = []
        for _prod, cons, q in self.boundaries():
            short, cur = self.current(cons)
            alts = [r for r in short if r.key != cur.key][:JOINT_ALTERNATIVES]
            for alt in alts:
                gain = self.op_gain(cons, cur, alt) + self.measured_moves("canonical", q)
                out.append(Proposal(
                    "joint", f"store {q} in {cons.name} layout {alt.key} (was {cur.key})",
                    gain, self.plan.with_open(q).with_recipe(cons.name, alt.key)))
        return out

    def cast(self) -> list[Proposal]:
        """Cast on the canonical owners, then move the narrow result (cast order before)."""
        out = []
        for site in self.sites:
            if not isinstance(site.op, Cast) or self.plan.cast_before(site.name):
                continue
            measured = self.measured(f"cast {site.name}")
            if measured == 0:
                continue  # not absorbed (already a compute op on canonical owners)
            x = site.graph.tensor(site.op.x)
            y = site.graph.tensor(site.op.out)
            rows, cols = view2d(x.shape)
            rpo = canonical_rows_per_owner(rows, cols, DTYPE_BYTES[x.dtype],
                                           self.device.element_bytes, self.device.tiles,
                                           self.plan.packing)
            # on its input's canonical owners (no move in); the estimate
            # includes the move of the narrow result to its own canonical
            # layout where that differs (element packing: twice the rows)
            key = f"rows:{rpo}"
            early = site.trips * cat.recipe_from_key(site.graph, site.op, self.device, key,
                                                     self.plan.packing, self.cache).cycles
            moved = self.measured_moves("input", f"{site.scope}{site.op.x}")
            sync = self.device.exchange_fixed_cycles
            payload = max(0, moved - sync * site.trips)
            narrow = 1 - DTYPE_BYTES[y.dtype] / DTYPE_BYTES[x.dtype]
            gain = measured - early + int(payload * narrow)
            out.append(Proposal("cast", f"cast {site.name} before redistribution", gain,
                                self.plan.with_cast_order(site.name, "before")
                                .with_recipe(site.name, key)))
        return out

    def canonical_moves(self) -> list[tuple[int, int, int, int]]:
        """(payload cycles, rows, cols, element bytes) of every measured move
        to or from a canonical layout; payload = cycles − one sync per trip."""
        tensors: dict[str, tuple[int, int, int, int]] = {}
        for site in self.sites:
            for name in site.op.inputs + site.op.outputs:
                t = site.graph.tensor(name)
                rows, cols = view2d(t.shape)
                tensors[f"{site.scope}{name}"] = (rows, cols, DTYPE_BYTES[t.dtype], site.trips)
        out = []
        for (role, q), labels in self.moves.items():
            if role == "parameter" or q not in tensors:
                continue
            rows, cols, elem, trips = tensors[q]
            out += [(max(0, self.prof.moves[lab] - self.device.exchange_fixed_cycles * trips),
                     rows, cols, elem) for lab in labels if lab in self.prof.moves]
        return out

    def packing(self) -> list[Proposal]:
        """Another canonical packing (element, half, double, rows) for every boundary."""
        moves = self.canonical_moves()
        d = self.device
        out = []
        for p in PACKINGS:
            if p == self.plan.packing:
                continue
            gain = 0.0
            for payload, rows, cols, elem in moves:
                cur = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles,
                                               self.plan.packing)
                new = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles, p)
                gain += payload * (1 - new / cur)
            out.append(Proposal("packing", f"canonical packing {self.plan.packing} -> {p}",
                                int(round(gain)), self.follow_packing(p)))
        return out

    def follow_packing(self, packing: str) -> Plan:
        """The incumbent under `packing`, with every row op that runs on its
        input's canonical owners (recipe `rows:<canonical rows per owner>`)
        moved to the new canonical owners, so it stays free of moves."""
        plan = self.plan.with_packing(packing)
        d = self.device
        for site in self.sites:
            key = self.plan.recipe(site.name)
            if key is None or not key.startswith("rows:") or "x" in key:
                continue
            x = site.graph.tensor(site.op.inputs[0])
            rows, cols = view2d(x.shape)
            elem = DTYPE_BYTES[x.dtype]
            cur = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles,
                                           self.plan.packing)
            if key == f"rows:{cur}":
                new = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles,
                                               packing)
                plan = plan.with_recipe(site.name, f"rows:{new}")
        return plan

    def fuse(self) -> list[Proposal]:
        """Run one group of sibling matmuls as one recipe over concatenated weights."""
        out = []
        for g, scope, trips in self.graphs():
            for grp in fusion.sibling_groups(g):
                key = fusion.group_key(scope, grp)
                if self.plan.is_fused(key):
                    continue
                sites = [s for s in self.sites if s.graph is g and s.op in grp]
                r = fusion.fused_recipe(g, grp, self.device, self.cache,
                                        packing=self.plan.packing, narrow=self.narrow(sites[0]))
                if r is None:
                    continue
                est = sum(self.current(s)[1].cycles for s in sites)
                meas = sum(self.costs.get(s.name, 0) for s in sites)
                calib = min(4.0, max(0.25, meas / (trips * est))) if est and meas else 1.0
                gain = int(round(trips * (est - r.cycles) * calib))
                out.append(Proposal("fuse", f"fuse {key}: {r.key}", gain,
                                    self.plan.with_fused(key).with_recipe(key, r.key)))
        return out

    def graphs(self) -> list[tuple[Graph, str, int]]:
        """(graph, scope, trips) of the top graph and every Repeat body (as op_sites walks them)."""
        seen: dict[str, tuple[Graph, str, int]] = {"": (self.g, "", 1)}
        for s in self.sites:
            seen.setdefault(s.scope, (s.graph, s.scope, s.trips))
        return list(seen.values())

    def overlap(self) -> list[Proposal]:
        """Let the scheduler overlap K-split reductions with neighbouring phases (or stop)."""
        reduce = self.prof.reduction
        if self.plan.reduction_overlap:
            return [Proposal("overlap", "stop overlapping reductions", -reduce // 2,
                             self.plan.with_reduction_overlap(False))]
        if reduce == 0:
            return []  # no K-split reduction in the incumbent: nothing to overlap
        return [Proposal("overlap", "overlap independent reductions", reduce // 2,
                         self.plan.with_reduction_overlap(True))]

    def tiles(self) -> list[Proposal]:
        """Shift one op's tiles away from the busiest tiles of its phases."""
        steps = self.merged_steps()
        ops = sorted({op for _, _, phases in steps for _, owners in phases for op in owners})
        n = self.device.tiles
        place = Placement(self.lowered)
        ranked = []
        for op in ops:
            if op in self.fused_ops:
                continue  # placed by its fused group
            # a logical shift s moves physical tiles by s·stride
            best = max(((shift_gain(steps, op, s * self.plan.tile_stride % n, self.device), s)
                        for s in place.shift_choices(op, n)), default=(0, 0))
            if best[0] > 0:
                ranked.append((-best[0], op, best[1]))
        out: list[Proposal] = []
        for neg_gain, op, s in sorted(ranked)[:TILE_LOWERINGS]:
            if len(out) == TILE_PROPOSALS:
                break
            cur = self.plan.shift(op)
            plan = self.plan.with_tile_shift(op, (cur + s) % n)
            removed = self.moves_removed(lower(self.g, self.device, plan, self.ctx))
            if removed is None:
                continue  # a move appears: outside the estimate (module docstring)
            gain = -neg_gain + removed
            if gain > 0:
                out.append(Proposal("tiles", f"shift {op} by {s} tiles (now {(cur + s) % n})",
                                    gain, plan))
        return out

    def moves_removed(self, shifted_lowering: Lowered) -> int | None:
        """The measured cycles of the moves a placement change removes (the
        op lands where its input already is), or None when it adds a move."""
        old = _moves(self.lowered)
        new = _moves(shifted_lowering)
        if any(len(new[key]) > len(old.get(key, ())) for key in new):
            return None
        return sum(self.measured(st.label) for key in sorted(old)
                   for st in old[key][len(new.get(key, ())):])

    def merged_steps(self) -> list[MergedStep]:
        """(measured cycles, exchange?, [(phase load, {op: owned parts})]) of
        every measured merged step whose phases all map to one lowered step."""
        by_label: dict[str, list[Step]] = {}
        for st in self.lowered.steps:
            key = f"cast {st.label}" if st.kind == "cast" else st.label
            by_label.setdefault(key, []).append(st)
        place = Placement(self.lowered)
        out = []
        for m in self.prof.merged:
            exchange = m.kind == EXCHANGE
            phases = []
            for _label, src, part in m.phases:
                found = by_label.get(src, [])
                if len(found) != 1:
                    break  # unknown or ambiguous step: the merged step is not modelled
                st = found[0]
                phases.append((phase_load(self.lowered, st, part, exchange, self.device),
                               place.owners(st, part, exchange)))
            else:
                out.append((m.cycles, exchange, phases))
        return out


def pinned(g: Graph, device: Device, plan: Plan, ctx: BuildState | None = None) -> Plan:
    """`plan` with every parameter-home rotation base pinned where its
    lowering puts it: the common base of all proposals around `plan`."""
    return plan.with_rotation(lower(g, device, plan, ctx).rotation)


def _merged(base: tuple, changed: tuple, onto: tuple) -> tuple:
    """Sorted (key, value) items of `onto` updated with the items in which
    `changed` differs from `base`, without the keys `changed` dropped."""
    b = dict(base)
    c = dict(changed)
    out = dict(onto)
    out.update({k: v for k, v in changed if b.get(k) != v})
    for k in b.keys() - c.keys():  # a key `changed` removed
        out.pop(k, None)
    return tuple(sorted(out.items()))


# Plan fields that map keys to decisions (the rest are scalars or open_boundaries)
PER_KEY_FIELDS = ("recipes", "cast_order", "rotation", "tile_shift")


def apply_change(base: Plan, changed: Plan, onto: Plan) -> Plan:
    """`onto` with the decisions in which `changed` differs from `base` (a
    proposal's change replayed on another plan, e.g. on a proposal that may
    be accepted first).  Scalar decisions take `changed`'s value when it
    differs from `base`; per-key decisions and open boundaries merge."""
    opened = (set(onto.open_boundaries) | (set(changed.open_boundaries)
                                           - set(base.open_boundaries)))
    opened -= set(base.open_boundaries) - set(changed.open_boundaries)

    def pick(name: str) -> Any:
        new = getattr(changed, name)
        return new if new != getattr(base, name) else getattr(onto, name)

    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Plan):
        if f.name == "open_boundaries":
            fields[f.name] = tuple(sorted(opened))
        elif f.name in PER_KEY_FIELDS:
            fields[f.name] = _merged(getattr(base, f.name), getattr(changed, f.name),
                                     getattr(onto, f.name))
        else:
            fields[f.name] = pick(f.name)
    return Plan(**fields)


def _moves(lw: Lowered) -> dict[tuple[str, str, str], list[Step]]:
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


def _feeds_repeat(g: Graph, tensor: str) -> bool:
    return any(isinstance(op, Repeat) and tensor in op.init + op.final for op in g.ops)


for _kind in KINDS:  # the built-in kinds, in this order
    PROPOSALS.register(_kind)(getattr(Around, _kind))


def proposals(graph: Graph, device: Device, plan: Plan, profile: Profile,
              limit: int = cat.DEFAULT_LIMIT, kinds: tuple[str, ...] | None = None,
              ctx: BuildState | None = None) -> list[Proposal]:
    """All proposals of `kinds` (None: the built-in KINDS; a registered kind
    takes part only when named) around `plan`
    (module docstring), best estimated gain first.  `profile` is
    `step_profile` of the incumbent; `limit` the catalogue shortlist length;
    `ctx` the planning context.  Raises ConfigError for an unknown kind."""
    chosen = list(KINDS if kinds is None else kinds)
    makers = [PROPOSALS.get(k) for k in chosen]  # unknown kinds fail before any work
    around = Around(graph, device, plan, profile, limit, ctx)
    out: list[Proposal] = []
    for make in makers:
        out += make(around)
    unique = {p.plan: p for p in sorted(out, reverse=True)}  # best duplicate wins
    return sorted(unique.values())
