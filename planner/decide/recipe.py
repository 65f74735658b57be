"""Recipes and what every recipe family prices them with.

A `Recipe` is one way to run one op on the whole device, independent of the
plan's tile mapping: a family, a key (`<family prefix>:<grid>`), its grid,
its estimated cycles (compute + exchange, cycle models of the simulator's own
kernels: simulator.cost) and its per-tile bytes (planner.decide.catalogue
explains the estimate).  A recipe family (`RecipeFamily`, registered in
FAMILIES by the name op kinds give as their FAMILY: planner.ir.opkind)
generates the recipes of an op and finds one by key; the built-in families
are the modules of planner.decide.families.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from planner.decide.layout import canonical_col_cuts, canonical_rows_per_owner, view2d
from planner.ir.graph import DTYPE_BYTES, Graph, Op
from simulator.cost import kernel_cycles
from simulator.device import Device
from simulator.timing import exchange_estimate

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


class RecipeFamily(Protocol):
    """How one family makes recipes: `generate` every recipe of `op` (graph
    `g`) on `device` under canonical `packing` (an fp8 matmul operand
    arriving narrow when `narrow`); `from_key` the recipe with `key`, also
    one `generate` skips, or None when the key is not the family's or does
    not fit.  `memo` is the catalogue cache's kernel-call cycles."""

    def generate(self, g: Graph, op: Op, device: Device, packing: str, memo: dict,
                 narrow: bool) -> list[Recipe]: ...

    def from_key(self, g: Graph, op: Op, device: Device, key: str, packing: str, memo: dict,
                 narrow: bool) -> Recipe | None: ...


FAMILIES: dict[str, RecipeFamily] = {}


def register_family(name: str) -> Callable[[type], type]:
    """Class decorator: an instance of the class is the recipe family `name`."""
    def add(cls: type) -> type:
        if name in FAMILIES:
            raise ValueError(f"recipe family {name!r} registered twice")
        FAMILIES[name] = cls()
        return cls
    return add


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
                  bias: bool = False, memo: dict | None = None, partials: str = "fp32") -> int:
    """REDUCE of k partial blocks m × n (`partials`: fp32 or fp16) into out_dt."""
    return call_cycles("REDUCE", device, memo, M=m, N=n, k=k, out_dtype=out_dt,
                       bias=int(bias), parts_fp16=int(partials == "fp16"))


def exchange_cycles(nbytes: int, device: Device) -> int:
    """One exchange phase landing `nbytes` on the busiest tile
    (`simulator.timing.exchange_estimate`)."""
    return exchange_estimate(device, nbytes, 0)


# ------------------------------------------------------------ canonical layouts


def grid_steps(n: int) -> list[int]:
    """The grid extents tried along a dimension of `n` (GRID_STEPS clipped)."""
    return sorted({min(s, n) for s in GRID_STEPS})


def canon_rpo(g: Graph, name: str, device: Device, packing: str) -> int:
    """Rows per canonical owner of tensor `name` under `packing`."""
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
    cuts = canonical_col_cuts(cols, elem, device.element_bytes)
    return rpo * max(b - a for a, b in zip(cuts, cuts[1:], strict=False)) * elem
