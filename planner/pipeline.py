"""The planning pipeline: baseline plan → complete build → timing simulation
→ (optionally) the bounded local optimizer.

`plan(graph, device, cfg, optimizer=None) -> PlanResult`:

1. the baseline policy (`planner.baseline.baseline_plan`; `cfg.capacity_baseline`
   selects the capacity policy) picks a Plan;
2. `planner.build.build` turns it into a verified package — a failed baseline
   raises its `BuildFailure` (no fallback search, DESIGN §6);
3. `simulator.run(numerics=False)` gives its cycles;
4. if `cfg.optimization_steps > 0` and an `optimizer` is given, it is called
   with the baseline `Incumbent` and returns the final incumbent and one
   history record per evaluated proposal.

The optimizer seam.  `Optimizer` is any callable
`(graph, device, cfg, baseline: Incumbent) -> (Incumbent, history)`;
`planner.optimize` (issue 6) provides one.  Without an optimizer `plan()`
returns the baseline with an empty history and
`stats["optimizer"] == "none"`: it never pretends to have evaluated
proposals.  `evaluate(graph, device, plan)` is the building block an
optimizer uses to turn a proposal into an `Incumbent` (build + simulate).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernels.exceptions import ConfigError
from planner.baseline import baseline_plan
from planner.build import Built, build
from planner.catalogue import DEFAULT_LIMIT
from planner.graph import Graph
from planner.plan import Plan
from simulator.device import Device
from simulator.package import Package
from simulator.run import run


@dataclass(frozen=True)
class PipelineConfig:
    """What a planning run may do (mirrors `tileplan run` flags).

    `optimization_steps`: proposals the optimizer may evaluate (0 = baseline
    only); `operator_candidate_limit`: catalogue shortlist length per op;
    `capacity_baseline`: use the capacity baseline policy instead of the
    default; `jobs`: worker processes/threads for speculative builds.
    """

    optimization_steps: int = 8
    operator_candidate_limit: int = DEFAULT_LIMIT
    capacity_baseline: bool = False
    jobs: int = 1

    def __post_init__(self) -> None:
        for name in ("optimization_steps", "operator_candidate_limit", "jobs"):
            v = getattr(self, name)
            low = 0 if name == "optimization_steps" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError("PipelineConfig", name, f"must be an integer >= {low}", v)


@dataclass(frozen=True)
class Incumbent:
    """A plan with its complete build and its simulated (timing-only) cycles."""

    plan: Plan
    built: Built
    cycles: int
    simulate_seconds: float
    faults: int = 0


Optimizer = Callable[[Graph, Device, PipelineConfig, Incumbent],
                     tuple[Incumbent, Sequence[Any]]]


@dataclass(frozen=True)
class PlanResult:
    """The outcome of `plan()`: the final package and its cycles, the history
    of evaluated proposals (empty without an optimizer), the baseline's
    cycles, the final plan and run statistics (counts and seconds)."""

    package: Package
    cycles: int
    history: tuple[Any, ...]
    baseline_cycles: int
    plan: Plan
    stats: dict[str, Any] = field(default_factory=dict)
    built: Built | None = None


def evaluate(graph: Graph, device: Device, plan: Plan,
             limit: int = DEFAULT_LIMIT) -> Incumbent:
    """Build `plan` (catalogue shortlist `limit`) and simulate it without
    numerics.  Raises BuildFailure."""
    built = build(graph, device, plan, limit)
    t0 = time.perf_counter()
    sim = run(built.package, numerics=False)
    return Incumbent(plan, built, int(sim.cycles), time.perf_counter() - t0, int(sim.n_faults))


def plan(
    graph: Graph,
    device: Device,
    cfg: PipelineConfig | None = None,
    optimizer: Optimizer | None = None,
) -> PlanResult:
    """Plan `graph` on `device` (module docstring).  Raises BuildFailure if the
    baseline does not build, ConfigError/Unsupported on bad input."""
    cfg = cfg or PipelineConfig()
    t0 = time.perf_counter()
    policy = "capacity" if cfg.capacity_baseline else "default"
    base_plan = baseline_plan(graph, device, cfg.operator_candidate_limit, policy=policy)
    t1 = time.perf_counter()
    base = evaluate(graph, device, base_plan, cfg.operator_candidate_limit)
    final, history = base, ()
    name = "none"
    if cfg.optimization_steps > 0 and optimizer is not None:
        final, hist = optimizer(graph, device, cfg, base)
        history = tuple(hist)
        name = getattr(optimizer, "__name__", type(optimizer).__name__)
    total = time.perf_counter() - t0
    opt_stats = dict(getattr(optimizer, "last_stats", {})) if name != "none" else {}
    stats: dict[str, Any] = {
        "baseline_policy": policy,
        "optimizer": name,
        "baseline_seconds": t1 - t0,
        "plan_seconds": total,
        "stage_seconds": dict(final.built.timings),
        "simulate_timing_seconds": base.simulate_seconds,
        "timing_faults": final.faults,
        **final.built.stats,
        **opt_stats,
    }
    return PlanResult(final.built.package, final.cycles, history, base.cycles, final.plan,
                      stats, final.built)


def optimizer_summary(res: PlanResult) -> dict[str, Any]:
    """Summary keys of the optimizer: improvement over the baseline (fraction
    of baseline cycles saved), speculative builds, cache counters and the
    evaluated proposals (records with `as_dict`)."""
    base = res.baseline_cycles
    return {
        "improvement": (base - res.cycles) / base if base else 0.0,
        "speculative_builds": int(res.stats.get("speculative_builds", 0)),
        "speculative_discarded": int(res.stats.get("speculative_discarded", 0)),
        "cache": res.stats.get("cache", {}),
        "proposals": [h.as_dict() if hasattr(h, "as_dict") else repr(h) for h in res.history],
    }


@dataclass(frozen=True)
class RunOutcome:
    """`run_model`'s result: the planning result, the summary (report.py keys)
    and the process exit status it implies (0 ok, 1 fault or numerics outside
    tolerance)."""

    result: PlanResult
    summary: dict[str, Any]
    status: int


def run_model(graph: Graph, device: Device, cfg: PipelineConfig, numerics: bool = True,
              optimizer: Optimizer | None = None, seed: int = 0) -> RunOutcome:
    """Plan, build, verify and simulate `graph`; with `numerics`, simulate with
    values (parameters from `seed`, inputs from `seed + 1`) and compare with
    `planner.reference`.  Raises BuildFailure when the baseline does not fit."""
    from planner.reference import init_inputs, init_params, reference
    from planner.report import REL_FRO_TOLERANCE, compare, summarize

    res = plan(graph, device, cfg, optimizer)
    plan_seconds = float(res.stats["plan_seconds"])
    faults = int(res.stats.get("timing_faults", 0))
    errors = None
    sim_seconds = float(res.stats["simulate_timing_seconds"])
    if numerics:
        params = init_params(graph, seed=seed)
        inputs = init_inputs(graph, seed=seed + 1)
        t0 = time.perf_counter()
        sim = run(res.package, params=params, inputs=inputs, numerics=True)
        sim_seconds = time.perf_counter() - t0
        faults = int(sim.n_faults)
        if not faults:
            errors = compare(sim.outputs, reference(graph, params, inputs))
    summary = summarize(graph, device, res.package, res.cycles, res.baseline_cycles,
                        res.history, res.stats, plan_seconds, sim_seconds, errors, faults)
    summary.update(optimizer_summary(res))
    bad = faults > 0 or (errors is not None and errors[0] > REL_FRO_TOLERANCE)
    return RunOutcome(res, summary, 1 if bad else 0)
