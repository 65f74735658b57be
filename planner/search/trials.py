"""Trials: a plan built into a complete package and costed
(planner.search.incumbent.evaluate, through the build caches of a planning
context: planner.lowering.stages.build), remembered by the context without
the build, so that a plan already built (for instance speculatively) is never
built twice, and evaluated in a worker process for the parallel optimizer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.expand import gc_paused
from planner.search.context import Counters, PlanningContext
from planner.search.incumbent import Incumbent
from planner.search.incumbent import evaluate as incumbent_of
from planner.search.profile import Profile, step_profile
from simulator.device import Device
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
    # measured cycles per lowered step and per op (planner.search.profile.step_profile), when built
    profile: Profile | None = None


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
        inc = incumbent_of(graph, device, plan, ctx)
    except BuildFailure as e:
        return Trial(None, " ".join(str(e).split()), time.perf_counter() - t0)
    if inc.faults:
        return Trial(None, f"simulation faults: {inc.faults}", time.perf_counter() - t0)
    prof = step_profile(inc.built, inc.cycles_per_step)
    return Trial(inc, "", time.perf_counter() - t0, inc.cycles, prof)


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
