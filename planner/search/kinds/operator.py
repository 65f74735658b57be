"""The `operator` proposal kind: another shortlisted recipe of one op. Gain = trips
× (current − alternative catalogue estimate) × calibration, where the
calibration is the op's measured cycles (`Profile.ops`: its own steps plus the
conversions lowered for it and the move of its result to canonical) over its own
estimate, clipped to [¼, 4].
"""

from __future__ import annotations

from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


@PROPOSALS.register("operator")
def operator(around: Around) -> list[Proposal]:
    """Another shortlisted recipe for one op, by estimated cycles saved."""
    out = []
    for site in around.sites:
        if site.op.CONVERSION or site.name in around.fused_ops:
            continue
        short, cur = around.current(site)
        for alt in short:
            if alt.key == cur.key:
                continue
            out.append(Proposal(
                "operator", f"{site.name}: {cur.key} -> {alt.key}",
                around.op_gain(site, cur, alt), around.plan.with_recipe(site.name, alt.key)))
    return out
