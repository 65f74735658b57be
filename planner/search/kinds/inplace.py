"""The `inplace` proposal kind: an elementwise op (or a Cast that runs
before the move) runs where its leading operand arrives (recipe `rows:0`,
planner.decide.families.rows), its boundary with the producer opened if it is
not, so the value does not move between them at all.  Gain = the operator
gain of `rows:0` over the current recipe (catalogue estimates: the input
phase saved, the compute of the new blocks, the result's move to canonical
that an op running on canonical cells did not have; `Around.op_gain`) plus,
while the boundary is closed, the measured move of the value to canonical.
"""

from __future__ import annotations

from planner.decide import catalogue as cat
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
        if op.CONVERSION and not around.plan.cast_before(site.name):
            continue  # an absorbed cast runs where its result is read: no layout of its own
        lead = getattr(op, op.READS[0])
        producer = site.graph.producer(lead)
        if producer is None or producer.CONVERSION or producer.FAMILY == "move" \
                or must_materialise(site.graph, lead) or len(site.graph.consumers(lead)) != 1:
            continue
        q = f"{site.scope}{lead}"
        _short, cur = around.current(site)
        alt = cat.recipe_from_key(site.graph, op, around.device, IN_PLACE,
                                  around.plan.packing, around.cache)
        gain = around.op_gain(site, cur, alt)
        plan = around.plan.with_recipe(site.name, IN_PLACE)
        if not around.plan.is_open(q):
            gain += around.measured_moves("canonical", q)
            plan = plan.with_open(q)
        out.append(Proposal("inplace", f"{site.name} in place ({q} where it arrives)",
                            gain, plan))
    return out
