"""What the search works on: the planning configuration, an incumbent (a plan
with its complete build and simulated cycles) and `evaluate`, which turns a
plan into one (build + timing simulation)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from planner.decide.catalogue import DEFAULT_LIMIT
from planner.decide.constraints import Constraints, Pins, resolve
from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.lowering.stages import Built, build, verified
from planner.lowering.state import BuildState
from simulator.device import Device
from simulator.package import Package
from simulator.run import run
from tilecommon.errors import ConfigError


@dataclass(frozen=True)
class PipelineConfig:
    """What a planning run may do (mirrors `tileplan run` flags).

    `optimization_steps`: proposals the optimizer may evaluate (0 = baseline
    only); `operator_candidate_limit`: catalogue shortlist length per op;
    `baseline`: the baseline policy's registered name (planner.search.registry:
    "default", "capacity" or a registered one); `optimizer`: the optimizer's
    ("local", "none" or a registered one); `proposals`: the proposal kinds it
    may generate (empty: the built-in kinds); `jobs`: worker processes/threads
    for speculative builds; `constraints`: decisions pinned from a file
    (planner.decide.constraints): the baseline takes them, the optimizer
    never changes them.
    """

    optimization_steps: int = 8
    operator_candidate_limit: int = DEFAULT_LIMIT
    jobs: int = 1
    baseline: str = "default"
    optimizer: str = "local"
    proposals: tuple[str, ...] = ()
    constraints: Constraints | None = None

    def __post_init__(self) -> None:
        if self.constraints is not None and not isinstance(self.constraints, Constraints):
            raise ConfigError("PipelineConfig", "constraints", "must be Constraints "
                              "(planner.decide.constraints.load_constraints)",
                              type(self.constraints).__name__)
        for name in ("optimization_steps", "operator_candidate_limit", "jobs"):
            v = getattr(self, name)
            low = 0 if name == "optimization_steps" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError("PipelineConfig", name, f"must be an integer >= {low}", v)
        for name in ("baseline", "optimizer"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError("PipelineConfig", name, "must be a name", getattr(self, name))
        if not isinstance(self.proposals, tuple) or not all(
                isinstance(k, str) and k for k in self.proposals):
            raise ConfigError("PipelineConfig", "proposals", "must be a tuple of kind names",
                              self.proposals)


@dataclass(frozen=True)
class Incumbent:
    """A plan with its complete build and its simulated (timing-only) cycles."""

    plan: Plan
    built: Built
    cycles: int
    simulate_seconds: float
    faults: int = 0
    # the simulated cycles of each step (int64 [steps]) when kept: the
    # optimizer's step profile reads them instead of simulating again
    cycles_per_step: Any = field(default=None, compare=False, repr=False)


def evaluate(graph: Graph, device: Device, plan: Plan,
             state: BuildState | None = None) -> Incumbent:
    """Build `plan` (remembering in `state`) and simulate it without
    numerics.  The build's verify stage runs on a thread of its own beside
    the timing simulation (the engine needs only the structure check, which
    `run` makes first; verify's scans run jitted without the GIL): what
    returns is verified.  Raises BuildFailure."""
    built = build(graph, device, plan, state, check=False)
    with ThreadPoolExecutor(1, thread_name_prefix="tileplan-verify") as pool:
        checking = pool.submit(_timed_verify, built.package)
        t0 = time.perf_counter()
        sim = run(built.package, numerics=False)
        seconds = time.perf_counter() - t0
        verify_seconds = checking.result()  # raises BuildFailure("verify")
    built = replace(built, timings=built.timings + (("verify", verify_seconds),))
    return Incumbent(plan, built, int(sim.cycles), seconds, int(sim.n_faults),
                     sim.cycles_per_step)


def _timed_verify(pkg: Package) -> float:
    t0 = time.perf_counter()
    verified(pkg)
    return time.perf_counter() - t0




def pins_of(cfg: PipelineConfig, graph: Graph, device: Device,
            state: BuildState | None = None) -> Pins | None:
    """`cfg.constraints` matched to `graph` (None without constraints);
    ConfigError naming the file and the pin otherwise."""
    if cfg.constraints is None:
        return None
    return resolve(cfg.constraints, graph, device,
                   state.catalogue if state is not None else None)
