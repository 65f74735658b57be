"""The planning context: everything one planning run remembers, as one object.

`PlanningContext` is a `BuildState` (catalogue, lowerings, expansion prefixes,
schedule-phase and buffer memos: planner.lowering.state) plus the search's own
caches, keyed by content:

- `expansions` — (graph, device, plan without the schedule-only
  `reduction_overlap` flag, shortlist limit) → the expanded `Program`; two
  plans that differ only in reduction overlap share one expansion;
- `schedules` — (expansion key, reduction_overlap) → its `Schedule`;
- `trials` — (graph, device, plan, limit) → the outcome of its evaluation
  (cycles and step profile, or why it did not build), without the build
  itself: a plan already evaluated (for instance speculatively) is not
  evaluated again, and one accepted from there is rebuilt
  (planner.search.trials.evaluate `complete`).

The expansion and schedule caches (and the expansion prefixes) are bounded by
entries and by their programs' vertices and transfer rows (PROGRAM_ROWS,
SCHEDULE_ROWS): a 27-layer full-size program is hundreds of MB.

`planner.plan` makes a fresh context per call unless one is passed in; a
benchmark that wants a cold start makes a new one.  Worker processes of a
parallel optimizer each make their own (contexts are not shared between
processes) and send their counter increments back with each result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.lowering.program import Phase, Program
from planner.lowering.schedule import Schedule
from planner.lowering.state import LRU, BuildState

CACHES = ("implementation", "expansion", "schedule", "trial")
MAX_ENTRIES = 8
# expansions and schedules kept while their vertices and transfer rows sum to
# at most this many: a 27-layer siglip-so400m-map program holds ~2.6M rows
# (about 0.2 GB each for its Program and its Schedule), so it is one
PROGRAM_ROWS = 3_000_000
# schedules kept by the same measure: a hit needs the very plan again, which
# the trial cache already answers, so only small programs' are worth keeping
SCHEDULE_ROWS = 500_000
# trial outcomes kept (without their builds: planner.search.trials)
TRIAL_ENTRIES = 64


def program_rows(program: Program) -> int:
    """Vertices and transfer rows of an expanded program (its cache weight)."""
    return sum(len(p.vertices) + len(p.transfers) for p in program.items
               if isinstance(p, Phase))


def schedule_rows(sched: Schedule) -> int:
    """Vertices and transfer rows of a schedule (its cache weight)."""
    return sum(len(st.vertices) + len(st.transfers) for st in sched.steps)


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
        super().__init__(prefix_entries, max_rows)
        self.expansions: LRU[tuple, Program] = LRU(max_entries, max_rows, program_rows)
        self.schedules: LRU[tuple, Schedule] = LRU(max_entries, min(max_rows, SCHEDULE_ROWS),
                                                   schedule_rows)
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
