"""The `cast` proposal kind: cast before redistribution (early casting) for one
absorbed Cast, run on its input's canonical owners (recipe `rows:<canonical rows
per owner>`). Gain = measured cast cycles − the catalogue estimate of that
recipe (compute + the move of the result to its canonical layout) + the narrowed
share of the exchange payload of the moves that carried the wide value.
"""

from __future__ import annotations

from planner.decide import catalogue as cat
from planner.decide.layout import canonical_rows_per_owner, view2d
from planner.ir.graph import DTYPE_BYTES
from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


@PROPOSALS.register("cast")
def cast(around: Around) -> list[Proposal]:
    """Cast on the canonical owners, then move the narrow result (cast order before)."""
    out = []
    for site in around.sites:
        if not site.op.CONVERSION or around.plan.cast_before(site.name):
            continue
        measured = around.measured(f"cast {site.name}")
        if measured == 0:
            continue  # not absorbed (already a compute op on canonical owners)
        x = site.graph.tensor(site.op.inputs[0])
        y = site.graph.tensor(site.op.outputs[0])
        rows, cols = view2d(x.shape)
        rpo = canonical_rows_per_owner(rows, cols, DTYPE_BYTES[x.dtype],
                                       around.device.element_bytes, around.device.tiles,
                                       around.plan.packing)
        # on its input's canonical owners (no move in); the estimate
        # includes the move of the narrow result to its own canonical
        # layout where that differs (element packing: twice the rows)
        key = f"rows:{rpo}"
        early = site.trips * cat.recipe_from_key(site.graph, site.op, around.device, key,
                                                 around.plan.packing, around.cache).cycles
        moved = around.measured_moves("input", f"{site.scope}{site.op.inputs[0]}")
        sync = around.device.exchange_fixed_cycles
        payload = max(0, moved - sync * site.trips)
        narrow = 1 - DTYPE_BYTES[y.dtype] / DTYPE_BYTES[x.dtype]
        gain = measured - early + int(payload * narrow)
        out.append(Proposal("cast", f"cast {site.name} before redistribution", gain,
                            around.plan.with_cast_order(site.name, "before")
                            .with_recipe(site.name, key)))
    return out
