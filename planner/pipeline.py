"""The planning pipeline: baseline plan → complete build → timing simulation
→ the bounded local optimizer; `run_model` adds the numerics check.

`plan(graph, device, cfg, optimizer=None, ctx=None) -> PlanResult`:

1. the baseline policy named by `cfg` (planner.search.registry.BASELINES:
   "default", "capacity" or a registered one) picks a Plan;
2. `planner.lowering.stages.build` turns it into a verified package — a failed
   baseline raises its `BuildFailure` (no fallback search);
3. `simulator.run(numerics=False)` gives its cycles;
4. if `cfg.optimization_steps > 0`, the optimizer (`optimizer`, or the one
   `cfg.optimizer` names in OPTIMIZERS: "local" by default, "none") is
   called with the baseline `Incumbent` and the planning context, and
   returns the final incumbent and one history record per evaluated
   proposal.

`ctx` (planner.search.context.PlanningContext) holds every cache of the run;
a fresh one is made when none is passed.  With no optimizer run, `plan()`
returns the baseline with an empty history and `stats["optimizer"] ==
"none"`: it never pretends to have evaluated proposals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.stages import Built
from planner.search import optimize as _optimizers  # noqa: F401  (registers "local", "none")
from planner.search import proposals as _proposals  # noqa: F401  (registers the built-in kinds)
from planner.search.context import PlanningContext
from planner.search.incumbent import PipelineConfig, evaluate, pins_of
from planner.search.policies import baseline_plan
from planner.search.registry import BASELINES, OPTIMIZERS, PROPOSALS, Optimizer
from simulator.device import Device
from simulator.package import Package
from simulator.run import run


@dataclass(frozen=True)
class PlanResult:
    """The outcome of `plan()`: the final package and its cycles, the history
    of evaluated proposals (empty without an optimizer), the baseline's
    cycles, the final plan and run statistics (counts and seconds).  `built`
    is the final build; after optimizer steps, as the optimizer keeps an
    incumbent (`Built.kept`: the schedule's outline, not its rows)."""

    package: Package
    cycles: int
    history: tuple[Any, ...]
    baseline_cycles: int
    plan: Plan
    stats: dict[str, Any] = field(default_factory=dict)
    built: Built | None = None


def plan(
    graph: Graph,
    device: Device,
    cfg: PipelineConfig | None = None,
    optimizer: Optimizer | None = None,
    ctx: PlanningContext | None = None,
    on_record: Callable[[Any], None] | None = None,
) -> PlanResult:
    """Plan `graph` on `device` (module docstring).  Raises BuildFailure if the
    baseline does not build, ConfigError/Unsupported on bad input.
    `on_record` is handed to an optimizer that takes one (`on_record`
    attribute, as `LocalOptimizer` has): it sees each proposal's record the
    moment it is decided."""
    cfg = cfg or PipelineConfig()
    ctx = ctx if ctx is not None else PlanningContext()
    if optimizer is None and cfg.optimization_steps > 0:
        optimizer = OPTIMIZERS.get(cfg.optimizer)(cfg)  # an unknown name fails first
    if on_record is not None and optimizer is not None and hasattr(optimizer, "on_record"):
        optimizer.on_record = on_record
    t0 = time.perf_counter()
    policy = cfg.baseline
    pins = pins_of(cfg, graph, device, ctx)  # a bad pin fails before any build
    base_plan = baseline_plan(graph, device, cfg.operator_candidate_limit, policy, ctx)
    if pins is not None:
        base_plan = pins.apply(base_plan)
    t1 = time.perf_counter()
    base = evaluate(graph, device, base_plan, ctx)
    base_cycles, base_seconds = base.cycles, base.simulate_seconds
    final, history = base, ()
    name = "none"
    if cfg.optimization_steps > 0 and optimizer is not None:
        # the baseline as an incumbent is kept (Built.kept): its schedule's
        # rows are not alive beside every trial's; and handed over, not held
        # here, so that its package goes once a proposal replaces it (27
        # layers at batch 2: ~0.3 GB less beside the later trials)
        handoff = [replace(base, built=base.built.kept())]
        del base, final
        final, hist = optimizer(graph, device, cfg, handoff.pop(), ctx)
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
        "simulate_timing_seconds": base_seconds,
        "timing_faults": final.faults,
        **final.built.stats,
        **opt_stats,
    }
    return PlanResult(final.built.package, final.cycles, history, base_cycles, final.plan,
                      stats, final.built)


def check_names(cfg: PipelineConfig) -> None:
    """ConfigError unless `cfg`'s baseline, optimizer and proposal kinds are
    all registered (or entry points)."""
    BASELINES.get(cfg.baseline)
    OPTIMIZERS.get(cfg.optimizer)
    for kind in cfg.proposals:
        PROPOSALS.get(kind)


def extension_rows() -> list[list[str]]:
    """(kind, name, defining module, first docstring paragraph) of every
    registered extension, built-ins first."""
    rows = []
    for reg in (BASELINES, OPTIMIZERS, PROPOSALS):
        for name in reg.names():
            obj: Any = reg.get(name)
            para = (getattr(obj, "__doc__", None) or "").strip().split("\n\n")[0]
            doc = " ".join(para.split())
            rows.append([reg.what, name, getattr(obj, "__module__", "?"), doc])
    return rows


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


