"""Local proposals: small neighbourhood changes to the incumbent Plan.

`proposals(graph, device, plan, profile, limit, kinds, ctx)` returns every
proposal of the `kinds` around the incumbent `plan`, each a frozen, hashable,
sortable `Proposal` (planner.search.around) holding the changed Plan, a
`kind`, a one-line `description` and an estimated gain in cycles (positive =
expected cheaper).  The list is ordered by estimated gain, largest first; ties
by kind, then description — never by hash or set order; of two proposals with
the same plan the better estimate is kept.

A proposal kind is a function `(around) -> list[Proposal]` registered by name
in planner.search.registry.PROPOSALS, the built-in ones exactly as a
third party's would be.  The default set, `KINDS`, is the nine built-in
kinds, one module each in planner.search.kinds (its docstring says what the
kind changes and how its gain is estimated):

- `operator`: another shortlisted recipe of one op;
- `joint`: open a boundary and re-pick its consumer's recipe;
- `open`: open one canonical boundary;
- `inplace`: run an elementwise op where its input arrives (opening its boundary);
- `cast`: cast before redistribution (early casting) for one absorbed Cast;
- `packing`: another canonical packing;
- `overlap`: let independent K-split reductions overlap (schedule flag);
- `tiles`: shift one op's placement off the tiles it shares a merged step with;
- `fuse`: run a group of sibling matmuls (q, k, v) as one recipe.

A registered kind outside `KINDS` takes part only when named
(`--proposals KIND,...`), so installing a plug-in never changes a default run.

Every proposal starts from the incumbent with its parameter-home rotation
bases pinned (`around.pinned`), so a recipe change moves only the homes of
the op whose recipe changes; packing changes the layout of every value by
design.  Measured cycles come from planner.search.profile.step_profile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.decide import catalogue as cat
from planner.decide.plan import Plan
from planner.ir.graph import Graph
from planner.search import kinds as _kinds  # noqa: F401  (registers the built-in kinds)
from planner.search.around import Around, Proposal
from planner.search.profile import Profile
from planner.search.registry import PROPOSALS
from simulator.device import Device

if TYPE_CHECKING:
    from planner.lowering.state import BuildState

# the default kinds, in the order their proposals are generated
KINDS = ("operator", "joint", "open", "inplace", "cast", "packing", "overlap", "tiles", "fuse")


def proposals(graph: Graph, device: Device, plan: Plan, profile: Profile,
              limit: int = cat.DEFAULT_LIMIT, kinds: tuple[str, ...] | None = None,
              ctx: BuildState | None = None) -> list[Proposal]:
    """All proposals of `kinds` (None: KINDS) around `plan` (module
    docstring), best estimated gain first.  `profile` is `step_profile` of
    the incumbent; `limit` the catalogue shortlist length; `ctx` the
    planning context.  Raises ConfigError for an unknown kind."""
    chosen = list(KINDS if kinds is None else kinds)
    makers = [PROPOSALS.get(k) for k in chosen]  # unknown kinds fail before any work
    around = Around(graph, device, plan, profile, limit, ctx)
    out: list[Proposal] = []
    for make in makers:
        out += make(around)
    unique = {p.plan: p for p in sorted(out, reverse=True)}  # best duplicate wins
    return sorted(unique.values())
