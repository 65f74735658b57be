"""Extension points: baseline policies, proposal kinds and optimizers, by name.

Each is a small Protocol and a `Registry`; the built-in ones register
themselves where they are defined (planner.search.policies, .proposals,
.optimize), and a third party registers with the decorator

    from planner.search.registry import BASELINES

    @BASELINES.register("mine")
    def mine(graph, device, limit, ctx): ...

or, without importing tileplan first, through a package entry point in the
group `tileplan.baselines`, `tileplan.proposals` or `tileplan.optimizers`
(`name = "module:object"`): entry points are loaded the first time a
registry is asked for a name it does not hold or for all its names; one that
does not load is a ConfigError naming it.  The CLI picks them with
`--baseline NAME`, `--proposals KIND,...` and `--optimizer NAME`, and
`tileplan extensions` lists them.  A registered proposal kind takes part
only when named (the default set is the built-in kinds), so installing a
plug-in never changes what a default run does.

- `BaselinePolicy`: `(graph, device, limit, ctx) -> Plan` — the first plan.
- `ProposalKind`: `(around) -> list[Proposal]` — the proposals of one kind
  around an incumbent; `around` (planner.search.proposals.Around) holds the
  graph, device, pinned incumbent plan, its lowering, measured profile and
  catalogue access.
- `OptimizerFactory`: `(cfg) -> Optimizer`, an optimizer being
  `(graph, device, cfg, baseline, ctx) -> (final incumbent, history)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from kernels.exceptions import ConfigError

if TYPE_CHECKING:
    from planner.build.state import BuildState
    from planner.decide.plan import Plan
    from planner.ir.graph import Graph
    from planner.search.context import PlanningContext
    from planner.search.incumbent import Incumbent, PipelineConfig
    from planner.search.proposals import Around, Proposal
    from simulator.device import Device

T = TypeVar("T")


class BaselinePolicy(Protocol):
    def __call__(self, graph: Graph, device: Device, limit: int, ctx: BuildState, /) -> Plan:
        ...


class ProposalKind(Protocol):
    def __call__(self, around: Around, /) -> list[Proposal]: ...


class Optimizer(Protocol):
    def __call__(self, graph: Graph, device: Device, cfg: PipelineConfig, baseline: Incumbent,
                 ctx: PlanningContext, /) -> tuple[Incumbent, Sequence[Any]]: ...


OptimizerFactory = Callable[["PipelineConfig"], Optimizer]


class Registry(Generic[T]):
    """Named extensions of one kind (`what`), in registration order; `group`
    is the entry-point group searched for names not registered."""

    def __init__(self, what: str, group: str, flag: str) -> None:
        self.what = what
        self.group = group
        self.flag = flag
        self._items: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: register the object under `name` (re-registering the
        same object is a no-op; another object under a taken name is an error)."""
        def add(obj: T) -> T:
            old = self._items.get(name)
            if old is not None and old is not obj:
                raise ValueError(f"{self.what} {name!r} is registered twice")
            self._items[name] = obj
            return obj
        return add

    def _load_entry_points(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in sorted(entry_points(group=self.group), key=lambda e: e.name):
            if ep.name in self._items:
                continue
            try:
                self._items[ep.name] = ep.load()
            except Exception as e:  # a broken plug-in names itself, not a traceback
                raise ConfigError(f"entry point group {self.group}", ep.name,
                                  f"{ep.value} does not load: {type(e).__name__}: {e}") from e

    def get(self, name: str) -> T:
        """The extension called `name`; ConfigError naming the known ones."""
        if name not in self._items:
            self._load_entry_points()
        if name not in self._items:
            raise ConfigError(self.flag, self.what, f"unknown; known: {self.names()}", name)
        return self._items[name]

    def names(self) -> list[str]:
        """Every registered name (entry points included), in registration order."""
        self._load_entry_points()
        return list(self._items)


BASELINES: Registry[BaselinePolicy] = Registry("baseline policy", "tileplan.baselines",
                                               "--baseline")
PROPOSALS: Registry[ProposalKind] = Registry("proposal kind", "tileplan.proposals",
                                             "--proposals")
OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer", "tileplan.optimizers",
                                                  "--optimizer")