def breakdown(res: PlanResult, sim: Any = None) -> dict[str, Any]:
    """The summary's `ops` (cycles per graph op, planner.breakdown),
    `cycle_totals` and `tile_busy`, from a simulation of the final package
    (`sim`, or a timing-only run made here)."""
    from planner.breakdown import op_breakdown, step_kind_totals, tile_balance

    if sim is None:
        sim = run(res.package, numerics=False)
    return {"ops": op_breakdown(res.package, sim.cycles_per_step),
            "cycle_totals": step_kind_totals(res.package, sim.cycles_per_step),
            "tile_busy": tile_balance(sim.tile_busy)}


SCALES = ("fixed", "data")


def model_values(graph: Graph, weights: str | None = None, scales: str | None = None,
                 seed: int = 0, inputs: Mapping[str, np.ndarray] | None = None
                 ) -> tuple[Graph, dict[str, np.ndarray] | None]:
    """The graph and raw parameters of a run: parameters from the file
    `weights` (planner.ir.weights; None: the seeded init, which `run_model`
    draws), fp8 scales "fixed" (the graph's) or "data" (planner.ir.scales,
    calibrated on the run's inputs: `inputs`, default those `run_model`
    draws); default "data" with a weights file, "fixed" without.  ConfigError
    names a bad file, tensor or choice."""
    from planner.ir.reference import init_inputs, init_params
    from planner.ir.scales import data_scales
    from planner.ir.weights import load_weights
    from tilecommon.errors import ConfigError

    choice = scales or ("data" if weights else "fixed")
    if choice not in SCALES:
        raise ConfigError("scales", "scales", f"must be one of {list(SCALES)}", choice)
    raw = load_weights(graph, weights) if weights else None
    if choice == "data":
        values = raw if raw is not None else init_params(graph, seed=seed)
        graph = data_scales(graph, values, inputs if inputs is not None
                            else init_inputs(graph, seed=seed + 1))
    return graph, raw


# the stages run_model reports to `on_stage`, in order
RUN_STAGES = ("plan", "simulate with values", "reference", "fp32 reference")


def run_model(graph: Graph, device: Device, cfg: PipelineConfig, numerics: bool = True,
              optimizer: Optimizer | None = None, seed: int = 0,
              ctx: PlanningContext | None = None,
              on_record: Callable[[Any], None] | None = None,
              on_stage: Callable[[str], None] | None = None,
              params: Mapping[str, np.ndarray] | None = None,
              inputs: Mapping[str, np.ndarray] | None = None,
              also: Callable[[Mapping[str, np.ndarray]], dict[str, Any]] | None = None
              ) -> RunOutcome:
    """Plan, build, verify and simulate `graph`; with `numerics`, simulate with
    values (parameters from `seed`, or the raw values `params` rounded to the
    graph's dtypes and scales; inputs from `seed + 1`) and compare with
    `planner.reference` (and the fp32 forward, on the raw values).  Raises
    BuildFailure when the baseline does not fit.
    `on_record` sees each optimizer record as it is decided; `on_stage` the
    name of each stage as it starts (RUN_STAGES, numerics ones only with
    `numerics`).  `inputs`: the graph inputs to simulate with (default: from
    `seed + 1`); `also(outputs)`: a further comparison of the simulated
    outputs (an independent runtime's, planner.ir.onnx_reference.ort_check),
    whose fields join the summary."""
    from planner.ir.reference import (
        cast_fractions,
        fp32_graph,
        init_inputs,
        init_params,
        reference,
    )
    from planner.ir.scales import quantize_params
    from planner.report import compare, cosine_rows, first_nonfinite, summarize

    stage = on_stage or (lambda name: None)
    stage("plan")
    res = plan(graph, device, cfg, optimizer, ctx, on_record)
    plan_seconds = float(res.stats["plan_seconds"])
    faults = int(res.stats.get("timing_faults", 0))
    errors = None
    cosine = None
    noise = None
    nonfinite = None
    casts: dict[str, list[int]] = {}
    sim_seconds = float(res.stats["simulate_timing_seconds"])
    if numerics:
        stage("simulate with values")
        raw = params if params is not None else init_params(graph, seed=seed)
        params = quantize_params(graph, raw, casts) if params is not None else raw
        inputs = dict(inputs) if inputs is not None else init_inputs(graph, seed=seed + 1)
        t0 = time.perf_counter()
        sim = run(res.package, params=params, inputs=inputs, numerics=True)
        sim_seconds = time.perf_counter() - t0
        faults = int(sim.n_faults)
        if not faults:
            stage("reference")
            ref = reference(graph, params, inputs, casts=casts)
            errors = compare(sim.outputs, ref)
            stage("fp32 reference")
            ref32 = reference(fp32_graph(graph), raw, inputs)
            cosine = cosine_rows(sim.outputs, ref32)
            noise = compare(ref, ref32)[0]
            nonfinite = first_nonfinite(sim.outputs, "simulated") or first_nonfinite(
                ref, "reference")
    summary = summarize(graph, device, res.package, res.cycles, res.baseline_cycles,
                        res.history, res.stats, plan_seconds, sim_seconds, errors, faults,
                        nonfinite, cast_fractions(casts), cosine, noise)
    if numerics and not faults and also is not None:
        summary.update(also(sim.outputs))
    summary.update(breakdown(res, sim if numerics else None))
    summary.update(optimizer_summary(res))
    bad = faults > 0 or (numerics and not faults and not summary["numerics_ok"])
    return RunOutcome(res, summary, 1 if bad else 0)
