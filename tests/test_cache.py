"""planner.cache: content-keyed expansion/schedule/trial caches and the
catalogue's implementation cache; counters reach the run summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simulator
from planner import catalogue as cat
from planner.baseline import baseline_plan
from planner.build import build
from planner.cache import CACHES, BuildCache, Counters
from planner.cli import main
from planner.graph import Graph

TINY = simulator.load_device("tiny")


def test_cached_builds_equal_uncached(micro_graph: Graph) -> None:
    c = BuildCache()
    p = baseline_plan(micro_graph, TINY)
    q = p.with_reduction_overlap(True)
    for plan in (p, q, p):
        built = c.build(micro_graph, TINY, plan, cat.DEFAULT_LIMIT)
        ref = build(micro_graph, TINY, plan, cat.DEFAULT_LIMIT)
        assert built.package.content_hash() == ref.package.content_hash()
    # p: miss; q differs only in the schedule flag: expansion hit; p again: both hit
    assert (c.expansion.hits, c.expansion.misses) == (2, 1)
    assert (c.schedule.hits, c.schedule.misses) == (1, 2)


def test_unchanged_recipes_skip_catalogue_generation(micro_graph: Graph) -> None:
    c = BuildCache()
    p = baseline_plan(micro_graph, TINY)
    c.evaluate(micro_graph, TINY, p, cat.DEFAULT_LIMIT)
    before = c.counters()
    changed = p.with_recipe("encoder/gelu", "rows:4")
    trial = c.evaluate(micro_graph, TINY, changed, cat.DEFAULT_LIMIT)
    assert trial.incumbent is not None
    delta = c.counters().minus(before).as_dict()
    assert delta["implementation"]["misses"] == 0  # every op's shortlist came from the cache
    assert delta["implementation"]["hits"] > 0
    assert delta["expansion"] == {"hits": 0, "misses": 1}
    again = c.evaluate(micro_graph, TINY, changed, cat.DEFAULT_LIMIT)
    assert again is trial and c.trial.hits == 1


def test_failed_trial_is_cached_with_its_reason(micro_graph: Graph) -> None:
    c = BuildCache()
    bad = baseline_plan(micro_graph, TINY).with_recipe("encoder/mm_q", "mm:bogus")
    t1 = c.evaluate(micro_graph, TINY, bad, cat.DEFAULT_LIMIT)
    t2 = c.evaluate(micro_graph, TINY, bad, cat.DEFAULT_LIMIT)
    assert t1.incumbent is None and "unknown recipe" in t1.failure and t2 is t1


def test_lru_bound(micro_graph: Graph) -> None:
    c = BuildCache(max_entries=1)
    p = baseline_plan(micro_graph, TINY)
    c.build(micro_graph, TINY, p, cat.DEFAULT_LIMIT)
    c.build(micro_graph, TINY, p.with_packing("half"), cat.DEFAULT_LIMIT)
    assert len(c.expansion.data) == 1
    c.build(micro_graph, TINY, p, cat.DEFAULT_LIMIT)
    assert c.expansion.misses == 3


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
