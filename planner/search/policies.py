"""Baseline policies: the first Plan, built before any optimisation.

`default`: canonical activation boundaries everywhere (no open boundary),
narrow pieces of moves row by row up to `default_row_moves(device)` rows,
compact parameter homes with one shared rotation (planner/lower.py),
identity tile mapping.  Each op takes the best-estimate recipe of its
catalogue shortlist whose per-tile parameter homes (all layers) stay within
PARAM_HEADROOM × the device mean parameter bytes per tile and whose working
memory fits what the parameters leave free; the recipe estimates include
moving the op's inputs out of the canonical layout and its output back
(catalogue module docstring), so conversion cost is priced in.  When no
shortlisted recipe fits, the smallest-buffer one is taken and the build will
say where it does not fit.  Two choices are made by the same estimates
rather than fixed (the policy's calibration to the device's costs):

- the canonical packing: each of DEFAULT_PACKINGS ("element": one 16 KiB
  SRAM element per owner; "rows": whole rows over as many owners as the
  device has) is planned and the one whose chosen recipes estimate fewer
  cycles in total is kept (ties: element).  On the calibrated c600 a
  full-size model's canonical owners under element packing hold seven
  rows each on a seventh of the tiles, whose exchange tables and code then
  leave its matmuls no room at batch 2 (siglip-so400m-map: tile 0 short by
  75 kB); rows packing spreads them over every tile;
- the cast order of each absorbable Cast whose consumers are all
  MatMul/BatchMatMul `a` operands: "before" (cast on the input's canonical
  owners, recipe `rows:<canonical rows per owner>`, then move the narrow
  value) when that cast's estimate plus the consumers' narrow-input
  estimates is below the consumers' wide-input estimates (which move the
  fp16 value and cast every replica on the consumer's tiles), else "after".

`element` (`--baseline element`): the uncalibrated default, element packing
and every cast after redistribution (the original design's first plan;
early casting and packing are then left to the optimizer's proposals).

`capacity` (opt-in, `--baseline capacity`): see `capacity_plan`.

`parameter_tile_bytes(lowered, tiles)` gives the per-tile parameter home
bytes of a plan from lowering alone (no expansion), for balance checks.
"""

from __future__ import annotations

from planner.decide import catalogue as cat
from planner.decide.layout import canonical_rows_per_owner, view2d
from planner.decide.plan import Plan
from planner.ir.graph import DTYPE_BYTES, Graph, Op, op_sites
from planner.lowering.lower import Lowered, absorbable, lower
from planner.lowering.state import BuildState
from planner.search.registry import BASELINES
from simulator.device import Device

POLICIES = ("default", "element", "capacity")  # the built-in policies (BASELINES holds every one)
# the canonical packings the default policy compares (ties: the first)
DEFAULT_PACKINGS = ("element", "rows")
# a recipe's parameter homes may hold this multiple of the device mean per tile
PARAM_HEADROOM = 1.25


def parameter_tile_bytes(lw: Lowered, tiles: int) -> list[int]:
    """Bytes of parameter homes per physical tile (all layers of sequences)."""
    per = [0] * tiles
    for name in sorted(lw.homes):
        v = lw.values[lw.homes[name]]
        for tile, nbytes in sorted(v.layout.tile_bytes(DTYPE_BYTES[v.dtype]).items()):
            per[tile] += nbytes * max(1, v.trips)
    return per


def baseline_plan(g: Graph, device: Device, limit: int = cat.DEFAULT_LIMIT,
                  policy: str = "default", ctx: BuildState | None = None) -> Plan:
    """The baseline Plan of `g` on `device` by the policy registered as
    `policy` (planner.search.registry.BASELINES; module docstring).

    Raises ConfigError for an unknown policy name, Unsupported for ops the
    catalogue cannot run."""
    return BASELINES.get(policy)(g, device, limit, ctx if ctx is not None else BuildState())


@BASELINES.register("default")
def default_plan(g: Graph, device: Device, limit: int, ctx: BuildState) -> Plan:
    """Each op's best-estimated recipe that fits beside an even parameter
    share, under the packing and cast orders whose estimates are cheapest.

    The `default` policy in full: module docstring."""
    drafts = [_default_at(g, device, limit, ctx, packing) for packing in DEFAULT_PACKINGS]
    return min(drafts, key=lambda d: d[1])[0]  # ties: the first packing


@BASELINES.register("element")
def element_plan(g: Graph, device: Device, limit: int, ctx: BuildState) -> Plan:
    """The uncalibrated default: element packing, every cast after redistribution.

    The `element` policy: module docstring."""
    return _default_at(g, device, limit, ctx, "element", early_casts=False)[0]


