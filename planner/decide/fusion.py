"""Fused sibling matmuls: MatMuls that read the same input run as one recipe.

Siblings (`sibling_groups`) are the MatMuls of one graph (a Repeat body is
its own graph) that read the same activation `a`, with weights of the same
shape, dtype and scale, all with a bias or none and the same partials: an attention layer's q,
k, v projections, the MAP head's k, v.  A group is named by its key,
`<scope><first op>+<second op>+...` (`group_key`, e.g.
`encoder/mm_q+mm_k+mm_v`); `Plan.fused` lists the keys of the groups that
run fused.

A fused group runs under one recipe of the concatenated matmul
`a [M, K] @ [w_1 | w_2 | ...] [K, n·N]` (`fused_graph`): its grid (gm, gN,
gk) covers the group's columns, gN a multiple of n so that member x owns the
column blocks x·gN/n ... (x+1)·gN/n - 1 (`fused_recipe`).  Lowering places
the members on that one grid (one rotation base for the group), converts
`a` once into the layout every column block's tiles read, and gives each
member's weight and bias homes the tiles of its own column blocks; the
graph keeps the architecture's ops, each member its own steps and outputs.
The panel cost model is why it pays: each tile gets more rows of the same
panels (catalogue estimates for siglip's q, k, v at batch 1: 3 x 32,121
cycles apart, 63,886 fused).
"""

from __future__ import annotations

from typing import cast

from planner.decide import catalogue as cat
from planner.ir.graph import Graph, Tensor, make_graph
from planner.ir.ops.matmul import MatMul
from simulator.device import Device

# shortlist length searched for a fused grid whose column blocks divide among the members
FUSED_LIMIT = 32


def sibling_groups(g: Graph) -> tuple[tuple[MatMul, ...], ...]:
    """Groups (in op order, each of two or more) of sibling MatMuls of `g`
    (module docstring); a Repeat body's ops are not looked at."""
    by_input: dict[tuple, list[MatMul]] = {}
    for op in g.ops:
        if op.FAMILY != "matmul":
            continue
        op = cast(MatMul, op)  # the matmul family's one kind
        w = g.tensor(op.b)
        if w.kind != "parameter" or (op.bias is not None and g.tensor(op.bias).kind
                                     != "parameter"):
            continue
        key = (op.a, w.shape, w.dtype, w.scale_exp, op.bias is None,
               g.tensor(op.out).dtype, op.partials)
        by_input.setdefault(key, []).append(op)
    return tuple(tuple(ops) for ops in by_input.values() if len(ops) > 1)


def group_key(scope: str, ops: tuple[MatMul, ...]) -> str:
    return scope + "+".join(op.name for op in ops)


def fused_graph(g: Graph, ops: tuple[MatMul, ...]) -> tuple[Graph, MatMul]:
    """The concatenated matmul of a sibling group, as a one-op graph the
    catalogue can cost."""
    first = ops[0]
    a, w = g.tensor(first.a), g.tensor(first.b)
    n = w.shape[1] * len(ops)
    out = g.tensor(first.out)
    tensors = [Tensor("a", a.shape, a.dtype, "input", a.scale_exp),
               Tensor("w", (w.shape[0], n), w.dtype, "parameter", w.scale_exp),
               Tensor("out", (a.shape[0], n), out.dtype, "output")]
    bias = None
    if first.bias is not None:
        bias = "bias"
        tensors.append(Tensor("bias", (n,), g.tensor(first.bias).dtype, "parameter"))
    op = MatMul("+".join(o.name for o in ops), "a", "w", "out", bias=bias,
                partials=first.partials)
    return make_graph(op.name, tensors, [op], ["a"], ["out"]), op


def fused_recipe(g: Graph, ops: tuple[MatMul, ...], device: Device,
                 cache: cat.CatalogueCache, key: str | None = None,
                 packing: str = "element", narrow: bool = False) -> cat.Recipe | None:
    """The recipe a fused group runs under: `key` when given (KeyError if
    unknown), else the best shortlisted grid whose column blocks divide
    among the members, else the best grid with its column blocks rounded
    down to a multiple of the members; None when that is not a valid grid.
    Estimated against canonical `packing`, the shared input arriving narrow
    when `narrow` (catalogue module docstring)."""
    fg, fop = fused_graph(g, ops)
    if key is not None:
        return cat.recipe_from_key(fg, fop, device, key, packing, cache, narrow)
    n = len(ops)
    short = cat.catalogue(fg, fop, device, FUSED_LIMIT, packing, cache, narrow)
    for r in short:
        gm, gn, gk = r.grid
        if gn % n == 0 and gn // n <= g.tensor(ops[0].b).shape[1]:
            return r
    gm, gn, gk = short[0].grid  # the best grid, its column blocks rounded down to n·x
    try:
        return cat.recipe_from_key(fg, fop, device, f"mm:{gm}x{max(n, gn // n * n)}x{gk}",
                                   packing, cache, narrow)
    except KeyError:
        return None
