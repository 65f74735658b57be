"""Extension points: baseline policies, proposal kinds and optimizers, by name.

Each is a small Protocol and a `tilecommon.registry.Registry`; the built-in ones register
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
  around an incumbent; `around` (planner.search.around.Around) holds the
  graph, device, pinned incumbent plan, its lowering, measured profile and
  catalogue access.
- `OptimizerFactory`: `(cfg) -> Optimizer`, an optimizer being
  `(graph, device, cfg, baseline, ctx) -> (final incumbent, history)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tilecommon.registry import Registry

if TYPE_CHECKING:
    from planner.decide.plan import Plan
    from planner.ir.graph import Graph
    from planner.lowering.state import BuildState
    from planner.search.around import Around, Proposal
    from planner.search.context import PlanningContext
    from planner.search.incumbent import Incumbent, PipelineConfig
    from simulator.device import Device


class BaselinePolicy(Protocol):
    def __call__(self, graph: Graph, device: Device, limit: int, ctx: BuildState, /) -> Plan:
        ...


class ProposalKind(Protocol):
    def __call__(self, around: Around, /) -> list[Proposal]: ...


class Optimizer(Protocol):
    def __call__(self, graph: Graph, device: Device, cfg: PipelineConfig, baseline: Incumbent,
                 ctx: PlanningContext, /) -> tuple[Incumbent, Sequence[Any]]: ...


OptimizerFactory = Callable[["PipelineConfig"], Optimizer]


BASELINES: Registry[BaselinePolicy] = Registry("baseline policy", "tileplan.baselines",
                                               "--baseline")
PROPOSALS: Registry[ProposalKind] = Registry("proposal kind", "tileplan.proposals",
                                             "--proposals")
OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer", "tileplan.optimizers",
                                                  "--optimizer")

