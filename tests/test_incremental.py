"""Incremental expansion (planner.lowering.expand.PrefixStore): a build that resumes
from a recent expansion's common step prefix gives exactly the package (same
content hash) of a from-scratch build of the same plan."""

from __future__ import annotations

import pytest

import simulator
from planner.decide import catalogue as cat
from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.expand import Expander, PrefixStore, expand_lowered, signature
from planner.lowering.lower import lower
from planner.lowering.stages import build_program, graph_meta
from planner.search.around import pinned
from planner.search.incumbent import evaluate
from planner.search.optimize import profile
from planner.search.policies import baseline_plan
from planner.search.proposals import proposals
from tilecommon.errors import BuildFailure

TINY = simulator.load_device("tiny")
LIMIT = cat.DEFAULT_LIMIT


def package_hash(g: Graph, plan: Plan, store: PrefixStore | None) -> str | None:
    """The package hash of `plan` built through `store` (None: from scratch),
    or None when it does not build."""
    lw = lower(g, TINY, plan)
    try:
        prog = store.expand(lw, TINY).program if store else expand_lowered(lw, TINY)
        built = build_program(prog, TINY, g.name, graph_meta(g, plan),
                              reduction_overlap=plan.reduction_overlap)
    except BuildFailure:
        return None
    return built.package.content_hash()


def visited_plans(g: Graph) -> list[Plan]:
    """The baseline and the plans the optimizer would try around it."""
    base = baseline_plan(g, TINY, LIMIT)
    prof = profile(evaluate(g, TINY, base))
    props = proposals(g, TINY, base, prof, LIMIT)
    return [pinned(g, TINY, base), *[p.plan for p in props[:5]]]


def test_incremental_builds_equal_scratch_builds(micro_graph: Graph) -> None:
    plans = visited_plans(micro_graph)
    assert len(plans) >= 4
    store = PrefixStore(max_entries=4)
    built = 0
    for plan in plans:
        inc = package_hash(micro_graph, plan, store)
        assert inc == package_hash(micro_graph, plan, None), plan.describe()
        built += inc is not None
    assert built >= 3
    # proposals change one decision: their builds resume from a base
    assert store.steps_reused > 0


def test_resume_point_is_first_differing_step(micro_graph: Graph) -> None:
    base = baseline_plan(micro_graph, TINY, LIMIT)
    changed = base.with_recipe("encoder/gelu", "rows:4")
    store = PrefixStore()
    a = store.expand(lower(micro_graph, TINY, base), TINY)
    lw = lower(micro_graph, TINY, changed)
    b = store.expand(lw, TINY)
    sa, sb = a.sig.steps, signature(lw).steps
    first = next(i for i, (x, y) in enumerate(zip(sa, sb, strict=False)) if x != y)
    assert b.resumed == first > 0 and a.resumed == 0
    # the shared prefix is the very same objects; the rest equals a fresh expansion
    assert b.program.items[: b.marks[first][1]] == a.program.items[: a.marks[first][1]]
    fresh = Expander(lw, TINY).run()
    assert fresh.marks == b.marks
    assert [x.name for x in fresh.program.bufs] == [x.name for x in b.program.bufs]
    # the same plan again resumes after its last step: nothing re-expanded
    c = store.expand(lower(micro_graph, TINY, changed), TINY)
    assert c.resumed == len(sb)


def test_store_keeps_at_most_max_entries(micro_graph: Graph) -> None:
    store = PrefixStore(max_entries=1)
    base = baseline_plan(micro_graph, TINY, LIMIT)
    for plan in (base, base.with_recipe("encoder/gelu", "rows:4")):
        store.expand(lower(micro_graph, TINY, plan), TINY)
    assert len(store.entries) == 1


def test_other_device_never_resumes(micro_graph: Graph) -> None:
    store = PrefixStore()
    base = baseline_plan(micro_graph, TINY, LIMIT)
    store.expand(lower(micro_graph, TINY, base), TINY)
    other = simulator.load_device("c600")
    try:
        lw = lower(micro_graph, other, baseline_plan(micro_graph, other, LIMIT))
    except BuildFailure:
        pytest.skip("micro graph does not lower on c600")
    assert store.expand(lw, other).resumed == 0
