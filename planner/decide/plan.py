"""The Plan: every decision a build needs, as one frozen, hashable, sortable value.

A Plan says *what* to build; lower/expand say *how*.  It holds

- `recipes`: op name → recipe key (catalogue.Recipe.key).  Ops inside a Repeat
  body are named `<repeat>/<op>`.  An op without an entry uses its catalogue's
  first shortlisted recipe (the best estimate); `baseline_plan` fills every op.
- `open_boundaries`: tensor names whose canonical boundary is removed: the
  producer's output moves straight into the consumers' layouts instead of via
  the canonical layout (one redistribution instead of two).
- `cast_order`: Cast op name → "after" (redistribute the wide input, cast on the
  consumer's tiles; the default) or "before" (cast on the canonical owners,
  then move the narrow result).
- `packing`: the target bytes per owner of the canonical layout: "element"
  (one 16 KiB SRAM element per owner, the default), "half" (half an element:
  twice the owners, shorter row phases) or "double" (two elements: half the
  owners, fewer transfers) or "rows" (whole rows over as many owners as the
  device has: the capacity policy's canonical layout).
- `reduction_overlap`: the scheduler may overlap independent K-split
  reductions with neighbouring phases (read by planner.lowering.schedule).
- `tile_offset`/`tile_stride`: logical tile t runs on physical tile
  (offset + t·stride) mod tiles; stride must be coprime with the tile count.
- `rotation`: pinned logical start tiles of the shared parameter-home
  rotation, by rotation key (a parameterised op's or vector parameter's
  qualified name; `Lowered.rotation` records the bases a build used).  Keys
  not listed continue the running rotation.  The optimizer pins the
  incumbent's bases so that a recipe change of one op leaves every other
  op's parameter homes where they were.
- `row_moves`: a redistribution moves a piece of at most this many rows
  that is narrower than its source or destination cell row by row (one
  transfer per row) instead of packing it into a column panel with COPY
  vertices on either side (0: always pack).  Row by row costs a send and a
  receive control and exchange-table entries per row; a pack costs a COPY
  call per side.  The baseline sets it from the device (`default_row_moves`);
  left out of `repr` while 0, like `tile_shift`.
- `fused`: keys of sibling-matmul groups that run as one recipe over their
  concatenated weights (planner.decide.fusion; the group's recipe is
  `recipes[key]`); left out of `repr` while empty.
- `tile_shift`: op qualified name → logical tile offset (1 ≤ shift) added to
  the placement of that op alone: a row op's row blocks, a batched matmul's
  or elementwise grid's spread tiles, a matmul's grid (rotation base +
  shift).  A shifted matmul takes its weight and bias homes along (they
  live on the tiles that read them), but its rotation base and the running
  rotation stay, so no other op's homes move; LayerNorm vectors and the
  position embedding keep their rotating homes and are multicast to the
  shifted tiles; canonical layouts never shift.  Lowering raises
  `BuildFailure("lower")` for a shift of an op it does not place (heads
  ops, absorbed casts, unknown names).  The field is left out of `repr`
  while empty, so plans without shifts keep the digest they had before it.

Tuples are kept sorted by key, so equal decisions give equal Plans (and equal
hashes) whatever order the `with_*` helpers were applied in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

CAST_ORDERS = ("after", "before")
PACKINGS = ("element", "half", "double", "rows")
PACKING_FACTOR = {"element": (1, 1), "half": (1, 2), "double": (2, 1)}


def _set_item(items: tuple[tuple[str, str], ...], key: str, value: str) -> tuple:
    d = dict(items)
    d[key] = value
    return tuple(sorted(d.items()))


@dataclass(frozen=True, order=True)
class Plan:
    recipes: tuple[tuple[str, str], ...] = ()
    open_boundaries: tuple[str, ...] = ()
    cast_order: tuple[tuple[str, str], ...] = ()
    packing: str = "element"
    reduction_overlap: bool = False
    tile_offset: int = 0
    tile_stride: int = 1
    rotation: tuple[tuple[str, int], ...] = ()
    tile_shift: tuple[tuple[str, int], ...] = ()
    row_moves: int = 0
    fused: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise ValueError(f"plan packing {self.packing!r} not in {PACKINGS}")
        for op, order in self.cast_order:
            if order not in CAST_ORDERS:
                raise ValueError(f"plan cast order of {op}: {order!r} not in {CAST_ORDERS}")
        if self.tile_stride < 1 or self.tile_offset < 0:
            raise ValueError(
                f"plan tile mapping offset {self.tile_offset} stride {self.tile_stride}"
            )
        for op, shift in self.tile_shift:
            if not isinstance(shift, int) or shift < 1:
                raise ValueError(f"plan tile shift of {op}: {shift!r} is not a positive int "
                                 f"(no shift: leave the op out)")
        for name, items in (("recipes", self.recipes), ("cast_order", self.cast_order),
                            ("rotation", self.rotation), ("tile_shift", self.tile_shift)):
            keys = [k for k, _ in items]
            if keys != sorted(set(keys)):
                raise ValueError(f"plan {name} must be sorted with unique keys: {keys}")
        if not isinstance(self.row_moves, int) or self.row_moves < 0:
            raise ValueError(f"plan row_moves {self.row_moves!r} must be an int >= 0")
        if list(self.fused) != sorted(set(self.fused)):
            raise ValueError(f"plan fused must be sorted unique: {self.fused}")
        if list(self.open_boundaries) != sorted(set(self.open_boundaries)):
            raise ValueError(f"plan open_boundaries must be sorted unique: {self.open_boundaries}")

    def __repr__(self) -> str:
        # the dataclass repr, without `tile_shift` while it is empty: plan
        # digests (build.plan_digest hashes the repr) of plans without shifts
        # are what they were before the field existed
        shown = [f for f in fields(self) if (f.name != "tile_shift" or self.tile_shift)
                 and (f.name != "row_moves" or self.row_moves)
                 and (f.name != "fused" or self.fused)]
        return f"Plan({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    # ------------------------------------------------------------ queries

    def recipe(self, op: str) -> str | None:
        """The selected recipe key of `op`, or None (use the catalogue's best)."""
        for k, v in self.recipes:
            if k == op:
                return v
        return None

    def rotation_base(self, key: str) -> int | None:
        """The pinned rotation base of `key`, or None (continue the rotation)."""
        for k, v in self.rotation:
            if k == key:
                return v
        return None

    def shift(self, op: str) -> int:
        """The logical tile shift of `op`'s placement (0: not shifted)."""
        for k, v in self.tile_shift:
            if k == op:
                return v
        return 0

    def cast_before(self, cast_op: str) -> bool:
        for k, v in self.cast_order:
            if k == cast_op:
                return v == "before"
        return False

    def is_fused(self, group: str) -> bool:
        return group in self.fused

    def with_fused(self, group: str, fused: bool = True) -> Plan:
        s = set(self.fused) - {group}
        return replace(self, fused=tuple(sorted(s | ({group} if fused else set()))))

    def is_open(self, tensor: str) -> bool:
        return tensor in self.open_boundaries

    def physical(self, logical: int, tiles: int) -> int:
        """Physical tile of logical tile `logical` on a device of `tiles` tiles.

        Raises ValueError if the stride is not coprime with `tiles` (the map
        would not be a permutation)."""
        if math.gcd(self.tile_stride, tiles) != 1:
            raise ValueError(f"tile stride {self.tile_stride} not coprime with {tiles} tiles")
        return (self.tile_offset + logical * self.tile_stride) % tiles

    def physical_tiles(self, logical: Iterable[int], tiles: int) -> tuple[int, ...]:
        """`physical` of every tile in `logical` (one coprimality check:
        lowering maps ~10⁵ tiles per build).  Raises ValueError like
        `physical`."""
        if math.gcd(self.tile_stride, tiles) != 1:
            raise ValueError(f"tile stride {self.tile_stride} not coprime with {tiles} tiles")
        offset, stride = self.tile_offset, self.tile_stride
        return tuple((offset + t * stride) % tiles for t in logical)

    # ------------------------------------------------------------ neighbours

    def with_recipe(self, op: str, key: str) -> Plan:
        return replace(self, recipes=_set_item(self.recipes, op, key))

    def with_recipes(self, items: dict[str, str]) -> Plan:
        d = dict(self.recipes)
        d.update(items)
        return replace(self, recipes=tuple(sorted(d.items())))

    def with_open(self, tensor: str, is_open: bool = True) -> Plan:
        s = set(self.open_boundaries)
        if is_open:
            s.add(tensor)
        else:
            s.discard(tensor)
        return replace(self, open_boundaries=tuple(sorted(s)))

    def with_cast_order(self, cast_op: str, order: str) -> Plan:
        if order not in CAST_ORDERS:
            raise ValueError(f"cast order {order!r} not in {CAST_ORDERS}")
        return replace(self, cast_order=_set_item(self.cast_order, cast_op, order))

    def with_cast_orders(self, orders: dict[str, str]) -> Plan:
        for op, order in orders.items():
            if order not in CAST_ORDERS:
                raise ValueError(f"cast order of {op}: {order!r} not in {CAST_ORDERS}")
        d = dict(self.cast_order)
        d.update(orders)
        return replace(self, cast_order=tuple(sorted(d.items())))

    def with_packing(self, packing: str) -> Plan:
        return replace(self, packing=packing)

    def with_row_moves(self, rows: int) -> Plan:
        return replace(self, row_moves=int(rows))

    def with_reduction_overlap(self, flag: bool) -> Plan:
        return replace(self, reduction_overlap=bool(flag))

    def with_tile_mapping(self, offset: int, stride: int = 1) -> Plan:
        return replace(self, tile_offset=offset, tile_stride=stride)

    def with_tile_shift(self, op: str, shift: int) -> Plan:
        """`op` placed `shift` logical tiles further on (taken mod `tiles`
        when lowered; 0 removes the shift).  Raises ValueError when negative."""
        if shift < 0:
            raise ValueError(f"tile shift of {op}: {shift} < 0")
        d = dict(self.tile_shift)
        d.pop(op, None)
        if shift:
            d[op] = shift
        return replace(self, tile_shift=tuple(sorted(d.items())))

    def with_rotation(self, bases: dict[str, int]) -> Plan:
        """Pin rotation bases (merged over the plan's existing pins)."""
        d = dict(self.rotation)
        d.update(bases)
        return replace(self, rotation=tuple(sorted(d.items())))

    def describe(self) -> str:
        """One line per decision (for reports and diffs between plans)."""
        lines = [f"recipe {op} = {key}" for op, key in self.recipes]
        lines += [f"open {t}" for t in self.open_boundaries]
        lines += [f"cast {op} {order}" for op, order in self.cast_order]
        lines += [f"rotation {key} at {base}" for key, base in self.rotation]
        lines += [f"shift {op} by {n} tiles" for op, n in self.tile_shift]
        lines.append(f"packing {self.packing}; reduction_overlap {self.reduction_overlap}; "
                     f"tiles (offset {self.tile_offset}, stride {self.tile_stride})")
        return "\n".join(lines)
