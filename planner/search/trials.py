"""Trials: a plan built into a complete package and costed, through a
planning context's caches (planner.search.context), so that an unchanged
recipe skips catalogue generation, a plan that differs from a recent one only
in reduction overlap reuses its expansion, a build resumes from the longest
common lowered-step prefix of a recent expansion, and a plan already built
(for instance speculatively) is never built twice.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.expand import gc_paused
from planner.lowering.stages import Built, build_program, expand_stage, graph_meta, plan_owners
from planner.search.context import Counters, PlanningContext
from planner.search.incumbent import Incumbent
from planner.search.proposals import Profile, step_profile
from simulator.device import Device
from simulator.run import run
from tilecommon.errors import BuildFailure


@dataclass(frozen=True)
class Trial:
    """The outcome of building and costing one plan: its `cycles` (None when
    it did not build; `failure` says why) and, when it was built in this
    process, the complete build as an `incumbent`.  A trial built in another
    process comes back without the package (`incumbent` None, `cycles` set):
    a complete build pickles slowly (tens of MB of schedule objects), so the
    parent rebuilds the few it accepts."""

    incumbent: Incumbent | None
    failure: str = ""
    seconds: float = 0.0
    cycles: int | None = None
    # measured cycles per lowered step and per op (proposals.step_profile), when built
    profile: Profile | None = None


def build(ctx: PlanningContext, graph: Graph, device: Device, plan: Plan) -> Built:
    """`planner.lowering.build` through the context's expansion and schedule
    caches.  Raises BuildFailure."""
    with gc_paused():
        clock: list[tuple[str, float]] = []
        ekey = (graph, device, replace(plan, reduction_overlap=False))
        program = ctx.expansions.get(ekey)
        if program is None:
            program = expand_stage(graph, device, plan, ctx, clock)
            ctx.expansions.put(ekey, program)
        skey = (ekey, plan.reduction_overlap)
        sched = ctx.schedules.get(skey)
        built = build_program(program, device, graph.name, graph_meta(graph, plan),
                              reduction_overlap=plan.reduction_overlap, timings=clock,
                              sched=sched, state=ctx,
                              owners=plan_owners(graph, device, plan, ctx))
        if sched is None:
            ctx.schedules.put(skey, built.schedule)
        return built


def evaluate(ctx: PlanningContext, graph: Graph, device: Device, plan: Plan,
             complete: bool = False) -> Trial:
    """Build and simulate (timing only) `plan`, or say why it did not build.
    A package that simulates with faults counts as not built.  The context
    remembers the outcome without the build (a complete 27-layer build holds
    ~0.4 GB): a plan evaluated before comes back without its `incumbent`
    unless `complete`, which builds it again when the remembered outcome has
    none."""
    key = (graph, device, plan)
    hit = ctx.trials.get(key)
    if hit is not None and (hit.incumbent is not None or not complete or hit.cycles is None):
        return hit  # type: ignore[no-any-return]
    with gc_paused():
        trial = _evaluate(ctx, graph, device, plan)
    ctx.trials.put(key, replace(trial, incumbent=None))
    return trial


def _evaluate(ctx: PlanningContext, graph: Graph, device: Device, plan: Plan) -> Trial:
    t0 = time.perf_counter()
    try:
        built = build(ctx, graph, device, plan)
    except BuildFailure as e:
        return Trial(None, " ".join(str(e).split()), time.perf_counter() - t0)
    t1 = time.perf_counter()
    sim = run(built.package, numerics=False)
    inc = Incumbent(plan, built, int(sim.cycles), time.perf_counter() - t1, int(sim.n_faults))
    failure = f"simulation faults: {sim.n_faults}" if sim.n_faults else ""
    prof = None if failure else step_profile(built, sim.cycles_per_step)
    return Trial(None if failure else inc, failure, time.perf_counter() - t0,
                 None if failure else inc.cycles, prof)


# the context of this worker process, set by `init_worker` when the pool
# starts (forked: a copy of the parent's context at that moment)
_WORKER: list[PlanningContext] = []


def init_worker(ctx: PlanningContext) -> None:
    """Process-pool initializer: this worker's trials go through `ctx`."""
    _WORKER[:] = [ctx]


def evaluate_in_worker(graph: Graph, device: Device, plan: Plan, parent_pid: int,
                       ctx: PlanningContext | None = None
                       ) -> tuple[Trial, Counters | None]:
    """`evaluate` for a speculative build.  In the parent's own process (a
    thread pool, which passes the parent's `ctx`) the complete trial and
    None; in a worker process (its own context: `init_worker`) the trial
    without its package plus the counter increments it caused (which the
    parent cannot see)."""
    own = ctx if ctx is not None else (_WORKER[0] if _WORKER else PlanningContext())
    before = own.counters()
    trial = evaluate(own, graph, device, plan)
    if os.getpid() == parent_pid:
        return trial, None
    return replace(trial, incumbent=None), own.counters().minus(before)


def summary(c: Counters) -> dict[str, Any]:
    """JSON-able counters for a run summary."""
    return c.as_dict()
