"""The "bmm" recipe family: the attention's batched matmuls (BatchMatMul).

`bmm:<bg>x<gr>`: a tile holds bg batches (gr = 1) or a 1/gr row block of one
batch, and the other operand's whole head(s); `bmm:1x<gr>x<gc>`: a row block
× one of gc output column blocks per tile, with 1/gc of the other operand.
An fp8 `a` arrives wide (cast on the tile) unless `narrow`.  With grouped-
query attention (kv_group g) a tile's bg batches need the kv heads of their
groups, at most ceil((bg - 1) / g) + 1 of them (one vertex each).
"""

from __future__ import annotations

import math
from typing import Any

from planner.decide.recipe import (
    Recipe,
    call_cycles,
    canonical_bytes,
    exchange_cycles,
    grid_steps,
    register_family,
)
from planner.ir.graph import DTYPE_BYTES, Graph, Op
from simulator.device import Device


@register_family("bmm")
class BmmFamily:
    """Recipes of the bmm family (module docstring)."""

    def generate(self, g: Graph, op: Op, device: Device, packing: str, memo: dict,
                 narrow: bool) -> list[Recipe]:
        return bmm_recipes(g, op, device, packing, memo, narrow)

    def from_key(self, g: Graph, op: Op, device: Device, key: str, packing: str, memo: dict,
                 narrow: bool) -> Recipe | None:
        return None  # only the generated grids


def bmm_recipes(g: Graph, op: Any, device: Device, packing: str,
                 memo: dict, narrow: bool = False) -> list[Recipe]:
    a, _b, out = g.tensor(op.a), g.tensor(op.b), g.tensor(op.out)
    bt, m, k = a.shape
    n = out.shape[2]
    e, e_out = DTYPE_BYTES[a.dtype], DTYPE_BYTES[out.dtype]
    # an fp8 a operand arrives wide and is cast on the tile unless `narrow`
    e_a = 2 if a.dtype == "fp8" and not narrow else e
    tiles = device.tiles
    grids = set()
    for gr in grid_steps(m) + [min(m, tiles // bt)]:
        if gr >= 1 and bt * gr <= tiles:
            grids.add((1, gr))
    for bg in range(1, bt + 1):
        if math.ceil(bt / bg) <= tiles and (bg in (1, 2, 4, 8) or bg == bt
                                             or math.ceil(bt / bg) == tiles):
            grids.add((bg, 1))
    recipes = [bmm_split_recipe(op, bt, m, k, n, gr, gc, a.dtype, out.dtype, device,
                                 packing, memo, e_a)
               for gc in (2, 4, 8) if gc <= n
               for gr in sorted({min(m, tiles // (bt * gc)), min(m, tiles // (bt * gc)) // 2})
               if gr >= 1]
    grp = op.kv_group
    for bg, gr in sorted(grids):
        mb = math.ceil(m / gr)
        kvs = bg if grp == 1 else min(bg, (bg + grp - 2) // grp + 1)  # kv heads per tile
        a_bytes, b_bytes, o_bytes = bg * mb * k * e_a, kvs * k * n * e, bg * mb * n * e_out
        compute = kvs * call_cycles("BATCH_MATMUL", device, memo, M=mb, K=k, N=n,
                                    in_dtype=a.dtype, out_dtype=out.dtype,
                                    transpose_b=int(op.transpose_b), batch=-(-bg // kvs))
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


def bmm_split_recipe(op: Any, bt: int, m: int, k: int, n: int, gr: int, gc: int,
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
