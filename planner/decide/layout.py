"""Distributed layouts of a logical 2-D matrix over physical tiles.

Every tensor is seen as a 2-D matrix: shape (R, C) as is, (n,) as (1, n), and
(Bt, T, d) as (Bt·T, d) rows.  A `Layout` cuts that matrix into a grid of
cells (row cuts × column cuts); each cell is held by one or more tiles
(replicas, the first is the primary).  A cell is stored contiguously,
row-major, with local row stride = cell width × element bytes.

The **canonical** layout (the default boundary between ops) is contiguous row
blocks: rows_per_owner = max(1, target // row_bytes) with target = one 16 KiB
SRAM element (scaled by the plan's packing), raised to ceil(R / tiles) when
there would be more owners than tiles.  Owner o of n sits on logical tile
o·tiles // n (spread over the device, never piled on tiles 0..n-1) and on the
physical tile the plan's tile mapping gives.  A row wider than
WIDE_ROW_ELEMENTS SRAM elements (an LLM's logits: one row of 151,936 fp16)
is also cut into column blocks of one element each, spread the same way, so
no single owner holds it whole.  An op's own row blocks may be
shifted (`Plan.tile_shift`): owner o then sits on logical tile
(o·tiles // n + shift) mod tiles; canonical layouts are never shifted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from planner.decide.plan import PACKING_FACTOR, Plan
from planner.ir.graph import view2d

__all__ = ["view2d"]  # the IR's 2-D view, used with every layout


def even_cuts(n: int, parts: int) -> tuple[int, ...]:
    """Cut points splitting range(n) into `parts` pieces whose sizes differ by ≤ 1
    (larger pieces first); parts is clipped to n."""
    parts = max(1, min(parts, n))
    q, r = divmod(n, parts)
    cuts = [0]
    for i in range(parts):
        cuts.append(cuts[-1] + q + (1 if i < r else 0))
    return tuple(cuts)


def pairs_rows(partials: str, col_cuts: tuple[int, ...]) -> bool:
    """Whether a K-split matmul's output row slices go by row pairs: fp16
    partial rows with an odd-width column block among `col_cuts` (their row
    slices then start on a word: `slice_cuts`)."""
    return partials == "fp16" and any((b - a) % 2 for a, b in zip(col_cuts, col_cuts[1:],
                                                                  strict=False))


def slice_cuts(n: int, parts: int, pair: bool) -> tuple[int, ...]:
    """`even_cuts(n, parts)`, or with `pair` cut points on even offsets only
    (even_cuts over the ⌈n/2⌉ row pairs): a K-split matmul's fp16 partial
    rows of odd width start their row slices on a word that way."""
    if not pair:
        return even_cuts(n, parts)
    return tuple(min(2 * c, n) for c in even_cuts(-(-n // 2), parts))


def step_cuts(n: int, step: int) -> tuple[int, ...]:
    """Cut points every `step` elements (the last piece may be shorter)."""
    return tuple(range(0, n, step)) + (n,)


@dataclass(frozen=True)
class Layout:
    """A grid of cells over an R × C matrix; `owners[ri * ncols + ci]` holds
    the tiles storing cell (ri, ci), primary first."""

    rows: int
    cols: int
    row_cuts: tuple[int, ...]
    col_cuts: tuple[int, ...]
    owners: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        for cuts, n, what in ((self.row_cuts, self.rows, "row"),
                              (self.col_cuts, self.cols, "col")):
            steps = zip(cuts, cuts[1:], strict=False)
            if cuts[0] != 0 or cuts[-1] != n or any(a >= b for a, b in steps):
                raise ValueError(f"layout {what} cuts {cuts[:8]}... do not split 0..{n}")
        if len(self.owners) != self.nr * self.nc or any(not o for o in self.owners):
            raise ValueError(f"layout needs one non-empty owner tuple per cell "
                             f"({self.nr}x{self.nc}), got {len(self.owners)}")

    @cached_property
    def nr(self) -> int:
        return len(self.row_cuts) - 1

    @cached_property
    def nc(self) -> int:
        return len(self.col_cuts) - 1

    def rect(self, ri: int, ci: int) -> tuple[int, int, int, int]:
        """(r0, r1, c0, c1) of cell (ri, ci)."""
        return self.row_cuts[ri], self.row_cuts[ri + 1], self.col_cuts[ci], self.col_cuts[ci + 1]

    def cell_owners(self, ri: int, ci: int) -> tuple[int, ...]:
        return self.owners[ri * self.nc + ci]

    def cells(self) -> list[tuple[int, int]]:
        return [(ri, ci) for ri in range(self.nr) for ci in range(self.nc)]

    @cached_property
    def _row_arr(self) -> np.ndarray:
        return np.asarray(self.row_cuts, dtype=np.int64)

    @cached_property
    def _col_arr(self) -> np.ndarray:
        return np.asarray(self.col_cuts, dtype=np.int64)

    def row_span(self, r0: int, r1: int) -> range:
        """Indices of the row cells overlapping rows [r0, r1)."""
        a = int(np.searchsorted(self._row_arr, r0, side="right")) - 1
        b = int(np.searchsorted(self._row_arr, r1, side="left"))
        return range(max(a, 0), min(b, self.nr))

    def col_span(self, c0: int, c1: int) -> range:
        a = int(np.searchsorted(self._col_arr, c0, side="right")) - 1
        b = int(np.searchsorted(self._col_arr, c1, side="left"))
        return range(max(a, 0), min(b, self.nc))

    def primary(self) -> Layout:
        """The same grid with only the primary replica of each cell."""
        return Layout(self.rows, self.cols, self.row_cuts, self.col_cuts,
                      tuple(o[:1] for o in self.owners))

    def tile_bytes(self, elem_bytes: int) -> dict[int, int]:
        """Bytes each tile stores (all its cells and replicas), by tile."""
        out: dict[int, int] = {}
        for ri, ci in self.cells():
            r0, r1, c0, c1 = self.rect(ri, ci)
            nbytes = (r1 - r0) * (c1 - c0) * elem_bytes
            for t in self.cell_owners(ri, ci):
                out[t] = out.get(t, 0) + nbytes
        return out

    def tile_load(self, elem_bytes: int, tiles: int, primary: bool = False) -> np.ndarray:
        """`tile_bytes` as an int64 array [tiles] (only primaries: `primary`)."""
        rows = np.diff(self._row_arr)
        cols = np.diff(self._col_arr)
        cell = (rows[:, None] * cols[None, :]).ravel() * elem_bytes
        owners = [o[:1] for o in self.owners] if primary else self.owners
        counts = np.fromiter((len(o) for o in owners), dtype=np.int64, count=len(owners))
        where = np.fromiter((t for o in owners for t in o), dtype=np.int64,
                            count=int(counts.sum()))
        out = np.zeros(tiles, dtype=np.int64)
        np.add.at(out, where, np.repeat(cell, counts))
        return out

    def max_cell_bytes(self, elem_bytes: int) -> int:
        rows = max(b - a for a, b in zip(self.row_cuts, self.row_cuts[1:], strict=False))
        cols = max(b - a for a, b in zip(self.col_cuts, self.col_cuts[1:], strict=False))
        return rows * cols * elem_bytes

    def is_row_blocks(self) -> bool:
        """True when every cell spans all columns and has one owner."""
        return self.nc == 1 and all(len(o) == 1 for o in self.owners)


# ------------------------------------------------------------ constructors


def canonical_rows_per_owner(rows: int, cols: int, elem_bytes: int, element_bytes: int,
                             tiles: int, packing: str = "element") -> int:
    """Rows per owner of the canonical layout (module docstring); packing
    "rows" (the capacity policy) spreads whole rows over as many owners as
    the device has: ceil(rows / tiles)."""
    if packing == "rows":
        return math.ceil(rows / tiles)
    num, den = PACKING_FACTOR[packing]
    target = element_bytes * num // den
    rpo = max(1, target // (cols * elem_bytes))
    if math.ceil(rows / rpo) > tiles:
        rpo = math.ceil(rows / tiles)
    return min(rpo, rows)


def spread_tiles(n: int, tiles: int, plan: Plan, shift: int = 0) -> tuple[int, ...]:
    """Physical tiles of n owners spread evenly over a device of `tiles` tiles:
    owner o on logical tile (o·tiles // n + shift) mod tiles.  Raises
    ValueError when n > tiles."""
    if n > tiles:
        raise ValueError(f"{n} owners on {tiles} tiles")
    return plan.physical_tiles(((o * tiles // n + shift) % tiles for o in range(n)), tiles)


def row_layout(rows: int, cols: int, rows_per_owner: int, tiles: int, plan: Plan,
               shift: int = 0) -> Layout:
    """Contiguous row blocks of `rows_per_owner` rows, owners spread (and
    shifted by `shift` logical tiles).  Remembered (`_row_layout`): a
    Layout is immutable, and a build asks for the same few hundred row
    layouts thousands of times, each ~10³ tiles long (0.7 ms apiece made
    row layouts 2.3 s of a 27-layer plan)."""
    return _row_layout(rows, cols, rows_per_owner, tiles, plan.tile_offset, plan.tile_stride,
                       shift)


@functools.lru_cache(maxsize=4096)
def _row_layout(rows: int, cols: int, rows_per_owner: int, tiles: int, offset: int, stride: int,
                shift: int) -> Layout:
    cuts = step_cuts(rows, rows_per_owner)
    owners = spread_tiles(len(cuts) - 1, tiles, Plan(tile_offset=offset, tile_stride=stride),
                          shift)
    return Layout(rows, cols, cuts, (0, cols), tuple((t,) for t in owners))


# canonical rows wider than this many SRAM elements are cut into column blocks
WIDE_ROW_ELEMENTS = 4


def canonical_col_cuts(cols: int, elem_bytes: int, element_bytes: int) -> tuple[int, ...]:
    """Column cuts of the canonical layout: one block, or blocks of one SRAM
    element for a row wider than WIDE_ROW_ELEMENTS elements."""
    if cols * elem_bytes <= WIDE_ROW_ELEMENTS * element_bytes:
        return (0, cols)
    return step_cuts(cols, max(1, element_bytes // elem_bytes))


def canonical_layout(shape: tuple[int, ...], elem_bytes: int, element_bytes: int, tiles: int,
                     plan: Plan) -> Layout:
    """The canonical boundary layout of a tensor of `shape` (module docstring)."""
    rows, cols = view2d(shape)
    rpo = canonical_rows_per_owner(rows, cols, elem_bytes, element_bytes, tiles, plan.packing)
    col_cuts = canonical_col_cuts(cols, elem_bytes, element_bytes)
    if len(col_cuts) == 2:
        return row_layout(rows, cols, rpo, tiles, plan)
    row_cuts = step_cuts(rows, rpo)
    cells = (len(row_cuts) - 1) * (len(col_cuts) - 1)
    owners = spread_tiles(min(cells, tiles), tiles, plan)
    return Layout(rows, cols, row_cuts, col_cuts,
                  tuple((owners[c % len(owners)],) for c in range(cells)))


def grid_tiles(base: int, count: int, tiles: int, plan: Plan) -> tuple[int, ...]:
    """Physical tiles of grid positions 0..count-1 starting at logical tile
    `base` (wrapping): the shared rotation of parameterised ops."""
    return plan.physical_tiles(((base + q) % tiles for q in range(count)), tiles)
