"""Per-op whole-device recipes ("mid selections") with estimates.

A `Recipe` is one way to run one op on the whole device, independent of the
plan's tile mapping (so it can be cached by op signature):

- `matmul` (gm, gn, gk): tile (i, j, l) multiplies the a block (rows i, K
  slice l) by the b block (K slice l, columns j).  gk = 1 writes the fp16 out
  block with the bias; gk > 1 writes an fp32 partial that is exchanged to the
  gk row-slice owners of block (i, j) and summed there by REDUCE (+ bias).
  Weights live once (compact home): block (l, j) split by rows over its gm
  readers; gm > 1 all-gathers each block among them every time (gm = 1 is
  weight-stationary).
- `bmm` (bg, gr): attention batched matmul; a tile holds bg batches (gr = 1)
  or a 1/gr row block of one batch, and the other operand's whole head(s);
  (1, gr, gc): a row block × one of gc output column blocks per tile, with
  1/gc of the other operand.
- `rows` (rows_per_owner,): row-parallel LayerNorm/Softmax/GELU/Add/Cast;
  (rows_per_owner, column blocks) for the elementwise GELU/Add/Cast.
- `heads`: SplitHeads/MergeHeads/Broadcast, a redistribution between canonical
  layouts.

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

import math
from dataclasses import dataclass

from planner.decide.layout import canonical_rows_per_owner, view2d
from planner.ir.graph import (
    DTYPE_BYTES,
    MOVE_OPS,
    Add,
    BatchMatMul,
    Cast,
    Gelu,
    Graph,
    LayerNorm,
    MatMul,
    Op,
    Softmax,
)
from simulator.cost import kernel_cycles
from simulator.device import Device
from tilecommon.errors import Unsupported

DEFAULT_LIMIT = 8
# grid extents tried per matmul dimension (then clipped to the dimension)
GRID_STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
# narrowest column block of an elementwise grid recipe
MIN_EW_COLS = 64


@dataclass(frozen=True, order=True)
class Recipe:
    """One whole-device way to run an op.  Units: cycles and bytes per tile."""

    cycles: int
    mem_bytes: int
    key: str
    family: str
    grid: tuple[int, ...]
    compute_cycles: int
    exchange_cycles: int
    syncs: int
    in_bytes: int
    xbytes: int
    tiles: int
    home_bytes: int = 0  # per-tile parameter home bytes of one layer (weights + bias)
    out_bytes: int = 0  # max per-tile bytes sent in one exchange phase (multicast once)


# ------------------------------------------------------------ cycle models


def call_cycles(kernel: str, device: Device, memo: dict | None = None, **named: object) -> int:
    """Cycles of one `kernel` call with named arguments (simulator.cost: the
    simulator's own cycle model; operands in distinct memory elements, dense
    rows), remembered in `memo` (a CatalogueCache's) when given."""
    if memo is None:
        return kernel_cycles(device, kernel, **named)
    key = (kernel, tuple(sorted(named.items())), device)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = kernel_cycles(device, kernel, **named)
    return hit


def matmul_cycles(m: int, k: int, n: int, in_dt: str, out_dt: str, device: Device,
                  bias: bool = False, memo: dict | None = None) -> int:
    return call_cycles("MATMUL", device, memo, M=m, K=k, N=n, in_dtype=in_dt,
                       out_dtype=out_dt, bias=int(bias))


def reduce_cycles(m: int, n: int, k: int, out_dt: str, device: Device,
                  bias: bool = False, memo: dict | None = None) -> int:
    """REDUCE of k fp32 partial blocks m × n into out_dt."""
    return call_cycles("REDUCE", device, memo, M=m, N=n, k=k, out_dtype=out_dt,
                       bias=int(bias))


def exchange_cycles(nbytes: int, device: Device) -> int:
    """One exchange phase landing `nbytes` on the busiest tile."""
    return device.exchange_fixed_cycles + math.ceil(
        nbytes / device.costs.exchange_in_bytes_per_cycle)


def row_kernel_cycles(kind: str, rows: int, cols: int, in_dt: str, out_dt: str,
                      device: Device, memo: dict | None = None) -> int:
    """Cycles of the row kernel of op `kind` on a rows × cols block."""
    if kind == "LayerNorm":
        return call_cycles("LAYERNORM", device, memo, M=rows, N=cols)
    if kind == "Gelu":
        return call_cycles("GELU", device, memo, M=rows, N=cols)
    if kind == "Softmax":
        return call_cycles("SOFTMAX", device, memo, M=rows, N=cols, dtype_x=in_dt,
                           dtype_y=out_dt)
    if kind == "Add":
        return call_cycles("ADD", device, memo, M=rows, N=cols, dtype_a=in_dt, dtype_b=in_dt,
                           dtype_c=out_dt)
    if kind == "Cast":
        return call_cycles("CAST", device, memo, M=rows, N=cols, dtype_x=in_dt, dtype_y=out_dt)
    raise Unsupported(kind, "no row kernel")


# ------------------------------------------------------------ signatures


def op_signature(g: Graph, op: Op) -> tuple:
    """What a recipe depends on: op kind, operand shapes and dtypes, flags."""
    parts: list[object] = [op.kind]
    for name in op.inputs + op.outputs:
        t = g.tensor(name)
        parts.append((t.shape, t.dtype, t.kind == "parameter"))
    if isinstance(op, BatchMatMul):
        parts.append(op.transpose_b)
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
    family, _, rest = key.partition(":")
    try:
        grid = tuple(int(x) for x in rest.split("x")) if rest else ()
    except ValueError:
        raise KeyError(f"op {op.name}: recipe key {key!r} does not parse") from None
    if isinstance(op, MatMul) and family == "mm" and len(grid) == 3:
        a, b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
        (m, k), n = a.shape, b.shape[1]
        gm, gn, gk = grid
        if 1 <= gm <= m and 1 <= gn <= n and 1 <= gk <= k and gm * gn * gk <= device.tiles:
            return _matmul_recipe(gm, gn, gk, m, k, n, a.dtype, out.dtype,
                                  DTYPE_BYTES[a.dtype], DTYPE_BYTES[out.dtype],
                                  op.bias is not None, device, packing, memo, narrow)
    if isinstance(op, (LayerNorm, Gelu, Softmax, Add, Cast)) and family == "rows" \
            and len(grid) in (1, 2):
        rows, cols = view2d(g.tensor(op.inputs[0]).shape)
        gc = grid[1] if len(grid) == 2 else 1
        elementwise = isinstance(op, (Gelu, Add, Cast))
        if 1 <= grid[0] <= rows and 1 <= gc <= cols and (gc == 1 or elementwise) \
                and math.ceil(rows / grid[0]) * gc <= device.tiles:
            return _row_recipes(g, op, device, packing, memo, extra=grid)[-1]
    raise KeyError(f"op {op.name}: no recipe {key!r}")


def _generate(g: Graph, op: Op, device: Device, packing: str,
              memo: dict | None = None, narrow: bool = False) -> list[Recipe]:
    memo = memo if memo is not None else {}
    budget = device.memory_size - device.fixed_bytes
    if isinstance(op, MatMul):
        out = _matmul_recipes(g, op, device, packing, memo, narrow)
    elif isinstance(op, BatchMatMul):
        out = _bmm_recipes(g, op, device, packing, memo, narrow)
    elif isinstance(op, (LayerNorm, Gelu, Softmax, Add, Cast)):
        out = _row_recipes(g, op, device, packing, memo)
    elif isinstance(op, MOVE_OPS):
        out = [_heads_recipe(g, op, device, packing)]
    else:
        raise Unsupported(op.kind, "no catalogue family")
    fits = [r for r in out if r.mem_bytes <= budget]
    return fits or [min(out, key=lambda r: (r.mem_bytes, r.key))]


# ------------------------------------------------------------ families


def _steps(n: int) -> list[int]:
    return sorted({min(s, n) for s in GRID_STEPS})


def _canon_rpo(g: Graph, name: str, device: Device, packing: str) -> int:
    t = g.tensor(name)
    rows, cols = view2d(t.shape)
    return canonical_rows_per_owner(rows, cols, DTYPE_BYTES[t.dtype], device.element_bytes,
                                    device.tiles, packing)


def canonical_bytes(rows: int, cols: int, elem: int, device: Device,
                    packing: str = "element") -> int:
    """Bytes of one canonical owner's row block of a rows × cols tensor of
    `elem`-byte elements under `packing`."""
    rpo = canonical_rows_per_owner(rows, cols, elem, device.element_bytes, device.tiles,
                                   packing)
    return rpo * cols * elem


def _matmul_recipes(g: Graph, op: MatMul, device: Device, packing: str,
                    memo: dict, narrow: bool = False) -> list[Recipe]:
    a, b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    m, k = a.shape
    n = b.shape[1]
    e_in, e_out = DTYPE_BYTES[a.dtype], DTYPE_BYTES[out.dtype]
    tiles = device.tiles
    recipes = []
    for gm in _steps(m):
        for gk in _steps(k):
            if gm * gk > tiles:
                continue
            gn_max = min(n, tiles // (gm * gk))
            for gn in sorted({gn_max, max(1, gn_max // 2), max(1, gn_max // 4), 1}):
                recipes.append(_matmul_recipe(gm, gn, gk, m, k, n, a.dtype, out.dtype,
                                              e_in, e_out, op.bias is not None, device,
                                              packing, memo, narrow))
    return recipes


def _matmul_recipe(gm: int, gn: int, gk: int, m: int, k: int, n: int, in_dt: str, out_dt: str,
                   e_in: int, e_out: int, bias: bool, device: Device,
                   packing: str = "element", memo: dict | None = None,
                   narrow: bool = False) -> Recipe:
    mb, kb, nb = math.ceil(m / gm), math.ceil(k / gk), math.ceil(n / gn)
    a_bytes, b_bytes = mb * kb * e_in, kb * nb * e_in
    # an fp8 a operand arrives as fp16 and is cast on the tile (cast after)
    # unless `narrow` (cast before)
    wide = in_dt == "fp8" and not narrow
    a_wide = mb * kb * 2 if wide else 0
    a_canon = canonical_bytes(m, k, 2 if wide else e_in, device, packing)
    out_canon = canonical_bytes(m, n, e_out, device, packing)
    phases = [max(a_canon, max(a_bytes, a_wide) + (nb * 2 if bias and gm > 1 else 0))]
    mem = a_bytes + a_wide + (b_bytes if gm > 1 else 0)
    xbytes = a_bytes + (b_bytes if gm > 1 else 0)
    if gm > 1:
        phases.append(b_bytes)
    if gk == 1:
        compute = matmul_cycles(mb, kb, nb, in_dt, out_dt, device, bias, memo)
        mem += mb * nb * e_out
        out_block = mb * nb * e_out
    else:
        compute = matmul_cycles(mb, kb, nb, in_dt, "fp32", device, memo=memo)
        slice_rows = math.ceil(mb / gk)
        land = gk * slice_rows * nb * 4
        phases.append(land)
        mem += mb * nb * 4 + land + slice_rows * nb * e_out
        xbytes += land
        compute += reduce_cycles(slice_rows, nb, gk, out_dt, device, bias, memo)
        out_block = slice_rows * nb * e_out
    if wide:
        compute += call_cycles("CAST", device, memo, M=mb, N=kb, dtype_x="fp16",
                               dtype_y="fp8")
    phases.append(max(out_block, out_canon))
    xcyc = sum(exchange_cycles(p, device) for p in phases)
    return Recipe(
        cycles=compute + xcyc, mem_bytes=mem, key=f"mm:{gm}x{gn}x{gk}", family="matmul",
        grid=(gm, gn, gk), compute_cycles=compute, exchange_cycles=xcyc, syncs=len(phases),
        in_bytes=max(phases), xbytes=xbytes, tiles=gm * gn * gk,
        out_bytes=max(mb * nb * (4 if gk > 1 else e_out), math.ceil(kb / gm) * nb * e_in),
        home_bytes=math.ceil(kb / gm) * nb * e_in + (nb * 2 if bias else 0),
    )


def _bmm_recipes(g: Graph, op: BatchMatMul, device: Device, packing: str,
                 memo: dict, narrow: bool = False) -> list[Recipe]:
    a, _b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    bt, m, k = a.shape
    n = out.shape[2]
    e, e_out = DTYPE_BYTES[a.dtype], DTYPE_BYTES[out.dtype]
    # an fp8 a operand arrives wide and is cast on the tile unless `narrow`
    e_a = 2 if a.dtype == "fp8" and not narrow else e
    tiles = device.tiles
    grids = set()
    for gr in _steps(m) + [min(m, tiles // bt)]:
        if gr >= 1 and bt * gr <= tiles:
            grids.add((1, gr))
    for bg in range(1, bt + 1):
        if math.ceil(bt / bg) <= tiles and (bg in (1, 2, 4, 8) or bg == bt
                                             or math.ceil(bt / bg) == tiles):
            grids.add((bg, 1))
    recipes = [_bmm_split_recipe(op, bt, m, k, n, gr, gc, a.dtype, out.dtype, device,
                                 packing, memo, e_a)
               for gc in (2, 4, 8) if gc <= n
               for gr in sorted({min(m, tiles // (bt * gc)), min(m, tiles // (bt * gc)) // 2})
               if gr >= 1]
    for bg, gr in sorted(grids):
        mb = math.ceil(m / gr)
        a_bytes, b_bytes, o_bytes = bg * mb * k * e_a, bg * k * n * e, bg * mb * n * e_out
        compute = call_cycles("BATCH_MATMUL", device, memo, M=mb, K=k, N=n, in_dtype=a.dtype,
                              out_dtype=out.dtype, transpose_b=int(op.transpose_b), batch=bg)
        if e_a != e:
            compute += call_cycles("CAST", device, memo, M=bg * mb, N=k, dtype_x="fp16",
                                   dtype_y=a.dtype)
        phases = [max(a_bytes + b_bytes, canonical_bytes(bt * m, k, e_a, device, packing)),
                  max(o_bytes, canonical_bytes(bt * m, n, e_out, device, packing))]
        xcyc = sum(exchange_cycles(p, device) for p in phases)
        recipes.append(Recipe(
            cycles=compute + xcyc, mem_bytes=a_bytes + b_bytes + o_bytes, key=f"bmm:{bg}x{gr}",
            family="bmm", grid=(bg, gr), compute_cycles=compute, exchange_cycles=xcyc,
            syncs=2, in_bytes=a_bytes + b_bytes, xbytes=a_bytes + b_bytes, out_bytes=o_bytes,
            tiles=math.ceil(bt / bg) * gr,
        ))
    return recipes


def _bmm_split_recipe(op: BatchMatMul, bt: int, m: int, k: int, n: int, gr: int, gc: int,
                      in_dt: str, out_dt: str, device: Device, packing: str,
                      memo: dict, e_a: int = 0) -> Recipe:
    """bmm:1x<gr>x<gc>: one batch's row block × output column block per tile;
    the tile receives only its 1/gc of the other operand (keys for QKᵀ, value
    columns for PV) instead of the whole head.  `e_a`: bytes per element of
    the a operand as it arrives (0: its own dtype's; wider: cast on the tile)."""
    e, e_out = DTYPE_BYTES[in_dt], DTYPE_BYTES[out_dt]
    e_a = e_a or e
    mb, nb = math.ceil(m / gr), math.ceil(n / gc)
    a_bytes, b_bytes, o_bytes = mb * k * e_a, k * nb * e, mb * nb * e_out
    compute = call_cycles("BATCH_MATMUL", device, memo, M=mb, K=k, N=nb, in_dtype=in_dt,
                          out_dtype=out_dt, transpose_b=int(op.transpose_b), batch=1)
    if e_a != e:
        compute += call_cycles("CAST", device, memo, M=mb, N=k, dtype_x="fp16", dtype_y=in_dt)
    phases = [max(a_bytes + b_bytes, canonical_bytes(bt * m, k, e_a, device, packing)),
              max(o_bytes, canonical_bytes(bt * m, n, e_out, device, packing))]
    xcyc = sum(exchange_cycles(p, device) for p in phases)
    return Recipe(
        cycles=compute + xcyc, mem_bytes=a_bytes + b_bytes + o_bytes, key=f"bmm:1x{gr}x{gc}",
        family="bmm", grid=(1, gr, gc), compute_cycles=compute, exchange_cycles=xcyc,
        syncs=2, in_bytes=a_bytes + b_bytes, xbytes=a_bytes + b_bytes, out_bytes=o_bytes,
        tiles=bt * gr * gc,
    )


def _row_recipes(g: Graph, op: LayerNorm | Gelu | Softmax | Add | Cast,
                 device: Device, packing: str, memo: dict, extra: tuple[int, ...] = ()
                 ) -> list[Recipe]:
    """Row-parallel recipes (rows per owner); the elementwise ops (GELU, Add,
    Cast) also get grids of `workers` rows × column blocks, so every worker of
    a tile has a row even when rows are fewer than tiles.  With `extra`, only
    that grid."""
    x_name = op.a if isinstance(op, Add) else op.x
    x, out = g.tensor(x_name), g.tensor(op.outputs[0])
    rows, cols = view2d(x.shape)
    e_in, e_out = DTYPE_BYTES[x.dtype], DTYPE_BYTES[out.dtype]
    canon_in = _canon_rpo(g, x_name, device, packing)
    canon_out = _canon_rpo(g, op.outputs[0], device, packing)
    fastest = math.ceil(rows / device.tiles)
    options = {(canon_in, 1), (canon_out, 1), (fastest, 1)}
    r = fastest
    while r < canon_in:
        options.add((r, 1))
        r *= 2
    if isinstance(op, (Gelu, Add, Cast)):
        for rpo in sorted({min(rows, device.workers), min(rows, 2 * device.workers)}):
            owners = math.ceil(rows / rpo)
            gc = min(cols // MIN_EW_COLS, device.tiles // owners)
            if gc > 1:
                options.add((rpo, gc))
    if extra:
        options = {extra if len(extra) == 2 else (extra[0], 1)}
    n_in = 2 if isinstance(op, Add) else 1
    pbytes = 2 * cols * 2 if isinstance(op, LayerNorm) else 0
    recipes = []
    for rpo, gc in sorted(options):
        w = math.ceil(cols / gc)
        compute = row_kernel_cycles(op.kind, rpo, w, x.dtype, out.dtype, device, memo)
        in_b, out_b = n_in * rpo * w * e_in, rpo * w * e_out
        phases = []
        if (rpo, gc) != (canon_in, 1):
            phases.append(max(in_b, n_in * canon_in * cols * e_in))
        if pbytes:
            phases.append(pbytes)
        if (rpo, gc) != (canon_out, 1):
            phases.append(max(out_b, canon_out * cols * e_out))
        xcyc = sum(exchange_cycles(p, device) for p in phases)
        recipes.append(Recipe(
            cycles=compute + xcyc, mem_bytes=in_b + out_b + pbytes,
            key=f"rows:{rpo}" if gc == 1 else f"rows:{rpo}x{gc}",
            family="rows", grid=(rpo,) if gc == 1 else (rpo, gc), compute_cycles=compute,
            exchange_cycles=xcyc, syncs=len(phases), in_bytes=max(phases, default=0),
            out_bytes=out_b if (rpo, gc) != (canon_out, 1) else 0,
            xbytes=(in_b if (rpo, gc) != (canon_in, 1) else 0) + pbytes,
            tiles=math.ceil(rows / rpo) * gc,
        ))
    return recipes


def _heads_recipe(g: Graph, op: Op, device: Device,
                  packing: str) -> Recipe:
    out = g.tensor(op.outputs[0])
    rpo = _canon_rpo(g, op.outputs[0], device, packing)
    cols = view2d(out.shape)[1]
    nbytes = rpo * cols * DTYPE_BYTES[out.dtype]
    xcyc = exchange_cycles(nbytes, device)
    return Recipe(cycles=xcyc, mem_bytes=nbytes, key="heads", family="heads", grid=(),
                  compute_cycles=0, exchange_cycles=xcyc, syncs=1, in_bytes=nbytes,
                  out_bytes=nbytes,
                  xbytes=nbytes, tiles=math.ceil(view2d(out.shape)[0] / rpo))
