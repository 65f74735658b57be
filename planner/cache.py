"""Build caches shared across optimizer trials, keyed by content.

Three caches, one counter pair (hits, misses) each, plus the catalogue's:

- `implementation` — the per-op recipe catalogue.  `planner.catalogue`
  already memoises `catalogue(graph, op, device, limit)` by (op signature,
  device, limit), so an unchanged operator recipe skips catalogue generation
  on every trial; this module reuses that cache and reports its counters
  (`catalogue.CACHE_STATS`) rather than keeping a second copy.
- `expansion` — graph + device + plan (without the schedule-only
  `reduction_overlap` flag) + shortlist limit → the expanded `Program`.
  Two plans that differ only in reduction overlap share one expansion.
  A miss still resumes from the longest common lowered-step prefix of a
  recent expansion (`planner.expand.RECENT`), so only the steps from the
  first changed one on are expanded again.
- `schedule` — (expansion key, reduction_overlap) → the exchange/compute
  superstep `Schedule` of that program.
- `trial` — graph + device + plan + limit → the complete evaluated build
  (an `Incumbent`) or the `BuildFailure` text: a plan already built (for
  instance speculatively) is never built twice.

Keys are the frozen values themselves (Graph, Device and Plan are frozen
dataclasses with tuple fields, compared by content); dict lookups never
decide an order.  Each cache keeps at most `max_entries` values, dropping
the least recently used (programs of full-size models are large).

The caches are per process: worker processes of a parallel optimizer keep
their own and send their counter increments back with each result
(`Counters.add`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from kernels.exceptions import BuildFailure
from planner import catalogue as cat
from planner.build import Built, build_program, graph_meta
from planner.expand import expand_program, gc_paused
from planner.graph import Graph
from planner.pipeline import Incumbent
from planner.plan import Plan
from planner.program import Program
from planner.proposals import step_profile
from planner.schedule import Schedule
from simulator.device import Device
from simulator.run import run

CACHES = ("implementation", "expansion", "schedule", "trial")
MAX_ENTRIES = 8

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A small least-recently-used map counting hits and misses (thread-safe:
    a thread-pool optimizer shares one cache between its workers)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.data: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self.lock:
            value = self.data.get(key)
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self.data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self.lock:
            self.data[key] = value
            self.data.move_to_end(key)
            while len(self.data) > self.max_entries:
                self.data.popitem(last=False)


@dataclass
class Counters:
    """Hits and misses per cache name (CACHES order)."""

    counts: dict[str, list[int]] = field(
        default_factory=lambda: {name: [0, 0] for name in CACHES})

    def add(self, other: Counters) -> None:
        for name in CACHES:
            for i in range(2):
                self.counts[name][i] += other.counts[name][i]

    def minus(self, other: Counters) -> Counters:
        return Counters({name: [self.counts[name][i] - other.counts[name][i] for i in range(2)]
                         for name in CACHES})

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {name: {"hits": h, "misses": m} for name, (h, m) in self.counts.items()}

    def line(self) -> str:
        return ", ".join(f"{name} {h} hit / {m} miss" for name, (h, m) in self.counts.items())


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
    # measured cycles per step label (proposals.step_profile), when built
    profile: dict[str, int] | None = None


class BuildCache:
    """The expansion, schedule and trial caches of one process."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.expansion: LRU[tuple, Program] = LRU(max_entries)
        self.schedule: LRU[tuple, Schedule] = LRU(max_entries)
        self.trial: LRU[tuple, Trial] = LRU(max_entries * 4)

    def counters(self) -> Counters:
        c = Counters()
        c.counts["implementation"] = [cat.CACHE_STATS["hits"], cat.CACHE_STATS["misses"]]
        for name, lru in (("expansion", self.expansion), ("schedule", self.schedule),
                          ("trial", self.trial)):
            c.counts[name] = [lru.hits, lru.misses]
        return c

    def build(self, graph: Graph, device: Device, plan: Plan, limit: int) -> Built:
        """`planner.build.build` through the expansion and schedule caches.
        Raises BuildFailure."""
        t0 = time.perf_counter()
        ekey = (graph, device, replace(plan, reduction_overlap=False), limit)
        program = self.expansion.get(ekey)
        if program is None:
            program = expand_program(graph, device, plan, limit)
            self.expansion.put(ekey, program)
        skey = (ekey, plan.reduction_overlap)
        sched = self.schedule.get(skey)
        built = build_program(program, device, graph.name, graph_meta(graph, plan),
                              reduction_overlap=plan.reduction_overlap,
                              timings=[("expand", time.perf_counter() - t0)], sched=sched)
        if sched is None:
            self.schedule.put(skey, built.schedule)
        return built

    def evaluate(self, graph: Graph, device: Device, plan: Plan, limit: int) -> Trial:
        """Build and simulate (timing only) `plan`, or say why it did not build.
        A package that simulates with faults counts as not built."""
        key = (graph, device, plan, limit)
        hit = self.trial.get(key)
        if hit is not None:
            return hit
        with gc_paused():
            trial = self._evaluate(graph, device, plan, limit)
        self.trial.put(key, trial)
        return trial

    def _evaluate(self, graph: Graph, device: Device, plan: Plan, limit: int) -> Trial:
        t0 = time.perf_counter()
        try:
            built = self.build(graph, device, plan, limit)
        except BuildFailure as e:
            return Trial(None, " ".join(str(e).split()), time.perf_counter() - t0)
        t1 = time.perf_counter()
        sim = run(built.package, numerics=False)
        inc = Incumbent(plan, built, int(sim.cycles), time.perf_counter() - t1,
                        int(sim.n_faults))
        failure = f"simulation faults: {sim.n_faults}" if sim.n_faults else ""
        prof = None if failure else step_profile(built.schedule, sim.cycles_per_step)
        return Trial(None if failure else inc, failure, time.perf_counter() - t0,
                     None if failure else inc.cycles, prof)


SHARED = BuildCache()


def counters() -> Counters:
    """The shared (this process's) cache counters."""
    return SHARED.counters()


def evaluate_in_worker(graph: Graph, device: Device, plan: Plan, limit: int,
                       parent_pid: int) -> tuple[Trial, Counters | None]:
    """`SHARED.evaluate` for a speculative build.  In the parent's own process
    (a thread pool) the complete trial and None; in another process the
    trial without its package plus the counter increments it caused (which
    the parent cannot see)."""
    before = SHARED.counters()
    trial = SHARED.evaluate(graph, device, plan, limit)
    if os.getpid() == parent_pid:
        return trial, None
    return replace(trial, incumbent=None), SHARED.counters().minus(before)


def summary(c: Counters) -> dict[str, Any]:
    """JSON-able counters for a run summary."""
    return c.as_dict()
