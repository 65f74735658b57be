"""Per-op whole-device recipes ("mid selections") with estimates.

A `Recipe` (planner.decide.recipe) is one way to run one op on the whole
device, independent of the plan's tile mapping (so it can be cached by op
signature).  The op's kind names its family (planner.ir.opkind: FAMILY) and
the family makes its recipes (planner.decide.families):

- `matmul` (gm, gn, gk): MatMul on a grid of tiles, K split when gk > 1;
- `bmm` (bg, gr) or (1, gr, gc): the attention's batched matmuls;
- `rows` (rows_per_owner,) or (rows_per_owner, column blocks): row-parallel
  ops (LayerNorm, Softmax, GELU, Add, Cast, ...), column blocks for the
  elementwise ones;
- `move` (key `heads`): SplitHeads/MergeHeads/Broadcast/..., a
  redistribution between canonical layouts.

Estimate (cycles) = max per-tile compute cycles (kernel cycle models via
`kernels.dispatch.vertex_cycles`) + per exchange phase (sync + max per-tile
bytes in or out / bandwidth): the operands' move from the canonical layout,
weight multicast, partial exchange and the move of the result back to
canonical.  A move from canonical is bound by the canonical owner sending
its whole block (`canonical_bytes`: multicast counts a source region once,
but the readers of one owner read different slices of it), a move to
canonical by the owner receiving its whole block; whichever is larger than
the recipe tile's own bytes sets the phase (an estimate from the recipe
tile's in-bytes alone is several times low on MatMul, BatchMatMul, GELU and
Add: experiments/estimate_accuracy.py).
`in_bytes`/`out_bytes` are the busiest phase's per-tile bytes received/sent
and `syncs` the exchange phases.  `mem_bytes` is the per-tile tensor bytes
the op needs while it runs (operand blocks, partials, landing buffers);
`home_bytes` the per-tile bytes of one layer of its parameter homes
(persistent; the baseline multiplies by trips).  `xbytes` is the per-tile exchange-landing storage.

An fp8 `a` operand of a MatMul or BatchMatMul is, by default, estimated as
it arrives under cast order "after" (`narrow=False`): the wide fp16 value
lands on the recipe's tile (its bytes in the input phase and in `mem_bytes`)
and one CAST vertex per tile narrows it (in the compute cycles).  With
`narrow=True` the estimate is for cast order "before": the fp8 value lands as
is.  Recipe keys do not depend on it.

`catalogue(g, op, device, limit, packing)` returns the shortlist: the
`limit` best estimates, always including the smallest-`mem_bytes` recipe and
the exchange-storage extreme (smallest `xbytes`).  Estimates are against the
canonical layout of `packing` (default "element"; recipe keys do not depend
on it).  A `CatalogueCache` (a planning context's) remembers results by (op
signature, device, limit, packing) and counts hits and misses.
"""

from __future__ import annotations

from planner.decide import families as _families  # noqa: F401  (registers the built-in families)
from planner.decide.recipe import FAMILIES as FAMILIES
from planner.decide.recipe import GRID_STEPS as GRID_STEPS
from planner.decide.recipe import MIN_EW_COLS as MIN_EW_COLS
from planner.decide.recipe import Recipe as Recipe
from planner.decide.recipe import call_cycles as call_cycles
from planner.decide.recipe import canonical_bytes as canonical_bytes
from planner.decide.recipe import exchange_cycles as exchange_cycles
from planner.decide.recipe import matmul_cycles as matmul_cycles
from planner.decide.recipe import reduce_cycles as reduce_cycles
from planner.ir.graph import Graph, Op
from planner.ir.opkind import attribute_items
from simulator.device import Device
from tilecommon.errors import Unsupported

DEFAULT_LIMIT = 8


# ------------------------------------------------------------ signatures


def op_signature(g: Graph, op: Op) -> tuple:
    """What a recipe depends on: op kind, operand shapes and dtypes (and
    whether each is a parameter), and the op's attributes (flags, eps, ...)."""
    parts: list[object] = [op.kind]
    for name in op.inputs + op.outputs:
        t = g.tensor(name)
        parts.append((t.shape, t.dtype, t.kind == "parameter"))
    parts.append(attribute_items(op))
    return tuple(parts)


