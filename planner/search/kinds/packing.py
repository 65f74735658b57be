"""The `packing` proposal kind: another canonical packing
("element"/"half"/"double"/"rows"). Every move to or from a canonical layout
(`canon <t>`, `to <t>@…`) is bound by the canonical owners' bytes, which scale
with the canonical rows per owner: gain = Σ measured payload (cycles − one sync
per trip) × (1 − rows per owner under the new packing / under the current one).
Row ops that ran on the canonical owners follow them (`follow_packing`).
"""

from __future__ import annotations

from planner.decide.layout import canonical_rows_per_owner, view2d
from planner.decide.plan import PACKINGS, Plan
from planner.ir.graph import DTYPE_BYTES
from planner.search.around import Around, Proposal
from planner.search.registry import PROPOSALS


@PROPOSALS.register("packing")
def packing(around: Around) -> list[Proposal]:
    """Another canonical packing (element, half, double, rows) for every boundary."""
    moves = canonical_moves(around)
    d = around.device
    out = []
    for p in PACKINGS:
        if p == around.plan.packing:
            continue
        gain = 0.0
        for payload, rows, cols, elem in moves:
            cur = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles,
                                           around.plan.packing)
            new = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles, p)
            gain += payload * (1 - new / cur)
        out.append(Proposal("packing", f"canonical packing {around.plan.packing} -> {p}",
                            int(round(gain)), follow_packing(around, p)))
    return out


def canonical_moves(around: Around) -> list[tuple[int, int, int, int]]:
    """(payload cycles, rows, cols, element bytes) of every measured move
    to or from a canonical layout; payload = cycles − one sync per trip."""
    tensors: dict[str, tuple[int, int, int, int]] = {}
    for site in around.sites:
        for name in site.op.inputs + site.op.outputs:
            t = site.graph.tensor(name)
            rows, cols = view2d(t.shape)
            tensors[f"{site.scope}{name}"] = (rows, cols, DTYPE_BYTES[t.dtype], site.trips)
    out = []
    for (role, q), labels in around.moves.items():
        if role == "parameter" or q not in tensors:
            continue
        rows, cols, elem, trips = tensors[q]
        out += [(max(0, around.prof.moves[lab] - around.device.exchange_fixed_cycles * trips),
                 rows, cols, elem) for lab in labels if lab in around.prof.moves]
    return out


def follow_packing(around: Around, packing: str) -> Plan:
    """The incumbent under `packing`, with every row op that runs on its
    input's canonical owners (recipe `rows:<canonical rows per owner>`)
    moved to the new canonical owners, so it stays free of moves."""
    plan = around.plan.with_packing(packing)
    d = around.device
    for site in around.sites:
        key = around.plan.recipe(site.name)
        if key is None or not key.startswith("rows:") or "x" in key:
            continue
        x = site.graph.tensor(site.op.inputs[0])
        rows, cols = view2d(x.shape)
        elem = DTYPE_BYTES[x.dtype]
        cur = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles,
                                       around.plan.packing)
        if key == f"rows:{cur}":
            new = canonical_rows_per_owner(rows, cols, elem, d.element_bytes, d.tiles,
                                           packing)
            plan = plan.with_recipe(site.name, f"rows:{new}")
    return plan
