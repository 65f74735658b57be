"""planner.pipeline: baseline plan → build → timing cycles; the optimizer seam."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

import planner
import simulator
from planner.ir.graph import Graph
from planner.pipeline import plan
from planner.search.context import PlanningContext
from planner.search.incumbent import Incumbent, PipelineConfig, evaluate
from simulator.device import Device
from tilecommon.errors import BuildFailure, ConfigError

TINY = simulator.load_device("tiny")


def test_config_defaults_and_validation() -> None:
    cfg = PipelineConfig()
    assert (cfg.optimization_steps, cfg.baseline, cfg.optimizer, cfg.jobs) == (
        8, "default", "local", 1)
    for bad in ({"optimization_steps": -1}, {"jobs": 0}, {"operator_candidate_limit": 0},
                {"jobs": True}):
        with pytest.raises(ConfigError):
            PipelineConfig(**bad)


def test_baseline_plan_builds_verifies_and_costs(micro_graph: Graph) -> None:
    res = planner.plan(micro_graph, TINY, planner.PipelineConfig(optimization_steps=0))
    simulator.verify(res.package)
    assert res.cycles == res.baseline_cycles > 0
    assert res.history == ()
    assert res.stats["optimizer"] == "none"
    assert res.stats["steps"] == res.package.n_steps
    assert set(res.stats["stage_seconds"]) == {"lower", "expand", "schedule", "allocate",
                                               "link", "verify"}
    sim = simulator.run(res.package, numerics=False)
    assert sim.cycles == res.cycles and not sim.faults
    assert res.package.meta["model"] == "vit-micro" and res.package.meta["layers"] == 2


def test_no_optimizer_never_pretends(micro_graph: Graph) -> None:
    res = plan(micro_graph, TINY, PipelineConfig(optimization_steps=8, optimizer="none"))
    assert res.history == () and res.cycles == res.baseline_cycles
    assert res.stats["optimizer"] == "none"


@dataclass(frozen=True)
class _Record:
    description: str
    cycles: int
    accepted: bool


def _overlap_optimizer(graph: Graph, device: Device, cfg: PipelineConfig,
                       base: Incumbent, ctx: PlanningContext
                       ) -> tuple[Incumbent, Sequence[Any]]:
    """One real proposal (reduction overlap on), accepted only if cheaper."""
    trial = evaluate(graph, device, base.plan.with_reduction_overlap(True), ctx)
    better = trial.cycles < base.cycles
    return (trial if better else base), [_Record("reduction overlap", trial.cycles, better)]


def test_optimizer_seam(micro_graph: Graph) -> None:
    calls = []

    def hook(*args: Any) -> tuple[Incumbent, Sequence[Any]]:
        calls.append(1)
        return _overlap_optimizer(*args)

    none = plan(micro_graph, TINY, PipelineConfig(optimization_steps=0), optimizer=hook)
    assert calls == [] and none.history == ()
    res = plan(micro_graph, TINY, PipelineConfig(optimization_steps=1), optimizer=hook)
    assert calls == [1] and len(res.history) == 1
    rec = res.history[0]
    assert res.baseline_cycles == none.cycles
    assert res.cycles == (rec.cycles if rec.accepted else res.baseline_cycles)
    assert res.cycles <= res.baseline_cycles
    assert res.plan.reduction_overlap == rec.accepted


def test_baseline_that_does_not_fit_raises(micro_toml) -> None:
    g = planner.load_model(micro_toml, batch=8)  # fits under the default policy
    with pytest.raises(BuildFailure) as ei:
        plan(g, TINY, PipelineConfig(optimization_steps=0, baseline="element"))
    e = ei.value
    assert e.stage == "allocate" and e.tile >= 0 and e.need > e.have > 0
    assert e.profile["peak_live_tensor"] == e.need


def test_reduction_overlap_schedule_keeps_outputs(micro_graph: Graph) -> None:
    """The wider merge window reorders phases; values must not change."""
    import numpy as np

    from planner.search.policies import baseline_plan

    base_plan = baseline_plan(micro_graph, TINY)
    params = planner.init_params(micro_graph, seed=0)
    inputs = planner.init_inputs(micro_graph, seed=1)
    outs = []
    for flag in (False, True):
        inc = evaluate(micro_graph, TINY, base_plan.with_reduction_overlap(flag))
        sim = simulator.run(inc.built.package, params=params, inputs=inputs)
        assert not sim.faults
        outs.append((inc.built.stats["steps"], sim.outputs))
    assert outs[1][0] < outs[0][0]  # fewer supersteps
    for name, y in outs[0][1].items():
        assert np.array_equal(y, outs[1][1][name])