class CatalogueCache:
    """Shortlists by (op signature, device, limit, packing), recipes looked up
    by key, and kernel-call cycles, with hit and miss counts.  Owned by a
    planning context (planner.lowering.state); thread-safe for the dict
    operations it does (a thread-pool optimizer shares it)."""

    def __init__(self) -> None:
        self.shortlists: dict[tuple, tuple[Recipe, ...]] = {}
        self.by_key: dict[tuple, Recipe] = {}
        self.cycles: dict[tuple, int] = {}
        self.hits = 0
        self.misses = 0


def catalogue(g: Graph, op: Op, device: Device, limit: int = DEFAULT_LIMIT,
              packing: str = "element", cache: CatalogueCache | None = None,
              narrow: bool = False) -> tuple[Recipe, ...]:
    """The shortlisted recipes of `op` in graph `g` (best estimate first),
    estimated against the canonical layout of `packing` (plan.packing) and,
    with `narrow`, an fp8 `a` operand that arrives narrow (module
    docstring); remembered in `cache` when given."""
    cache = cache if cache is not None else CatalogueCache()
    key = (op_signature(g, op), device, limit, packing, narrow)
    hit = cache.shortlists.get(key)
    if hit is not None:
        cache.hits += 1
        return hit
    cache.misses += 1
    recipes = _generate(g, op, device, packing, cache.cycles, narrow)
    if not recipes:
        raise Unsupported(op.name, f"no recipe fits a {device.name} tile")
    out = shortlist(recipes, limit)
    cache.shortlists[key] = out
    return out


def shortlist(recipes: list[Recipe], limit: int) -> tuple[Recipe, ...]:
    """The `limit` best estimates plus the smallest-buffer recipe and the
    exchange-storage extreme (smallest landing bytes); order: estimate, key."""
    ranked = sorted(recipes)
    keep = ranked[: max(1, limit)]
    smallest = min(ranked, key=lambda r: (r.mem_bytes, r.cycles, r.key))
    least_x = min(ranked, key=lambda r: (r.xbytes, r.mem_bytes, r.cycles, r.key))
    for r in (smallest, least_x):
        if r not in keep:
            keep.append(r)
    return tuple(sorted(keep))


def find(recipes: tuple[Recipe, ...], key: str) -> Recipe:
    for r in recipes:
        if r.key == key:
            return r
    raise KeyError(f"recipe {key!r} not in catalogue {[r.key for r in recipes]}")


def recipe_from_key(g: Graph, op: Op, device: Device, key: str,
                    packing: str = "element", cache: CatalogueCache | None = None,
                    narrow: bool = False) -> Recipe:
    """Any recipe of `op` by key, shortlisted or not (plans and proposals may
    name grids the enumeration skipped).  Raises KeyError for a key that does
    not parse, belongs to another family or does not fit the op/device."""
    cache = cache if cache is not None else CatalogueCache()
    ck = (op_signature(g, op), device, key, packing, narrow)
    hit = cache.by_key.get(ck)
    if hit is None:
        hit = cache.by_key[ck] = _recipe_from_key(g, op, device, key, packing, cache.cycles,
                                                  narrow)
    return hit


def _recipe_from_key(g: Graph, op: Op, device: Device, key: str, packing: str,
                     memo: dict, narrow: bool = False) -> Recipe:
    for r in _generate(g, op, device, packing, memo, narrow):
        if r.key == key:
            return r
    hit = FAMILIES[op.FAMILY].from_key(g, op, device, key, packing, memo, narrow)
    if hit is None:
        raise KeyError(f"op {op.name}: no recipe {key!r}")
    return hit


def _generate(g: Graph, op: Op, device: Device, packing: str,
              memo: dict | None = None, narrow: bool = False) -> list[Recipe]:
    """Every recipe of `op` its family makes that fits a tile beside the
    fixed bytes (the smallest one when none does)."""
    memo = memo if memo is not None else {}
    budget = device.memory_size - device.fixed_bytes
    family = FAMILIES.get(op.FAMILY)
    if family is None:
        raise Unsupported(op.kind, f"no recipe family {op.FAMILY!r}")
    out = family.generate(g, op, device, packing, memo, narrow)
    fits = [r for r in out if r.mem_bytes <= budget]
    return fits or [min(out, key=lambda r: (r.mem_bytes, r.key))]
