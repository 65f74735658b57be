"""Baseline policies: the first Plan, built before any optimisation.

`default` (DESIGN §6): canonical activation boundaries everywhere (no open
boundary), casts after redistribution, compact parameter homes with one shared
rotation (planner/lower.py), identity tile mapping, element packing.  Each op
takes the best-estimate recipe of its catalogue shortlist whose per-tile
working memory fits what the parameters leave free; the recipe estimates
include moving the op's inputs out of the canonical layout and its output
back (catalogue module docstring), so conversion cost is priced in.  When no
shortlisted recipe fits, the smallest-buffer one is taken and the build will
say where it does not fit.

`parameter_tile_bytes(graph, device, plan)` gives the per-tile parameter home
bytes of a plan from lowering alone (no expansion), for balance checks.
"""

from __future__ import annotations

from kernels.exceptions import Unsupported
from planner import catalogue as cat
from planner.graph import DTYPE_BYTES, Cast, Graph, Op, Repeat
from planner.lower import Lowered, lower
from planner.plan import Plan
from simulator.device import Device

POLICIES = ("default",)


def _ops(g: Graph, scope: str = "") -> list[tuple[str, Graph, Op]]:
    """(qualified name, graph, op) of every non-Repeat op, body ops included."""
    out: list[tuple[str, Graph, Op]] = []
    for op in g.ops:
        if isinstance(op, Repeat):
            out += _ops(op.body, f"{scope}{op.name}/")
        else:
            out.append((f"{scope}{op.name}", g, op))
    return out


def parameter_tile_bytes(lw: Lowered, tiles: int) -> list[int]:
    """Bytes of parameter homes per physical tile (all layers of sequences)."""
    per = [0] * tiles
    for name in sorted(lw.homes):
        v = lw.values[lw.homes[name]]
        for tile, nbytes in sorted(v.layout.tile_bytes(DTYPE_BYTES[v.dtype]).items()):
            per[tile] += nbytes * max(1, v.trips)
    return per


def baseline_plan(g: Graph, device: Device, limit: int = cat.DEFAULT_LIMIT,
                  policy: str = "default") -> Plan:
    """The `policy` baseline Plan of `g` on `device` (module docstring).

    Raises ValueError for an unknown policy name, Unsupported for ops the
    catalogue cannot run."""
    if policy not in POLICIES:
        if policy == "capacity":
            raise Unsupported("capacity baseline", "not implemented; use the default policy")
        raise ValueError(f"unknown baseline policy {policy!r}; choices: {POLICIES}")
    plan = Plan()
    # parameters first: their homes do not depend on the recipes' memory, only
    # on the grids, so lower once with the best estimates to size them
    first = Plan(recipes=tuple(sorted(
        (name, cat.catalogue(sub, op, device, limit)[0].key)
        for name, sub, op in _ops(g) if not isinstance(op, Cast)
    )))
    params = parameter_tile_bytes(lower(g, device, first, limit), device.tiles)
    budget = device.memory_size - device.support_bytes - max(params)
    chosen: dict[str, str] = {}
    for name, sub, op in _ops(g):
        if isinstance(op, Cast):
            continue
        shortlist = cat.catalogue(sub, op, device, limit)
        fits = [r for r in shortlist if r.mem_bytes <= budget]
        pick = fits[0] if fits else min(shortlist, key=lambda r: (r.mem_bytes, r.cycles, r.key))
        chosen[name] = pick.key
    casts = {name: "after" for name, _, op in _ops(g) if isinstance(op, Cast)}
    plan = Plan(recipes=tuple(sorted(chosen.items())), cast_order=tuple(sorted(casts.items())))
    return plan
