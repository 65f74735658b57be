"""The "matmul" recipe family: `mm:<gm>x<gn>x<gk>` grids for MatMul.

Tile (i, j, l) multiplies the a block (rows i, K slice l) by the b block (K
slice l, columns j).  gk = 1 writes the fp16 out block with the bias; gk > 1
writes a partial (the op's `partials` dtype: fp16 or fp32) that is exchanged
to the gk row-slice owners of block (i, j) and summed there by REDUCE
(+ bias).  Weights live once (compact home): block (l, j) split by rows over
its gm readers; gm > 1 all-gathers each block among them every time (gm = 1
is weight-stationary).  The estimate is
planner.decide.catalogue's (module docstring): kernel cycles plus one
exchange phase per move, an fp8 `a` arriving wide (cast on the tile) unless
`narrow`.
"""

from __future__ import annotations

import math
from typing import Any

from planner.decide.layout import even_cuts, pairs_rows
from planner.decide.recipe import (
    Recipe,
    call_cycles,
    canonical_bytes,
    exchange_cycles,
    grid_steps,
    matmul_cycles,
    reduce_cycles,
    register_family,
)
from planner.ir.graph import DTYPE_BYTES, Graph, Op
from simulator.device import Device


@register_family("matmul")
class MatmulFamily:
    """Recipes of the matmul family (module docstring)."""

    def generate(self, g: Graph, op: Op, device: Device, packing: str, memo: dict,
                 narrow: bool) -> list[Recipe]:
        return matmul_recipes(g, op, device, packing, memo, narrow)

    def from_key(self, g: Graph, op: Op, device: Device, key: str, packing: str, memo: dict,
                 narrow: bool) -> Recipe | None:
        family, _, rest = key.partition(":")
        try:
            grid = tuple(int(x) for x in rest.split("x")) if rest else ()
        except ValueError:
            return None
        if family != "mm" or len(grid) != 3:
            return None
        mm: Any = op
        a, b, out = g.tensor(mm.a), g.tensor(mm.b), g.tensor(mm.out)
        (m, k), n = a.shape, b.shape[1]
        gm, gn, gk = grid
        if not (1 <= gm <= m and 1 <= gn <= n and 1 <= gk <= k
                and gm * gn * gk <= device.tiles):
            return None
        return matmul_recipe(gm, gn, gk, m, k, n, a.dtype, out.dtype, DTYPE_BYTES[a.dtype],
                             DTYPE_BYTES[out.dtype], mm.bias is not None, device, packing,
                             memo, narrow, mm.partials)


def matmul_recipes(g: Graph, op: Any, device: Device, packing: str,
                    memo: dict, narrow: bool = False) -> list[Recipe]:
    a, b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    m, k = a.shape
    n = b.shape[1]
    e_in, e_out = DTYPE_BYTES[a.dtype], DTYPE_BYTES[out.dtype]
    tiles = device.tiles
    recipes = []
    for gm in grid_steps(m):
        for gk in grid_steps(k):
            if gm * gk > tiles:
                continue
            gn_max = min(n, tiles // (gm * gk))
            for gn in sorted({gn_max, max(1, gn_max // 2), max(1, gn_max // 4), 1}):
                recipes.append(matmul_recipe(gm, gn, gk, m, k, n, a.dtype, out.dtype,
                                              e_in, e_out, op.bias is not None, device,
                                              packing, memo, narrow, op.partials))
    return recipes


def matmul_recipe(gm: int, gn: int, gk: int, m: int, k: int, n: int, in_dt: str, out_dt: str,
                   e_in: int, e_out: int, bias: bool, device: Device,
                   packing: str = "element", memo: dict | None = None,
                   narrow: bool = False, partials: str = "fp16") -> Recipe:
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
        pe = DTYPE_BYTES[partials]
        compute = matmul_cycles(mb, kb, nb, in_dt, partials, device, memo=memo)
        slice_rows = math.ceil(mb / gk)
        if pairs_rows(partials, even_cuts(n, gn)):  # odd-width fp16 partials: row-pair slices
            slice_rows = 2 * math.ceil(math.ceil(mb / 2) / gk)
        land = gk * slice_rows * nb * pe
        phases.append(land)
        mem += mb * nb * pe + land + slice_rows * nb * e_out
        xbytes += land
        compute += reduce_cycles(slice_rows, nb, gk, out_dt, device, bias, memo, partials)
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
        out_bytes=max(mb * nb * (DTYPE_BYTES[partials] if gk > 1 else e_out),
                      math.ceil(kb / gm) * nb * e_in),
        home_bytes=math.ceil(kb / gm) * nb * e_in + (nb * 2 if bias else 0),
    )
