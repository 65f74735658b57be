"""The `joint` proposal kind: a producer/store + consumer change: the consumer of
an activation takes another recipe and the producer stores its result straight
into the consumer's layout (the boundary opens). Gain = operator gain + open
gain.
"""

from __future__ import annotations

from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS

# consumer alternatives tried per boundary (best estimates first)
JOINT_ALTERNATIVES = 2

@PROPOSALS.register("joint")
def joint(around: Around) -> list[Proposal]:
    """Remove a boundary and re-pick the consumer's recipe to match the producer's layout."""
    out = []
    for _prod, cons, q in around.boundaries():
        short, cur = around.current(cons)
        alts = [r for r in short if r.key != cur.key][:JOINT_ALTERNATIVES]
        for alt in alts:
            gain = around.op_gain(cons, cur, alt) + around.measured_moves("canonical", q)
            out.append(Proposal(
                "joint", f"store {q} in {cons.name} layout {alt.key} (was {cur.key})",
                gain, around.plan.with_open(q).with_recipe(cons.name, alt.key)))
    return out
