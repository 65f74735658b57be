"""The `overlap` proposal kind: let independent K-split reductions overlap
(schedule flag). Gain = half the measured reduction cycles.
"""

from __future__ import annotations

from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


@PROPOSALS.register("overlap")
def overlap(around: Around) -> list[Proposal]:
    """Let the scheduler overlap K-split reductions with neighbouring phases (or stop)."""
    reduce = around.prof.reduction
    if around.plan.reduction_overlap:
        return [Proposal("overlap", "stop overlapping reductions", -reduce // 2,
                         around.plan.with_reduction_overlap(False))]
    if reduce == 0:
        return []  # no K-split reduction in the incumbent: nothing to overlap
    return [Proposal("overlap", "overlap independent reductions", reduce // 2,
                     around.plan.with_reduction_overlap(True))]
