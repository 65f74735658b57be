"""The `fuse` proposal kind: run one group of sibling matmuls (the same input,
weights of one shape: q, k, v; planner.decide.fusion) as one recipe over their
concatenated weights. Gain = trips × (Σ members' current estimates − the fused
recipe's estimate) × calibration, the calibration being the members' measured
cycles over their estimates, clipped to [¼, 4]. A fused member gets no
`operator` or `tiles` proposals (its placement is the group's).
"""

from __future__ import annotations

from planner.decide import fusion
from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


@PROPOSALS.register("fuse")
def fuse(around: Around) -> list[Proposal]:
    """Run one group of sibling matmuls as one recipe over concatenated weights."""
    out = []
    for g, scope, trips in around.graphs():
        for grp in fusion.sibling_groups(g):
            key = fusion.group_key(scope, grp)
            if around.plan.is_fused(key):
                continue
            sites = [s for s in around.sites if s.graph is g and s.op in grp]
            r = fusion.fused_recipe(g, grp, around.device, around.cache,
                                    packing=around.plan.packing, narrow=around.narrow(sites[0]))
            if r is None:
                continue
            est = sum(around.current(s)[1].cycles for s in sites)
            meas = sum(around.costs.get(s.name, 0) for s in sites)
            calib = min(4.0, max(0.25, meas / (trips * est))) if est and meas else 1.0
            gain = int(round(trips * (est - r.cycles) * calib))
            out.append(Proposal("fuse", f"fuse {key}: {r.key}", gain,
                                around.plan.with_fused(key).with_recipe(key, r.key)))
    return out
