"""The `inplace` proposal kind: an elementwise op (or a Cast that runs
before the move) runs where its leading operand arrives (recipe `rows:0`,
planner.decide.families.rows), its boundary with the producer opened if it is
not, so the value does not move between them at all.  Gain = the measured
moves of that value into the op's layout and, while the boundary is closed,
to canonical; the compute of the new blocks is taken as equal.
"""

from __future__ import annotations

from planner.lowering.lower import must_materialise
from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS

IN_PLACE = "rows:0"


@PROPOSALS.register("inplace")
def inplace(around: Around) -> list[Proposal]:
    """Run an elementwise op in its producer's layout (module docstring)."""
    out = []
    for site in around.sites:
        op = site.op
        if not getattr(op, "ELEMENTWISE", False) or op.FAMILY != "rows" \
                or around.plan.recipe(site.name) == IN_PLACE:
            continue
        if op.CONVERSION and dict(around.plan.cast_order).get(site.name) != "before":
            continue  # an absorbed cast runs where its result is read: no layout of its own
        lead = getattr(op, op.READS[0])
        producers = [p for p in site.graph.ops if lead in p.outputs]
        if not producers or producers[0].CONVERSION or producers[0].FAMILY == "move" \
                or must_materialise(site.graph, lead) or len(site.graph.consumers(lead)) != 1:
            continue
        q = f"{site.scope}{lead}"
        gain = around.measured_moves("input", q)
        plan = around.plan.with_recipe(site.name, IN_PLACE)
        if not around.plan.is_open(q):
            gain += around.measured_moves("canonical", q)
            plan = plan.with_open(q)
        out.append(Proposal("inplace", f"{site.name} in place ({q} where it arrives)",
                            gain, plan))
    return out
