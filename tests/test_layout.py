"""Layouts and the Plan value: canonical row blocks, cut helpers, tile mapping."""

from __future__ import annotations

import pytest

import planner
import simulator
from planner.decide.layout import (
    Layout,
    canonical_layout,
    canonical_rows_per_owner,
    even_cuts,
    step_cuts,
    view2d,
)
from planner.decide.plan import Plan
from planner.ir.graph import DTYPE_BYTES


def test_cut_helpers() -> None:
    assert even_cuts(10, 3) == (0, 4, 7, 10)
    assert even_cuts(2, 5) == (0, 1, 2)  # parts clipped to n
    assert step_cuts(10, 4) == (0, 4, 8, 10)
    assert view2d((3, 5, 7)) == (15, 7)
    assert view2d((9,)) == (1, 9)


def test_canonical_targets_one_element_per_owner() -> None:
    dev = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    body = next(op for op in g.ops if op.kind == "Repeat").body  # type: ignore[union-attr]
    for graph in (g, body):
        for t in graph.tensors:
            if t.kind == "parameter":
                continue
            elem = DTYPE_BYTES[t.dtype]
            lay = canonical_layout(t.shape, elem, dev.element_bytes, dev.tiles, Plan())
            assert lay.is_row_blocks()
            rows, cols = view2d(t.shape)
            rpo = max(1, dev.element_bytes // (cols * elem))
            assert lay.row_cuts == step_cuts(rows, rpo)
            assert all(n <= dev.element_bytes for n in lay.tile_bytes(elem).values())
            owners = [o[0] for o in lay.owners]
            assert len(set(owners)) == len(owners)
            if len(owners) > 1:  # spread over the device, not piled on 0..n-1
                assert max(owners) >= dev.tiles // 2


def test_canonical_raises_rows_per_owner_when_owners_exceed_tiles() -> None:
    # 1000 rows of 16 KiB each on 16 tiles: 63 rows per owner, 16 owners
    assert canonical_rows_per_owner(1000, 8192, 2, 16384, 16) == 63
    lay = canonical_layout((1000, 8192), 2, 16384, 16, Plan())
    assert lay.nr == 16 and sorted(o[0] for o in lay.owners) == list(range(16))


def test_packing_scales_the_target() -> None:
    assert canonical_rows_per_owner(197, 192, 2, 16384, 1472, "element") == 42
    assert canonical_rows_per_owner(197, 192, 2, 16384, 1472, "half") == 21
    assert canonical_rows_per_owner(197, 192, 2, 16384, 1472, "double") == 85


def test_layout_spans_match_brute_force() -> None:
    lay = Layout(10, 6, (0, 3, 4, 10), (0, 2, 6), tuple((t,) for t in range(6)))
    for r0 in range(10):
        for r1 in range(r0 + 1, 11):
            want = [i for i in range(lay.nr) if lay.row_cuts[i] < r1 and lay.row_cuts[i + 1] > r0]
            assert list(lay.row_span(r0, r1)) == want
    assert list(lay.col_span(1, 3)) == [0, 1]
    assert lay.tile_bytes(2)[0] == 3 * 2 * 2


def test_layout_rejects_bad_cuts_and_owners() -> None:
    with pytest.raises(ValueError, match="row cuts"):
        Layout(4, 4, (0, 2, 2, 4), (0, 4), ((0,), (1,), (2,)))
    with pytest.raises(ValueError, match="owner"):
        Layout(4, 4, (0, 4), (0, 4), ((),))


def test_plan_is_a_canonical_hashable_value() -> None:
    a = Plan().with_recipe("b", "x").with_recipe("a", "y").with_open("t2").with_open("t1")
    b = Plan().with_open("t1").with_recipe("a", "y").with_open("t2").with_recipe("b", "x")
    assert a == b and hash(a) == hash(b)
    assert a.recipes == (("a", "y"), ("b", "x"))
    assert a.recipe("a") == "y" and a.recipe("zz") is None
    assert a.with_open("t1", False).open_boundaries == ("t2",)
    assert sorted([a, Plan()])[0] == Plan()
    c = a.with_cast_order("cast_x", "before")
    assert c.cast_before("cast_x") and not a.cast_before("cast_x")
    with pytest.raises(ValueError):
        a.with_cast_order("cast_x", "sideways")
    with pytest.raises(ValueError):
        Plan(packing="loose")


def test_tile_mapping_is_a_permutation() -> None:
    plan = Plan().with_tile_mapping(5, 3)
    assert sorted(plan.physical(t, 16) for t in range(16)) == list(range(16))
    with pytest.raises(ValueError, match="coprime"):
        Plan().with_tile_mapping(0, 4).physical(1, 16)
    assert plan.physical_tiles(range(16), 16) == tuple(plan.physical(t, 16) for t in range(16))
    assert plan.physical_tiles((15, 0, 15), 16) == (plan.physical(15, 16), 5, plan.physical(15, 16))
    with pytest.raises(ValueError, match="coprime"):
        Plan().with_tile_mapping(0, 4).physical_tiles(range(3), 16)


def test_lowering_is_shared_by_equal_arguments() -> None:
    """`lower` keeps a build state's recent lowerings by content: equal
    arguments get the same object (the optimizer lowers each incumbent three
    times), another plan its own lowering; without a state nothing is kept."""
    from planner.ir.models import load_model
    from planner.lowering.lower import lower
    from planner.lowering.state import BuildState
    from simulator.device import load_device

    g, dev, state = load_model("vit-tiny", layers=1), load_device("c600"), BuildState()
    first = lower(g, dev, Plan(), state=state)
    assert lower(load_model("vit-tiny", layers=1), dev, Plan(), state=state) is first
    fresh = lower(g, dev, Plan())
    assert fresh is not first and fresh == first
    other = lower(g, dev, Plan(packing="double"), state=state)
    assert other is not first
    assert other.values["out"].layout != first.values["out"].layout  # canonical: packing
