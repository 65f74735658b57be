"""Lower a Graph under a Plan: apply recipe selections, insert explicit conversions.

The result (`Lowered`, types in planner.lowered) is a flat list of `Step`s
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
from collections.abc import Callable
from typing import TYPE_CHECKING

from planner.decide import catalogue as cat
from planner.decide import fusion
from planner.decide.layout import (
    Layout,
    canonical_layout,
    even_cuts,
    grid_tiles,
    row_layout,
    step_cuts,
    view2d,
)
from planner.decide.plan import Plan
from planner.ir.graph import (
    DTYPE_BYTES,
    MOVE_OPS,
    Add,
    BatchMatMul,
    Cast,
    Graph,
    LayerNorm,
    MatMul,
    Op,
    Repeat,
    Tensor,
)
from planner.lowering.lowered import Carry, Lowered, Step, Value, identity_segments
from simulator.device import Device
from tilecommon.errors import BuildFailure, Unsupported

if TYPE_CHECKING:
    from planner.lowering.state import BuildState

__all__ = ["Carry", "Lowered", "Step", "Value", "identity_segments", "lower"]

# LayerNorm gamma/beta homes: chunks of at most this many bytes, on rotating tiles.
VECTOR_CHUNK_BYTES = 256
# a weight block (all layers) is sharded over up to gm readers, one shard per
# this many bytes: balance where it matters, few all-gather transfers (gm² per
# block when fully sharded) where blocks are small
HOME_SHARD_BYTES = 4096


def must_materialise(g: Graph, tensor: str) -> bool:
    """Graph outputs and Repeat inits/finals need a canonical value."""
    if tensor in g.outputs:
        return True
    return any(isinstance(op, Repeat) and tensor in op.init + op.final for op in g.ops)


def absorbable(g: Graph, op: Cast) -> bool:
    """A Cast its consumers' conversions can absorb (cast order "after"): its
    result need not be materialised and every consumer is a compute op."""
    if must_materialise(g, op.out):
        return False
    users = g.consumers(op.out)
    return bool(users) and all(not isinstance(u, (Repeat, Cast, *MOVE_OPS)) for u in users)


def arrives_narrow(g: Graph, op: Op, plan: Plan, scope: str = "") -> bool:
    """True when `op` (in graph `g`, ops named under `scope`) is a MatMul or
    BatchMatMul whose `a` operand is the result of a Cast that `plan` runs
    before redistribution: it arrives as fp8, not as the wide value its
    estimate otherwise assumes (catalogue module docstring)."""
    return isinstance(op, (MatMul, BatchMatMul)) and any(
        isinstance(c, Cast) and c.out == op.a and plan.cast_before(f"{scope}{c.name}")
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
        self.casts: dict[str, tuple[str, Cast]] = {}  # absorbed cast out -> (x, op)
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
            elif isinstance(op, Cast) and self.absorb_cast(g, op):
                self.casts[self.qual(op.out)] = (self.qual(op.x), op)
            else:
                self.lower_compute(g, op)

    def absorb_cast(self, g: Graph, op: Cast) -> bool:
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

    def fused_groups(self, g: Graph) -> dict[str, tuple[MatMul, ...]]:
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

    def lower_fused(self, g: Graph, grp: tuple[MatMul, ...]) -> None:
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

            ins, out, homes = self.grid_layouts(g, op, mc, kc, nc, tile)
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
                ins.append(self.param_value(q, homes[name], lay, g, op))
            else:
                ins.append(self.convert(q, lay, self.periodic(g, op, name)))
        out_t = self.qual(op.outputs[0])
        out_v = self.new_value(out_t, out_layout, suffix=f"@{op.name}")
        return Step("compute", self.qual(op.name), tuple(ins), (out_v,), op, recipe,
                    row_moves=self.plan.row_moves)

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

    def periodic(self, g: Graph, op: Op, name: str) -> tuple:
        """Segments for reading `name` into op's layout (row-periodic Add b)."""
        t = g.tensor(name)
        rows, cols = view2d(t.shape)
        if isinstance(op, Add) and name == op.b and t.shape != g.tensor(op.a).shape:
            total = view2d(g.tensor(op.a).shape)[0]
            return tuple((s, s + rows, 0, 0, 0, cols) for s in range(0, total, rows))
        return identity_segments(rows, cols)

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

    def visible(self, value: str) -> bool:
        """Values made inside a finished loop body are not reused after it."""
        return self.loop_depth > 0 or value not in self.loop_values

    # ------------------------------------------------------------ parameters

    def param_value(self, tensor: str, home: Layout, layout: Layout, g: Graph, op: Op) -> str:
        outer, trips = self.params[tensor]
        t = self.tensors[tensor]
        if outer in self.out.homes:  # a later consumer converts from the first one's home
            hv = self.out.homes[outer]
            home = self.out.values[hv].layout
        else:
            hv = self.add_value(Value(f"home:{outer}", tensor, t.shape, t.dtype, t.scale_exp,
                                      home, "parameter", trips))
            self.out.homes[outer] = hv
        rows, cols = view2d(t.shape)
        segs = identity_segments(rows, cols)
        if isinstance(op, Add):
            segs = self.periodic(g, op, op.b)
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
        """Input layouts (op.inputs order), output layout, parameter homes."""
        if isinstance(op, MatMul):
            return self.matmul_layouts(g, op, r)
        if isinstance(op, BatchMatMul):
            return self.bmm_layouts(g, op, r)
        if isinstance(op, MOVE_OPS):
            return self.heads_layouts(g, op)
        return self.row_layouts(g, op, r)

    def matmul_layouts(self, g: Graph, op: MatMul, r: cat.Recipe):
        m, k = g.tensor(op.a).shape
        n = g.tensor(op.b).shape[1]
        gm, gn, gk = r.grid
        mc, kc, nc = even_cuts(m, gm), even_cuts(k, gk), even_cuts(n, gn)
        gm, gk, gn = len(mc) - 1, len(kc) - 1, len(nc) - 1
        base = self.rotate(gm * gn * gk, self.qual(op.name))
        tl = grid_tiles(base + self.op_shift, gm * gn * gk, self.device.tiles, self.plan)

        def tile(i: int, j: int, l: int) -> int:
            return tl[(i * gn + j) * gk + l]

        return self.grid_layouts(g, op, mc, kc, nc, tile)

    def grid_layouts(self, g: Graph, op: MatMul, mc: tuple[int, ...], kc: tuple[int, ...],
                     nc: tuple[int, ...], tile: Callable[[int, int, int], int]):
        """Matmul layouts (a, b, bias; out; homes) on the grid of cuts `mc` x
        `nc` x `kc` whose cell (i, j, l) runs on `tile(i, j, l)`."""
        m, k = g.tensor(op.a).shape
        n = g.tensor(op.b).shape[1]
        gm, gk, gn = len(mc) - 1, len(kc) - 1, len(nc) - 1
        a = Layout(m, k, mc, kc, tuple(tuple(tile(i, j, l) for j in range(gn))
                                       for i in range(gm) for l in range(gk)))
        b = Layout(k, n, kc, nc, tuple(tuple(tile(i, j, l) for i in range(gm))
                                       for l in range(gk) for j in range(gn)))
        if gk == 1:
            out = Layout(m, n, mc, nc, tuple((tile(i, j, 0),) for i in range(gm)
                                             for j in range(gn)))
            bias_owners = [tuple(tile(i, j, 0) for i in range(gm)) for j in range(gn)]
        else:
            rc = [0]
            slices = []  # (i, l') per output row cell
            for i in range(gm):
                sub = even_cuts(mc[i + 1] - mc[i], gk)
                for s in range(len(sub) - 1):
                    rc.append(mc[i] + sub[s + 1])
                    slices.append((i, s))
            out = Layout(m, n, tuple(rc), nc, tuple((tile(i, j, s),) for i, s in slices
                                                   for j in range(gn)))
            bias_owners = [tuple(tile(i, j, s) for i, s in slices) for j in range(gn)]
        ins = [a, b]
        w = g.tensor(op.b)
        layers = max(1, self.params.get(self.qual(op.b), ("", 0))[1])
        block = b.max_cell_bytes(DTYPE_BYTES[w.dtype]) * layers
        shards = min(gm, max(1, -(-block // HOME_SHARD_BYTES)))
        homes = {op.b: self.sharded_home(b, shards)}
        if op.bias is not None:
            bias = Layout(1, n, (0, 1), nc, tuple(bias_owners))
            ins.append(bias)
            # one replica per column block holds the home, rotating over the
            # readers: biases do not pile onto the i = 0 tiles
            homes[op.bias] = Layout(1, n, (0, 1), nc, tuple(
                (o[j % len(o)],) for j, o in enumerate(bias.owners)))
        return tuple(ins), out, homes

    @staticmethod
    def sharded_home(b: Layout, gm: int) -> Layout:
        """The compact home of a matmul weight: each kernel block (K slice l,
        columns j) split by rows into `gm` shards, shard i on the tile (i, j, l)
        that reads the block — every element once, spread over the grid."""
        rc = [0]
        owners: list[tuple[int, ...]] = []
        for l in range(b.nr):
            r0, r1 = b.row_cuts[l], b.row_cuts[l + 1]
            sub = even_cuts(r1 - r0, gm)
            for s in range(len(sub) - 1):
                rc.append(r0 + sub[s + 1])
                owners.extend((b.owners[l * b.nc + j][s],) for j in range(b.nc))
        return Layout(b.rows, b.cols, tuple(rc), b.col_cuts, tuple(owners))

    def bmm_layouts(self, g: Graph, op: BatchMatMul, r: cat.Recipe):
        a_t, b_t, o_t = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
        bt, m, k = a_t.shape
        n = o_t.shape[2]
        kb = b_t.shape[1]
        if len(r.grid) == 3:
            return self.bmm_split_layouts(op, bt, m, k, n, kb, b_t.shape[2], r.grid[1:])
        bg, gr = r.grid
        groups = even_cuts(bt, -(-bt // bg)) if bg > 1 else tuple(range(bt + 1))
        ng = len(groups) - 1
        sub = even_cuts(m, gr)
        gr = len(sub) - 1
        tl = self.spread(ng * gr)
        rows_a = [0]
        owners = []
        for gi in range(ng):
            if gr == 1:
                rows_a.append(groups[gi + 1] * m)
                owners.append((tl[gi],))
                continue
            for s in range(gr):
                rows_a.append(groups[gi] * m + sub[s + 1])
                owners.append((tl[gi * gr + s],))
        a = Layout(bt * m, k, tuple(rows_a), (0, k), tuple(owners))
        out = Layout(bt * m, n, tuple(rows_a), (0, n), tuple(owners))
        b = Layout(bt * kb, b_t.shape[2], tuple(x * kb for x in groups), (0, b_t.shape[2]),
                   tuple(tuple(tl[gi * gr + s] for s in range(gr)) for gi in range(ng)))
        return (a, b), out, {}

    def bmm_split_layouts(self, op: BatchMatMul, bt: int, m: int, k: int, n: int, kb: int,
                          bcols: int, grid: tuple[int, ...]):
        """bmm:1x<gr>x<gc>: tile (b, s, c) = batch b, row block s, out column
        block c; a cells (b, s) replicated over c, b cells (b, c) (key rows
        for transpose_b, value columns otherwise) replicated over s."""
        sub, nc = even_cuts(m, grid[0]), even_cuts(n, grid[1])
        gr, gc = len(sub) - 1, len(nc) - 1
        tl = self.spread(bt * gr * gc)

        def tile(b: int, s: int, c: int) -> int:
            return tl[(b * gr + s) * gc + c]

        rows_a = (0,) + tuple(b * m + sub[s + 1] for b in range(bt) for s in range(gr))
        a = Layout(bt * m, k, rows_a, (0, k), tuple(
            tuple(tile(b, s, c) for c in range(gc)) for b in range(bt) for s in range(gr)))
        out = Layout(bt * m, n, rows_a, nc, tuple(
            (tile(b, s, c),) for b in range(bt) for s in range(gr) for c in range(gc)))
        b_owners = tuple(tuple(tile(b, s, c) for s in range(gr))
                         for b in range(bt) for c in range(gc))
        if op.transpose_b:  # b is [Bt, N, K]: a column block of out is a row block of b
            rows_b = (0,) + tuple(b * n + nc[c + 1] for b in range(bt) for c in range(gc))
            lay_b = Layout(bt * n, bcols, rows_b, (0, bcols), b_owners)
        else:
            lay_b = Layout(bt * kb, bcols, tuple(b * kb for b in range(bt + 1)), nc, b_owners)
        return (a, lay_b), out, {}

    def spread(self, count: int) -> tuple[int, ...]:
        """Physical tiles of `count` places spread over the device (shifted
        by the op's tile shift)."""
        tiles = self.device.tiles
        return self.plan.physical_tiles(
            ((q * tiles // count + self.op_shift) % tiles for q in range(count)), tiles)

    def heads_layouts(self, g: Graph, op: Op):
        # the redistribution itself is the op: it reads its input where the
        # source value is (canonical, or the producer's layout when that
        # boundary is open; a parameter from its canonical home) and writes
        # the canonical layout of its output
        if self.op_shift:
            raise BuildFailure("lower", -1, 0, 0, f"tile shift of {self.qual(op.name)}: a "
                                                  f"heads op has no placement of its own")
        x = self.qual(op.inputs[0])
        src = self.source.get(x)
        lay = self.out.values[src].layout if src else self.canonical(x)
        homes = {op.inputs[0]: lay} if x in self.params else {}
        return (lay,), self.canonical(self.qual(op.outputs[0])), homes

    def row_layouts(self, g: Graph, op: Op, r: cat.Recipe):
        x_name = op.inputs[0]
        rows, cols = view2d(g.tensor(x_name).shape)
        if len(r.grid) == 2:  # elementwise grid: row blocks × column blocks, spread
            rc, cc = step_cuts(rows, r.grid[0]), even_cuts(cols, r.grid[1])
            n = (len(rc) - 1) * (len(cc) - 1)
            lay = Layout(rows, cols, rc, cc, tuple((t,) for t in self.spread(n)))
        else:
            lay = row_layout(rows, cols, r.grid[0], self.device.tiles, self.plan,
                             self.op_shift)
        homes: dict[str, Layout] = {}
        if isinstance(op, LayerNorm):
            vec = Layout(1, cols, (0, 1), (0, cols), (tuple(o[0] for o in lay.owners),))
            homes[op.gamma] = self.vector_home(cols, DTYPE_BYTES[g.tensor(op.gamma).dtype],
                                               self.qual(op.gamma))
            homes[op.beta] = self.vector_home(cols, DTYPE_BYTES[g.tensor(op.beta).dtype],
                                              self.qual(op.beta))
            return (lay, vec, vec), lay, homes
        if isinstance(op, Add):
            b = g.tensor(op.b)
            if b.kind == "parameter":
                # whole rows over as many tiles as possible (balanced homes);
                # moved into the op's row blocks each time it runs
                brows = view2d(b.shape)[0]
                homes[op.b] = row_layout(brows, cols, -(-brows // self.device.tiles),
                                         self.device.tiles, self.plan)
            return (lay, lay), lay, homes
        return (lay,), lay, homes

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
