"""planner.search.context / trials: the planning context's content-keyed
expansion, schedule and trial caches and the catalogue's implementation
cache; counters reach the run summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulator
from planner.cli import main
from planner.ir.graph import Graph
from planner.lowering.stages import build
from planner.search import trials
from planner.search.context import CACHES, Counters, PlanningContext
from planner.search.policies import baseline_plan

TINY = simulator.load_device("tiny")


def test_cached_builds_equal_uncached(micro_graph: Graph) -> None:
    c = PlanningContext()
    p = baseline_plan(micro_graph, TINY)
    q = p.with_reduction_overlap(True)
    for plan in (p, q, p):
        built = build(micro_graph, TINY, plan, c)
        ref = build(micro_graph, TINY, plan)
        assert built.package.content_hash() == ref.package.content_hash()
    # p: miss; q differs only in the schedule flag: expansion hit; p again: both hit
    assert (c.expansions.hits, c.expansions.misses) == (2, 1)
    assert (c.schedules.hits, c.schedules.misses) == (1, 2)


def test_unchanged_recipes_skip_catalogue_generation(micro_graph: Graph) -> None:
    c = PlanningContext()
    p = baseline_plan(micro_graph, TINY)
    trials.evaluate(c, micro_graph, TINY, p)
    before = c.counters()
    changed = p.with_recipe("encoder/gelu", "rows:4")
    trial = trials.evaluate(c, micro_graph, TINY, changed)
    assert trial.incumbent is not None
    delta = c.counters().minus(before).as_dict()
    assert delta["implementation"]["misses"] == 0  # every op's shortlist came from the cache
    assert delta["implementation"]["hits"] > 0
    assert delta["expansion"] == {"hits": 0, "misses": 1}
    # the context remembers the outcome, not the build (planner.search.trials)
    again = trials.evaluate(c, micro_graph, TINY, changed)
    assert c.trials.hits == 1 and again.incumbent is None
    assert (again.cycles, again.profile) == (trial.cycles, trial.profile)
    complete = trials.evaluate(c, micro_graph, TINY, changed, complete=True)
    assert complete.incumbent is not None and complete.cycles == trial.cycles
    assert complete.incumbent.built.package.content_hash() == \
        trial.incumbent.built.package.content_hash()


def test_failed_trial_is_cached_with_its_reason(micro_graph: Graph) -> None:
    c = PlanningContext()
    bad = baseline_plan(micro_graph, TINY).with_recipe("encoder/mm_q", "mm:bogus")
    t1 = trials.evaluate(c, micro_graph, TINY, bad)
    t2 = trials.evaluate(c, micro_graph, TINY, bad)
    assert t1.incumbent is None and "unknown recipe" in t1.failure
    assert t2.failure == t1.failure and c.trials.hits == 1


def test_lru_bound(micro_graph: Graph) -> None:
    c = PlanningContext(max_entries=1)
    p = baseline_plan(micro_graph, TINY)
    build(micro_graph, TINY, p, c)
    build(micro_graph, TINY, p.with_packing("half"), c)
    assert len(c.expansions.data) == 1
    build(micro_graph, TINY, p, c)
    assert c.expansions.misses == 3


def test_lru_weight_bound(micro_graph: Graph) -> None:
    from planner.lowering.state import LRU, program_rows

    lru: LRU[str, int] = LRU(8, 10, weigh=lambda v: v)
    for k, v in (("a", 4), ("b", 4), ("c", 4)):
        lru.put(k, v)
    assert list(lru.data) == ["b", "c"]  # 12 > 10: the least recent goes
    lru.put("d", 11)
    assert not lru.data  # heavier than the bound alone: not kept
    # a context whose row budget holds one micro program keeps one expansion
    p = baseline_plan(micro_graph, TINY)
    c = PlanningContext()
    build(micro_graph, TINY, p, c)
    rows = program_rows(next(iter(c.expansions.data.values())))
    c = PlanningContext(max_rows=rows + 1)
    build(micro_graph, TINY, p, c)
    build(micro_graph, TINY, p.with_packing("half"), c)
    assert len(c.expansions.data) == 1 and len(c.prefixes.entries) == 1


def test_counters_arithmetic() -> None:
    a, b = Counters(), Counters()
    a.counts["trial"] = [3, 4]
    b.counts["trial"] = [1, 1]
    assert a.minus(b).as_dict()["trial"] == {"hits": 2, "misses": 3}
    b.add(a)
    assert b.counts["trial"] == [4, 5] and set(a.as_dict()) == set(CACHES)


def test_run_summary_has_counters_and_proposal_lines(
        micro_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(micro_toml), "--device", "tiny", "--optimization-steps", "3", "--no-numerics"]
    assert main(["run", *args, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["proposals_evaluated"] == len(s["proposals"]) == 3
    assert s["cache"]["implementation"]["hits"] > 0
    assert s["cycles"] <= s["baseline_cycles"]
    assert s["improvement"] == pytest.approx(1 - s["cycles"] / s["baseline_cycles"])
    assert main(["run", *args]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum(1 for line in out if line.startswith("[")) == 3
    assert any(line.startswith("optimizer ") and "-> final" in line for line in out)
    assert any(line.startswith("caches ") and "implementation" in line for line in out)
