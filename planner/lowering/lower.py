"""Lower a Graph under a Plan: apply recipe selections, insert explicit conversions.

The result (`Lowered`, types in planner.lowering.lowered) is a flat list of `Step`s
over `Value`s — a tensor materialised in one layout and dtype — that expand
turns into per-tile work:

- `compute`: one op under its recipe; its inputs are values in the recipe's
  input layouts, its output a value in the recipe's output layout;
- `redistribute`: move a value into another layout (`segments` map
  destination rows/columns to source rows/columns: identity, SplitHeads,
  MergeHeads, the row-periodic position embedding);
- `cast`: CAST every cell (and replica) of a value in place (same layout);
- `loop_begin` / `loop_end`: the Repeat body, lowered once.

Recipe layouts: MatMul (gm, gn, gk) on a grid of tiles from the shared
rotation (a: cells (i, l) replicated over j; b: cells (l, j) replicated over
i; out: (i, j), or gk row slices of (i, j) when K is split); BatchMatMul
(bg, gr) spread over the device (the other operand's head(s) replicated on
the gr row-block tiles); row ops in row blocks (elementwise ops also in row
× column blocks); SplitHeads/MergeHeads read where their source is and
write the canonical layout.

Policy (baseline `default`, Plan-controlled):
- every activation has a canonical value (layout.canonical_layout) unless its
  boundary is open; consumers convert from the canonical value (or, when the
  boundary is open, straight from the producer's value);
- a graph Cast is absorbed into its consumers' conversions ("after": move the
  wide value, then cast on the consumer's tiles) unless the plan says
  "before" or its result must be materialised (graph output, Repeat
  yield/final); then it is a row-parallel compute op;
- parameters live in compact homes (each element once) on tiles given by one
  shared rotation that advances over the tiles of each parameterised op in
  program order.  A matmul weight block (K slice l, columns j; all layers)
  is split by rows into min(gm, ceil(bytes / HOME_SHARD_BYTES)) shards,
  shard i on tile (i, j, l) — the gm tiles that read the block all-gather it
  before the matmul — so large weights spread evenly over the grid; a bias
  column block lives on one of its readers (rotating); LayerNorm vectors are
  chunked (VECTOR_CHUNK_BYTES) over rotating tiles; a row op's 2-D parameter
  (the position embedding) in whole rows over as many tiles as possible.
  The first consumer fixes the home; later consumers convert from it;
- a group of sibling matmuls in `Plan.fused` (planner.decide.fusion) is
  lowered at its first member's place on one grid: the shared input in one
  layout read by every column block's tiles, member x on column blocks
  x·gn ..., its homes on its own tiles, the members' steps marked
  `Step.fused` (expand interleaves their phases);
- an op in `Plan.tile_shift` is placed that many logical tiles further on
  (row blocks, spread grids, the matmul grid from its rotation base +
  shift, with the weight and bias homes on its readers); the rotation
  continues from the unshifted base, so nothing else moves;
- Repeat: the body's arguments and yields are canonical values whose storage
  expand binds to a ping-pong pair (`Carry`); iterated parameters have
  `trips` > 0 on their home value (a sequence of per-layer blocks).

Raises `Unsupported` for graph shapes outside this policy (named op and
reason) and `BuildFailure(stage="lower")` when a recipe key is unknown or a
tile shift names an op that lowering does not place (a heads op, an
absorbed Cast, no such op).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from planner.decide import catalogue as cat
from planner.decide import fusion
from planner.decide.layout import (
    Layout,
    canonical_layout,
    even_cuts,
    grid_tiles,
    view2d,
)
from planner.decide.plan import Plan
from planner.ir.graph import DTYPE_BYTES, Graph, Op, Repeat, Tensor
from planner.ir.opkind import MoveOp, Segment
from planner.lowering import families as _families  # noqa: F401  (registers the placements)
from planner.lowering.families.matmul import grid_layouts
from planner.lowering.families.rows import operand_segments
from planner.lowering.lowered import Carry, Lowered, Step, Value, identity_segments
from planner.lowering.placement import PLACEMENTS
from simulator.device import Device
from tilecommon.errors import BuildFailure, Unsupported

if TYPE_CHECKING:
    from planner.lowering.state import BuildState

__all__ = ["Carry", "Lowered", "Step", "Value", "identity_segments", "lower"]

# LayerNorm gamma/beta homes: chunks of at most this many bytes, on rotating tiles.
VECTOR_CHUNK_BYTES = 256


def must_materialise(g: Graph, tensor: str) -> bool:
    """Graph outputs and Repeat inits/finals need a canonical value."""
    if tensor in g.outputs:
        return True
    return any(isinstance(op, Repeat) and tensor in op.init + op.final for op in g.ops)


def moves_only(op: Op) -> bool:
    """A consumer that cannot absorb a conversion: a Repeat, another
    conversion or a move op."""
    return isinstance(op, Repeat) or op.CONVERSION or op.FAMILY == "move"


def absorbable(g: Graph, op: Op) -> bool:
    """A Cast its consumers' conversions can absorb (cast order "after"): its
    result need not be materialised and every consumer is a compute op."""
    if must_materialise(g, op.outputs[0]):
        return False
    users = g.consumers(op.outputs[0])
    return bool(users) and all(not moves_only(u) for u in users)


def arrives_narrow(g: Graph, op: Op, plan: Plan, scope: str = "") -> bool:
    """True when `op` (in graph `g`, ops named under `scope`) has a narrow
    operand (`NARROW_OPERAND`: a matmul's `a`) that is the result of a
    conversion `plan` runs before redistribution: it arrives as fp8, not as
    the wide value its estimate otherwise assumes (catalogue module
    docstring)."""
    if op.NARROW_OPERAND is None:
        return False
    x = getattr(op, op.NARROW_OPERAND)
    return any(c.CONVERSION and c.outputs[0] == x and plan.cast_before(f"{scope}{c.name}")
               for c in g.ops)


class _Lowerer:
    def __init__(self, g: Graph, device: Device, plan: Plan,
                 cache: cat.CatalogueCache) -> None:
        self.g = g
        self.cache = cache
        self.device = device
        self.plan = plan
        self.out = Lowered()
        self.tensors: dict[str, Tensor] = {}
        self.source: dict[str, str] = {}  # tensor -> value consumers convert from
        self.casts: dict[str, tuple[str, Op]] = {}  # absorbed conversion out -> (x, op)
        self.params: dict[str, tuple[str, int]] = {}  # tensor -> (outer param, trips)
        self.rotation = 0
        self.converted: dict[tuple, str] = {}
        self.scope = ""
        self.loop_depth = 0
        self.loop_values: set[str] = set()
        self.op_shift = 0  # logical tile shift of the op being lowered
        self.shifted: set[str] = set()  # ops whose placement honoured a shift
        self.fused_found: set[str] = set()  # Plan.fused groups lowering found

    # ------------------------------------------------------------ values

    def add_value(self, v: Value) -> str:
        if v.name in self.out.values:
            raise AssertionError(f"duplicate value {v.name}")
        self.out.values[v.name] = v
        if self.loop_depth:
            self.loop_values.add(v.name)
        return v.name

    def canonical(self, tensor: str, dtype: str | None = None) -> Layout:
        t = self.tensors[tensor]
        d = dtype or t.dtype
        return canonical_layout(t.shape, DTYPE_BYTES[d], self.device.element_bytes,
                                self.device.tiles, self.plan)

    def new_value(self, tensor: str, layout: Layout, dtype: str | None = None,
                  role: str = "activation", suffix: str = "") -> str:
        t = self.tensors[tensor]
        d = dtype or t.dtype
        scale = t.scale_exp if d == t.dtype else 0
        base = f"{tensor}{suffix}"
        name, k = base, 1
        while name in self.out.values:
            k += 1
            name = f"{base}#{k}"
        return self.add_value(Value(name, tensor, t.shape, d, scale, layout, role))

    # ------------------------------------------------------------ entry

    def run(self) -> Lowered:
        g = self.g
        for t in g.tensors:
            self.tensors[t.name] = t
        for name in g.inputs:
            v = self.new_value(name, self.canonical(name), role="input")
            self.source[name] = v
            self.out.inputs[name] = v
        for p in g.parameters:
            self.params[p] = (p, 0)
        self.lower_ops(g, g.ops)
        for name in g.outputs:
            self.out.outputs[name] = self.source[name]
        for key in self.plan.fused:
            if key not in self.fused_found:
                raise BuildFailure("lower", -1, 0, 0, f"fused group {key}: no such sibling "
                                                      f"matmuls (planner.decide.fusion)")
        for op, _ in self.plan.tile_shift:
            if op not in self.shifted:
                raise BuildFailure("lower", -1, 0, 0,
                                   f"tile shift of {op}: lowering places no op of that name "
                                   f"(heads ops and absorbed casts have no placement)")
        return self.out

    def qual(self, name: str) -> str:
        return f"{self.scope}{name}"

    def lower_ops(self, g: Graph, ops: tuple[Op, ...]) -> None:
        groups = self.fused_groups(g)
        done: set[str] = set()
        for op in ops:
            if op.name in done:
                continue  # a fused sibling, lowered with its group's first op
            if op.name in groups:
                self.lower_fused(g, groups[op.name])
                done.update(o.name for o in groups[op.name])
            elif isinstance(op, Repeat):
                self.lower_repeat(g, op)
            elif op.CONVERSION and self.absorb_cast(g, op):
                self.casts[self.qual(op.outputs[0])] = (self.qual(op.inputs[0]), op)
            else:
                self.lower_compute(g, op)

    def absorb_cast(self, g: Graph, op: Op) -> bool:
        return not self.plan.cast_before(self.qual(op.name)) and absorbable(g, op)

    # ------------------------------------------------------------ ops

    def recipe_of(self, g: Graph, op: Op) -> cat.Recipe:
        # the first shortlisted recipe is the best estimate whatever the
        # shortlist's length, so the build needs no search parameter; recipes
        # are estimated against the plan's canonical packing and cast orders
        # (an op the plan names no recipe for, a materialised Cast, runs where
        # the moves are fewest under the layouts the plan really has)
        packing = self.plan.packing
        narrow = arrives_narrow(g, op, self.plan, self.scope)
        shortlist = cat.catalogue(g, op, self.device, cat.DEFAULT_LIMIT, packing,
                                  cache=self.cache, narrow=narrow)
        key = self.plan.recipe(self.qual(op.name))
        if key is None:
            return shortlist[0]
        for r in shortlist:
            if r.key == key:
                return r
        try:
            return cat.recipe_from_key(g, op, self.device, key, packing, cache=self.cache,
                                       narrow=narrow)
        except KeyError:
            raise BuildFailure("lower", -1, 0, 0,
                               f"op {self.qual(op.name)}: unknown recipe {key!r}") from None

    def lower_compute(self, g: Graph, op: Op) -> None:
        recipe = self.recipe_of(g, op)
        self.op_shift = self.plan.shift(self.qual(op.name)) % self.device.tiles
        if self.op_shift:
            self.shifted.add(self.qual(op.name))
        in_layouts, out_layout, homes = self.recipe_layouts(g, op, recipe)
        self.op_shift = 0
        self.emit_compute(g, op, recipe, in_layouts, out_layout, homes)

    def fused_groups(self, g: Graph) -> dict[str, tuple[Any, ...]]:
        """First op name -> sibling group, for the groups of `g` the plan fuses."""
        if not self.plan.fused:
            return {}
        out = {}
        for grp in fusion.sibling_groups(g):
            key = fusion.group_key(self.scope, grp)
            if self.plan.is_fused(key):
                out[grp[0].name] = grp
                self.fused_found.add(key)
        return out

    def lower_fused(self, g: Graph, grp: tuple[Any, ...]) -> None:
        """A sibling group on one grid (planner.decide.fusion): `a` in one
        layout read by every column block's tiles, member x on the column
        blocks x·gn ... of the group's rotation base."""
        key = self.qual(fusion.group_key("", grp))
        try:
            r = fusion.fused_recipe(g, grp, self.device, self.cache, self.plan.recipe(key))
        except KeyError:
            raise BuildFailure("lower", -1, 0, 0, f"fused group {key}: unknown recipe "
                                                  f"{self.plan.recipe(key)!r}") from None
        if r is None or r.grid[1] % len(grp):
            raise BuildFailure("lower", -1, 0, 0, f"fused group {key}: no grid whose column "
                                                  f"blocks divide among {len(grp)} matmuls")
        m, k = g.tensor(grp[0].a).shape
        n = g.tensor(grp[0].b).shape[1]
        mc, kc = even_cuts(m, r.grid[0]), even_cuts(k, r.grid[2])
        nc = even_cuts(n, r.grid[1] // len(grp))
        gm, gk, gn = len(mc) - 1, len(kc) - 1, len(nc) - 1
        g_cols = gn * len(grp)
        base = self.rotate(gm * g_cols * gk, key)
        tl = grid_tiles(base, gm * g_cols * gk, self.device.tiles, self.plan)
        a = Layout(m, k, mc, kc, tuple(tuple(tl[(i * g_cols + j) * gk + l]
                                             for j in range(g_cols))
                                       for i in range(gm) for l in range(gk)))
        steps = []
        for x, op in enumerate(grp):  # every member's inputs, then the computes, then
            def tile(i: int, j: int, l: int, x: int = x) -> int:  # the outputs: the
                return tl[(i * g_cols + x * gn + j) * gk + l]  # computes share one step

            ins, out, homes = grid_layouts(self, g, op, mc, kc, nc, tile)
            recipe = cat.recipe_from_key(g, op, self.device, f"mm:{gm}x{gn}x{gk}",
                                         cache=self.cache)
            step = self.compute_step(g, op, recipe, (a, *ins[1:]), out, homes)
            steps.append(dataclasses.replace(step, fused=key))
        self.out.steps.extend(steps)
        for op, step in zip(grp, steps, strict=True):
            self.publish(g, op.outputs[0], step.outputs[0])

    def emit_compute(self, g: Graph, op: Op, recipe: cat.Recipe, in_layouts: tuple,
                     out_layout: Layout, homes: dict[str, Layout]) -> None:
        """The compute step of `op` under `recipe` and the conversions of its
        inputs into `in_layouts`; publishes its output."""
        step = self.compute_step(g, op, recipe, in_layouts, out_layout, homes)
        self.out.steps.append(step)
        self.publish(g, op.outputs[0], step.outputs[0])

    def compute_step(self, g: Graph, op: Op, recipe: cat.Recipe, in_layouts: tuple,
                     out_layout: Layout, homes: dict[str, Layout]) -> Step:
        """The conversions of `op`'s inputs into `in_layouts` (appended) and
        its compute step (returned, not yet appended)."""
        ins = []
        for name, lay in zip(op.inputs, in_layouts, strict=True):
            q = self.qual(name)
            if q in self.params:
                ins.append(self.param_value(q, homes[name], lay, g, op, name))
            else:
                ins.append(self.convert(q, lay, operand_segments(g, op, name)))
        out_t = self.qual(op.outputs[0])
        out_v = self.new_value(out_t, out_layout, suffix=f"@{op.name}")
        segments: tuple[Segment, ...] = op.segments(g) if isinstance(op, MoveOp) else ()
        return Step("compute", self.qual(op.name), tuple(ins), (out_v,), op, recipe,
                    segments=segments, row_moves=self.plan.row_moves)

    def publish(self, g: Graph, name: str, value: str) -> None:
        """Make `value` (the producer's layout) the source of tensor `name`:
        directly when its boundary is open, else via its canonical value."""
        q = self.qual(name)
        if self.plan.is_open(q) and not must_materialise(g, name) and \
                name not in g.outputs:
            self.source[q] = value
            return
        canon = self.canonical(q)
        v = self.out.values[value]
        if v.layout == canon:
            self.source[q] = value
            return
        role = "output" if name in self.g.outputs and not self.scope else "canonical"
        cv = self.new_value(q, canon, role=role)
        rows, cols = view2d(v.shape)
        self.out.steps.append(Step("redistribute", f"canon {q}", (value,), (cv,),
                                   segments=identity_segments(rows, cols),
                                   row_moves=self.plan.row_moves))
        self.source[q] = cv

    def convert(self, tensor: str, layout: Layout, segments: tuple) -> str:
        """A value of `tensor` in `layout`, converting from its source (and
        casting after the move when `tensor` is an absorbed cast output)."""
        key = (tensor, layout, segments)
        if key in self.converted and self.visible(self.converted[key]):
            return self.converted[key]
        if tensor in self.casts:
            x, cop = self.casts[tensor]
            wide = self.convert(x, layout, segments)
            out = self.new_value(tensor, layout, suffix=f"@{len(self.out.values)}")
            self.out.steps.append(Step("cast", f"{self.qual(cop.name)}", (wide,), (out,), cop))
        else:
            src = self.source[tensor]
            sv = self.out.values[src]
            if sv.layout == layout and segments == identity_segments(*view2d(sv.shape)):
                out = src
            else:
                out = self.new_value(tensor, layout, suffix=f"@{len(self.out.values)}")
                self.out.steps.append(Step("redistribute", f"to {out}", (src,), (out,),
                                           segments=segments, row_moves=self.plan.row_moves))
        self.converted[key] = out
        return out

    def arriving_layout(self, tensor: str) -> Layout:
        """The layout tensor `tensor` (of the scope being lowered) arrives in:
        its source value's (the producer's when the boundary is open, else
        the canonical one); an absorbed cast's output is cast where it is
        read, so it arrives where the value it converts does."""
        q = self.qual(tensor)
        while q in self.casts:
            q = self.casts[q][0]
        src = self.source.get(q)
        return self.canonical(q) if src is None else self.out.values[src].layout

    def visible(self, value: str) -> bool:
        """Values made inside a finished loop body are not reused after it."""
        return self.loop_depth > 0 or value not in self.loop_values

    # ------------------------------------------------------------ parameters

    def param_value(self, tensor: str, home: Layout, layout: Layout, g: Graph, op: Op,
                    name: str) -> str:
        """A value of parameter `tensor` (qualified; `name` in graph `g`) in
        `layout` for `op`, moved from its home (made here by the first
        consumer)."""
        outer, trips = self.params[tensor]
        t = self.tensors[tensor]
        if outer in self.out.inputs:  # a graph input bound into a Repeat body (a mask)
            return self.convert(outer, layout, operand_segments(g, op, name))
        if outer in self.out.homes:  # a later consumer converts from the first one's home
            hv = self.out.homes[outer]
            home = self.out.values[hv].layout
        else:
            hv = self.add_value(Value(f"home:{outer}", tensor, t.shape, t.dtype, t.scale_exp,
                                      home, "parameter", trips))
            self.out.homes[outer] = hv
        segs = operand_segments(g, op, name)
        if home == layout and len(segs) == 1:
            return hv
        out = self.new_value(tensor, layout, suffix=f"@{op.name}")
        self.out.steps.append(Step("redistribute", f"param {outer}", (hv,), (out,),
                                   segments=segs, row_moves=self.plan.row_moves))
        return out

    def rotate(self, count: int, key: str) -> int:
        """Logical start tile of `count` rotating tiles for `key` (a
        parameterised op or parameter): the plan's pinned base if it has one
        (the optimizer pins unaffected homes), else the shared rotation."""
        pinned = self.plan.rotation_base(key)
        base = self.rotation if pinned is None else pinned
        self.rotation = (base + count) % self.device.tiles
        self.out.rotation[key] = base
        return base

    def vector_home(self, n: int, elem: int, key: str) -> Layout:
        chunks = max(1, min(self.device.tiles, -(-n * elem // VECTOR_CHUNK_BYTES)))
        cuts = even_cuts(n, chunks)
        tiles = grid_tiles(self.rotate(len(cuts) - 1, key), len(cuts) - 1, self.device.tiles,
                           self.plan)
        return Layout(1, n, (0, 1), cuts, tuple((t,) for t in tiles))

    # ------------------------------------------------------------ recipe layouts

    def recipe_layouts(self, g: Graph, op: Op, r: cat.Recipe
                       ) -> tuple[tuple[Layout, ...], Layout, dict[str, Layout]]:
        """Input layouts (op.inputs order), output layout, parameter homes:
        the placement of the op's family (planner.lowering.families)."""
        return PLACEMENTS[op.FAMILY].layouts(self, g, op, r)

    def spread(self, count: int) -> tuple[int, ...]:
        """Physical tiles of `count` places spread over the device (shifted
        by the op's tile shift)."""
        tiles = self.device.tiles
        return self.plan.physical_tiles(
            ((q * tiles // count + self.op_shift) % tiles for q in range(count)), tiles)

    # ------------------------------------------------------------ Repeat

    def lower_repeat(self, g: Graph, op: Repeat) -> None:
        if self.scope:
            raise Unsupported(op.name, "nested Repeat")
        body = op.body
        prefix = f"{op.name}/"
        for t in body.tensors:
            self.tensors[prefix + t.name] = t
        for outer, inner in op.iterated:
            self.params[prefix + inner] = (outer, op.trips)
        for outer, inner in op.invariant:
            self.params[prefix + inner] = (outer, 0)
        carries = []
        for init, arg in zip(op.init, op.arguments, strict=True):
            src = self.source[init]
            sv = self.out.values[src]
            if sv.role not in ("canonical", "activation") or len(g.consumers(init)) != 1:
                raise Unsupported(op.name, f"init {init} must be an activation read only by "
                                           f"the Repeat")
            if sv.layout != self.canonical(init):
                raise AssertionError(f"init {init} is not canonical")
            av = self.new_value(prefix + arg, sv.layout, role="canonical")
            self.source[prefix + arg] = av
            carries.append([src, av])
        self.out.steps.append(Step("loop_begin", op.name, trips=op.trips))
        self.scope = prefix
        self.loop_depth += 1
        self.lower_ops(body, body.ops)
        self.loop_depth -= 1
        self.scope = ""
        self.out.steps.append(Step("loop_end", op.name, trips=op.trips))
        for (src, av), yld, fin in zip(carries, op.yields, op.final, strict=True):
            yv = self.source[prefix + yld]
            yval = self.out.values[yv]
            if yval.layout != self.out.values[av].layout or yv == av:
                raise Unsupported(op.name, f"yield {yld} is not a fresh canonical value")
            fv = self.new_value(fin, yval.layout, role="canonical")
            self.source[fin] = fv
            self.out.carries.append(Carry(src, av, yv, fv, op.trips))


def lower(g: Graph, device: Device, plan: Plan, state: BuildState | None = None) -> Lowered:
    """Lower `g` for `device` under `plan` (module docstring).  With a build
    `state`, the result is remembered by content and shared by every caller
    with equal arguments: it must not be mutated."""
    if state is None:
        return _Lowerer(g, device, plan, cat.CatalogueCache()).run()
    key = (g, device, plan)
    hit = state.lowerings.get(key)
    if hit is None:
        hit = _Lowerer(g, device, plan, state.catalogue).run()
        state.lowerings.put(key, hit)
    return hit
