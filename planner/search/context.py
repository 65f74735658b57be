"""The planning context: everything one planning run remembers, as one object.

`PlanningContext` is a `BuildState` (catalogue, lowerings, expansion prefixes,
schedule-phase and buffer memos, expansions and schedules by content:
planner.lowering.state) plus the search's own cache, keyed by content:

- `trials` — (graph, device, plan) → the outcome of its evaluation (cycles
  and step profile, or why it did not build), without the build itself: a
  plan already evaluated (for instance speculatively) is not evaluated again,
  and one accepted from there is rebuilt (planner.search.trials.evaluate
  `complete`).

`planner.plan` makes a fresh context per call unless one is passed in; a
benchmark that wants a cold start makes a new one.  Worker processes of a
parallel optimizer each make their own (contexts are not shared between
processes) and send their counter increments back with each result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.lowering.state import LRU, MAX_ENTRIES, PROGRAM_ROWS, BuildState

CACHES = ("implementation", "expansion", "schedule", "trial")
# trial outcomes kept (without their builds: planner.search.trials)
TRIAL_ENTRIES = 64


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


class PlanningContext(BuildState):
    """The caches of one planning run (module docstring).  `max_entries`
    bounds the expansion and schedule caches and so does `max_rows`, their
    summed vertices and transfer rows (full-size programs are large);
    TRIAL_ENTRIES the trial outcomes; `prefix_entries` and `max_rows` the
    expansions a new build may resume from (0 entries: every expansion from
    scratch)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, prefix_entries: int = 4,
                 max_rows: int = PROGRAM_ROWS) -> None:
        super().__init__(prefix_entries, max_rows, max_entries)
        self.trials: LRU[tuple, Any] = LRU(TRIAL_ENTRIES)
        # increments reported by worker processes (their contexts are their own)
        self.remote = Counters()

    def counters(self) -> Counters:
        """This context's hit and miss counts (plus what workers reported)."""
        c = Counters()
        c.counts["implementation"] = [self.catalogue.hits, self.catalogue.misses]
        for name, lru in (("expansion", self.expansions), ("schedule", self.schedules),
                          ("trial", self.trials)):
            c.counts[name] = [lru.hits, lru.misses]
        c.add(self.remote)
        return c
