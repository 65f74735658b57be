"""The `tiles` proposal kind: shift one op's placement (`Plan.tile_shift`) off the
tiles of the phases it shares a merged step with. For every measured merged step
(`Profile.merged`) the phases' per-tile loads are modelled from the lowered
layouts (planner.search.tileload); an op owns its compute phases, the destination side
of the moves into it (inputs, parameters, absorbed casts) and the source side of
the moves out of its result (and, for a matmul, both sides of its parameter
moves: its homes follow it). Gain = Σ over the merged steps it takes part in of
measured step cycles × (modelled − shifted modelled) / modelled, for the best of
a few shifts (half the spacing of its tiles, its tile count, half the device),
plus the measured cycles of moves the shift removes (the op lands where its
input already is). A shift that adds a move is not proposed: the new exchange
phase sits between the phases that merged, so they no longer share a step
(measured on the tiny device: two 1-tile GELUs merged on tile 0, one moved away,
cost 14% more). The best merged- step estimates are lowered first (at most
TILE_LOWERINGS per round); at most TILE_PROPOSALS with a positive gain are
proposed. A global logical→physical mapping (`Plan.tile_offset`/`tile_stride`)
is not proposed: tiles are homogeneous and the exchange uniform all-to-all, so a
permutation of all tiles never changes cycles (tests/test_proposals.py shows
it).
"""

from __future__ import annotations

from planner.lowering.lower import Lowered, lower
from planner.lowering.lowered import Step
from planner.lowering.schedule import EXCHANGE
from planner.search.around import Around, Proposal, lowered_moves
from planner.search.registry import PROPOSALS
from planner.search.tileload import MergedStep, Placement, phase_load, shift_gain

# proposals per round, and shifts lowered per round to find them (best merged-step
# estimates first; a lowering shows which moves appear or vanish)
TILE_PROPOSALS = 3
TILE_LOWERINGS = 6

@PROPOSALS.register("tiles")
def tiles(around: Around) -> list[Proposal]:
    """Shift one op's tiles away from the busiest tiles of its phases."""
    steps = merged_steps(around)
    ops = sorted({op for _, _, phases in steps for _, owners in phases for op in owners})
    n = around.device.tiles
    place = Placement(around.lowered)
    ranked = []
    for op in ops:
        if op in around.fused_ops:
            continue  # placed by its fused group
        # a logical shift s moves physical tiles by s·stride
        best = max(((shift_gain(steps, op, s * around.plan.tile_stride % n, around.device), s)
                    for s in place.shift_choices(op, n)), default=(0, 0))
        if best[0] > 0:
            ranked.append((-best[0], op, best[1]))
    out: list[Proposal] = []
    for neg_gain, op, s in sorted(ranked)[:TILE_LOWERINGS]:
        if len(out) == TILE_PROPOSALS:
            break
        cur = around.plan.shift(op)
        plan = around.plan.with_tile_shift(op, (cur + s) % n)
        removed = moves_removed(around, lower(around.g, around.device, plan, around.ctx))
        if removed is None:
            continue  # a move appears: outside the estimate (module docstring)
        gain = -neg_gain + removed
        if gain > 0:
            out.append(Proposal("tiles", f"shift {op} by {s} tiles (now {(cur + s) % n})",
                                gain, plan))
    return out


def moves_removed(around: Around, shifted_lowering: Lowered) -> int | None:
    """The measured cycles of the moves a placement change removes (the
    op lands where its input already is), or None when it adds a move."""
    old = lowered_moves(around.lowered)
    new = lowered_moves(shifted_lowering)
    if any(len(new[key]) > len(old.get(key, ())) for key in new):
        return None
    return sum(around.measured(st.label) for key in sorted(old)
               for st in old[key][len(new.get(key, ())):])


def merged_steps(around: Around) -> list[MergedStep]:
    """(measured cycles, exchange?, [(phase load, {op: owned parts})]) of
    every measured merged step whose phases all map to one lowered step."""
    by_label: dict[str, list[Step]] = {}
    for st in around.lowered.steps:
        key = f"cast {st.label}" if st.kind == "cast" else st.label
        by_label.setdefault(key, []).append(st)
    place = Placement(around.lowered)
    out = []
    for m in around.prof.merged:
        exchange = m.kind == EXCHANGE
        phases = []
        for _label, src, part in m.phases:
            found = by_label.get(src, [])
            if len(found) != 1:
                break  # unknown or ambiguous step: the merged step is not modelled
            st = found[0]
            phases.append((phase_load(around.lowered, st, part, exchange, around.device),
                           place.owners(st, part, exchange)))
        else:
            out.append((m.cycles, exchange, phases))
    return out
