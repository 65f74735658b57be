"""The `overlap` proposal kind: the `reduction_overlap` schedule flag
(planner.lowering.schedule).  With it the superstep packer looks several
phases ahead for independent work of a step's kind, and a K-split reduction
may share a superstep with independent compute.  Gain, from the incumbent:

- every exchange step that fetches parameters alone (a LayerNorm's gamma and
  beta between two compute steps) folds into a neighbouring exchange step,
  or takes the next op's weights with it: its sync and setup
  (`Device.exchange_fixed_cycles`) per run;
- a K-split matmul whose next compute step is independent of its result
  can run its reduction beside that step: half its share of the measured
  reduction cycles (the reductions' total split evenly among the K-split
  matmuls).

The longer lookahead also pulls weight fetches out of busy steps into the
slack of earlier ones, which the estimate leaves out (siglip-so400m-map 1
layer, `experiments/estimate_accuracy.py`: estimated 5,676, simulated 3,455;
half the reduction cycles, the estimate before, said 14,328 for a simulated
5,791 and ranked the kind above four proposals that gained more: Kendall tau
0.71, now 0.86).  Stopping the overlap is charged
the same gain negated, or half the measured reduction cycles when the
incumbent has no such steps left to show for it.
"""

from __future__ import annotations

from planner.lowering.lowered import Lowered, Step
from planner.lowering.provenance import move_role
from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


def _k_split(st: Step) -> bool:
    r = st.recipe
    return (st.kind == "compute" and r is not None and r.family == "matmul"
            and len(r.grid) == 3 and r.grid[2] > 1)


def _independent_next(lw: Lowered, i: int) -> bool:
    """Whether the first compute step after step i, not of its fused group
    (whose reductions share a step anyway), reads nothing derived from step
    i's results (through the moves between them)."""
    derived = set(lw.steps[i].outputs)
    group = lw.steps[i].fused
    for st in lw.steps[i + 1:]:
        if st.kind in ("loop_begin", "loop_end"):
            return False
        if st.kind == "compute" and not (group and st.fused == group):
            return derived.isdisjoint(st.inputs)
        if not derived.isdisjoint(st.inputs):
            derived.update(st.outputs)
    return False


def overlap_gain(around: Around) -> int:
    """The estimated gain of turning the flag on (module docstring)."""
    lw = around.lowered
    runs = lw.runs()
    by_label = {st.label: st for st in lw.steps}
    fixed = around.device.exchange_fixed_cycles
    # steps of the measured profile; a step of one phase is not in `merged`
    in_merged = {src for m in around.prof.merged for _, src, _ in m.phases}
    lone: list[list[Step]] = [[by_label[src] for _, src, _ in m.phases if src in by_label]
                              for m in around.prof.merged if m.kind == "exchange"]
    lone += [[st] for st in lw.steps if st.kind == "redistribute"
             and st.label not in in_merged and st.label in around.prof.moves]
    gain = 0
    for sts in lone:
        if sts and all(st.kind == "redistribute" and move_role(lw, st) == "parameter"
                       for st in sts):
            gain += fixed * runs.get(sts[0].label, 1)
    splits = [i for i, st in enumerate(lw.steps) if _k_split(st)]
    if splits:
        share = around.prof.reduction / len(splits)
        gain += int(sum(share / 2 for i in splits if _independent_next(lw, i)))
    return gain


@PROPOSALS.register("overlap")
def overlap(around: Around) -> list[Proposal]:
    """Let the scheduler overlap K-split reductions with neighbouring phases (or stop)."""
    reduce = around.prof.reduction
    if around.plan.reduction_overlap:
        return [Proposal("overlap", "stop overlapping reductions",
                         -(overlap_gain(around) or reduce // 2),
                         around.plan.with_reduction_overlap(False))]
    if reduce == 0:
        return []  # no K-split reduction in the incumbent: nothing to overlap
    return [Proposal("overlap", "overlap independent reductions", overlap_gain(around),
                     around.plan.with_reduction_overlap(True))]
