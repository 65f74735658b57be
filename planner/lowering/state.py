"""What builds remember between calls: one `BuildState` object, never module
globals.

A state holds the catalogue's cache (shortlists, recipes by key, kernel-call
cycles), the recent lowerings by content, the recent expansions a new one
resumes from (`PrefixStore`), the facts of recent schedule phases, the buffer
columns of recent programs, and whole expansions and schedules by content:

- `expansions` — (graph, device, plan without the schedule-only
  `reduction_overlap` flag) → the expanded `Program`; two plans that differ
  only in reduction overlap share one expansion;
- `schedules` — (expansion key, reduction_overlap) → its `Schedule`.

Both are bounded by entries and by their programs' vertices and transfer rows
(PROGRAM_ROWS, SCHEDULE_ROWS): a 27-layer full-size program is hundreds of MB.
`planner.search.context.PlanningContext` adds the search's trial outcomes;
`planner.plan` makes one per call unless one is passed in, and a benchmark
that wants a cold start makes a new one.  Every
function that takes a state accepts None: a fresh state for that call (nothing
shared).  Results never depend on what a state remembers, only speed does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from planner.decide.catalogue import CatalogueCache
from planner.lowering.columns import BufMemo, PhaseMemo
from planner.lowering.expand import PrefixStore
from planner.lowering.lowered import Lowered
from planner.lowering.program import Phase, Program
from planner.lowering.schedule import Schedule

K = TypeVar("K")
V = TypeVar("V")

# lowerings kept by content: the optimizer lowers each incumbent three times
# (its build's expansion, `around.pinned`, the proposal generator)
RECENT_LOWERINGS = 8
# weight of the remembered schedule phases: vertices + transfer rows (about
# eight vit-tiny 2-layer programs' compute phases)
PHASE_WEIGHT = 200_000
# expansions and schedules kept (entries)
MAX_ENTRIES = 8
# expansions kept while their vertices and transfer rows sum to at most this
# many: a 27-layer siglip-so400m-map program holds ~2.6M rows (about 0.2 GB
# each for its Program and its Schedule), so it is one
PROGRAM_ROWS = 3_000_000
# schedules kept by the same measure: a hit needs the very plan again, which
# a planning context's trial cache already answers, so only small programs'
# are worth keeping
SCHEDULE_ROWS = 500_000


def program_rows(program: Program) -> int:
    """Vertices and transfer rows of an expanded program (its cache weight)."""
    return sum(len(p.vertices) + len(p.transfers) for p in program.items
               if isinstance(p, Phase))


def schedule_rows(sched: Schedule) -> int:
    """Vertices and transfer rows of a schedule (its cache weight)."""
    return sum(len(st.vertices) + len(st.transfers) for st in sched.steps)


class LRU(Generic[K, V]):
    """A small least-recently-used map counting hits and misses (thread-safe:
    a thread-pool optimizer shares one between its workers).  It keeps at
    most `max_entries` values and, with a `weigh` function, drops the least
    recently used ones while their summed weight exceeds `max_weight` (a
    value heavier than that on its own is not kept)."""

    def __init__(self, max_entries: int, max_weight: int = 0,
                 weigh: Callable[[V], int] | None = None) -> None:
        self.max_entries = max_entries
        self.max_weight = max_weight
        self.weigh = weigh
        self.data: OrderedDict[K, V] = OrderedDict()
        self.weights: dict[K, int] = {}
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
        w = self.weigh(value) if self.weigh is not None else 0
        with self.lock:
            self.data[key] = value
            self.weights[key] = w
            self.data.move_to_end(key)
            while self.data and (len(self.data) > self.max_entries or (
                    self.weigh is not None and sum(self.weights.values()) > self.max_weight)):
                old, _ = self.data.popitem(last=False)
                del self.weights[old]


class BuildState:
    """The build layer's caches (module docstring); `prefix_entries` = 0
    makes every expansion start from scratch; `max_rows` bounds the
    expansions kept to resume from and the expansion and schedule caches by
    their vertices and transfer rows, `max_entries` the latter two by count."""

    def __init__(self, prefix_entries: int = 4, max_rows: int = PROGRAM_ROWS,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.catalogue = CatalogueCache()
        self.lowerings: LRU[tuple, Lowered] = LRU(RECENT_LOWERINGS)
        self.prefixes = PrefixStore(prefix_entries, max_rows)
        self.phases: PhaseMemo = PhaseMemo(PHASE_WEIGHT)
        self.bufs = BufMemo(4)
        self.expansions: LRU[tuple, Program] = LRU(max_entries, max_rows, program_rows)
        self.schedules: LRU[tuple, Schedule] = LRU(max_entries, min(max_rows, SCHEDULE_ROWS),
                                                   schedule_rows)
