"""A baseline policy and a proposal kind of our own, registered from outside planner/.

`overlapped` starts from the default baseline with K-split reductions allowed
to overlap; `row-moves` proposes halving and doubling the row-by-row move
threshold.  pyproject.toml's entry points make both known to the CLI:

    tileplan run vit-tiny --layers 1 --baseline overlapped --proposals row-moves,operator
"""

from planner.search.around import Proposal
from planner.search.policies import default_plan
from planner.search.registry import BASELINES, PROPOSALS


@BASELINES.register("overlapped")
def overlapped(graph, device, limit, ctx):  # noqa: ANN001, ANN201
    """The default baseline with reduction overlap on."""
    return default_plan(graph, device, limit, ctx).with_reduction_overlap(True)


@PROPOSALS.register("row-moves")
def row_moves(around):  # noqa: ANN001, ANN201
    """Halve or double the rows a redistribution moves row by row."""
    now = around.plan.row_moves
    return [Proposal("row-moves", f"row moves {now} -> {n}", 0, around.plan.with_row_moves(n))
            for n in sorted({now // 2, max(1, 2 * now)} - {now})]


if __name__ == "__main__":
    import planner
    import simulator

    planner.configure()
    cfg = planner.PipelineConfig(baseline="overlapped", proposals=("row-moves", "operator"))
    res = planner.plan(planner.load_model("vit-tiny", layers=1), simulator.load_device("c600"),
                       cfg)
    for rec in res.history:
        print(rec.line())
    print(f"baseline {res.baseline_cycles:,} cycles -> final {res.cycles:,} cycles")