def _default_at(g: Graph, device: Device, limit: int, ctx: BuildState,
                packing: str, early_casts: bool = True) -> tuple[Plan, int]:
    """The default policy's plan under canonical `packing` (casts before
    redistribution where that is estimated cheaper, unless not
    `early_casts`), and its estimate (cycles: Σ trips × each chosen
    recipe's estimate)."""
    sites = [(s.name, s.graph, s.op, s.trips) for s in op_sites(g)]
    # parameter bytes per tile if spread evenly (the shared rotation's aim)
    mean_params = sum(g.tensor(p).nbytes for p in g.parameters) / device.tiles
    free = device.memory_size - device.fixed_bytes - int(PARAM_HEADROOM * mean_params)

    def pick(sub: Graph, op: Op, trips: int, narrow: bool) -> cat.Recipe:
        shortlist = cat.catalogue(sub, op, device, limit, packing, ctx.catalogue, narrow)
        fits = [r for r in shortlist if r.mem_bytes <= free
                and trips * r.home_bytes <= PARAM_HEADROOM * max(mean_params, 1.0)]
        return fits[0] if fits else min(
            shortlist, key=lambda r: (trips * r.home_bytes + r.mem_bytes, r.cycles, r.key))

    early: dict[str, cat.Recipe] = {}  # cast ops run before redistribution
    narrow: set[str] = set()  # ops whose `a` arrives narrow (its cast runs early)
    for name, sub, op, trips in sites:
        readers = _cast_readers(sub, op) if early_casts else []
        if not readers:
            continue
        scope = name[: len(name) - len(op.name)]
        x = sub.tensor(op.inputs[0])
        rows, cols = view2d(x.shape)
        rpo = canonical_rows_per_owner(rows, cols, DTYPE_BYTES[x.dtype], device.element_bytes,
                                       device.tiles, packing)
        cast_r = cat.recipe_from_key(sub, op, device, f"rows:{rpo}", packing, ctx.catalogue)
        after = sum(pick(sub, c, trips, False).cycles for c in readers)
        before = cast_r.cycles + sum(pick(sub, c, trips, True).cycles for c in readers)
        if before < after:
            early[name] = cast_r
            narrow.update(scope + c.name for c in readers)
    chosen: dict[str, str] = {name: r.key for name, r in early.items()}
    total = sum(trips * early[name].cycles for name, _, _, trips in sites if name in early)
    for name, sub, op, trips in sites:
        if op.CONVERSION:
            continue
        r = pick(sub, op, trips, name in narrow)
        chosen[name] = r.key
        total += trips * r.cycles
    casts = {name: "before" if name in early else "after"
             for name, _, op, _ in sites if op.CONVERSION}
    plan = Plan(recipes=tuple(sorted(chosen.items())), cast_order=tuple(sorted(casts.items())),
                packing=packing, row_moves=default_row_moves(device))
    return plan, total


def _cast_readers(g: Graph, op: Op) -> list[Op]:
    """The consumers of conversion `op` (a Cast) when an early cast may pay:
    the cast is absorbable (planner.lowering.lower.absorbable) and every
    consumer reads it as its narrow operand (a matmul's `a`, whose estimate
    knows the wide and the narrow arrival); otherwise []."""
    if not op.CONVERSION or not absorbable(g, op):
        return []
    users = g.consumers(op.outputs[0])
    readers = [u for u in users if u.NARROW_OPERAND is not None
               and getattr(u, u.NARROW_OPERAND) == op.outputs[0]]
    return readers if len(readers) == len(users) else []


def default_row_moves(device: Device) -> int:
    """Rows up to which moving a narrow piece row by row is cheaper than a
    COPY call on a side: a COPY call costs `copy_call` cycles, each row a send
    and a receive control.  0 (always pack) on a device whose transfers cost
    no control cycles: there only the exchange-table bytes count, and packing
    saves them."""
    c = device.costs
    control = c.send_cycles + c.receive_cycles
    return c.copy_call // control if control > 0 else 0


@BASELINES.register("capacity")
def capacity_plan(g: Graph, device: Device, limit: int, ctx: BuildState) -> Plan:
    """Whole-row canonical layouts and each op's least-memory recipe.

    The `capacity` policy: canonical layout = whole rows over as many
    owners as the device has (packing "rows"; no replication, no tail
    padding); each op takes the shortlisted recipe with the least memory
    (its parameter homes for all layers + working memory), then the least
    exchange-landing storage, then the fewest cycles; each Cast takes the
    cast order whose conversions create fewer tensor bytes, measured by
    lowering the graph both ways with the ordinary conversion inserter
    (ties: after).  The memory score is per op, a local estimate: it does not
    prove that the whole program fits."""
    chosen: dict[str, str] = {}
    for site in op_sites(g):
        name, sub, op, trips = site.name, site.graph, site.op, site.trips
        if op.CONVERSION:
            continue
        shortlist = cat.catalogue(sub, op, device, limit, cache=ctx.catalogue)
        pick = min(shortlist, key=lambda r: (trips * r.home_bytes + r.mem_bytes, r.xbytes,
                                             r.cycles, r.key))
        chosen[name] = pick.key
    casts = [(s.name, s.graph, s.op) for s in op_sites(g) if s.op.CONVERSION]
    base = Plan(recipes=tuple(sorted(chosen.items())), packing="rows",
                row_moves=default_row_moves(device))
    after = base.with_cast_orders({name: "after" for name, _, _ in casts})
    before = base.with_cast_orders({name: "before" for name, _, _ in casts})
    mem_after = _conversion_bytes(lower(g, device, after, ctx), casts)
    mem_before = _conversion_bytes(lower(g, device, before, ctx), casts)
    orders = {name: "before" if mem_before[name] < mem_after[name] else "after"
              for name, _, _ in casts}
    return base.with_cast_orders(orders)


def _conversion_bytes(lw: Lowered, casts: list[tuple[str, Graph, Op]]) -> dict[str, int]:
    """Per Cast op: bytes of every value of its input or output tensor (all
    cells and replicas) in a lowering — what that cast's conversions store."""
    out: dict[str, int] = {}
    for name, _, op in casts:
        scope = name[: len(name) - len(op.name)]
        tensors = {scope + op.inputs[0], scope + op.outputs[0]}
        total = 0
        for v in lw.values.values():
            if v.tensor in tensors:
                total += sum(v.layout.tile_bytes(v.elem).values())
        out[name] = total
    return out
