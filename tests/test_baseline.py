"""Default baseline policy: canonical boundaries, compact balanced parameter homes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import planner
import simulator
from planner.decide.layout import view2d
from planner.ir.graph import DTYPE_BYTES
from planner.lowering.lower import lower
from planner.search.policies import baseline_plan, parameter_tile_bytes
from tilecommon.errors import BuildFailure, ConfigError


@pytest.fixture(scope="module")
def c600() -> simulator.Device:
    return simulator.load_device("c600")


def test_baseline_is_deterministic_and_complete(c600: simulator.Device) -> None:
    g = planner.load_model("vit-tiny", layers=2)
    a, b = baseline_plan(g, c600), baseline_plan(g, c600)
    assert a == b and a.describe() == b.describe()
    body = g.op("encoder").body  # type: ignore[attr-defined]
    want = sorted([op.name for op in g.ops if op.kind not in ("Repeat", "Cast")]
                  + [f"encoder/{op.name}" for op in body.ops if op.kind != "Cast"])
    early = sorted(op for op, order in a.cast_order if order == "before")
    # every op has a recipe; a cast run early runs on its input's canonical owners
    assert [k for k, _ in a.recipes] == sorted(want + early)
    assert all(a.recipe(op).startswith("rows:") for op in early)  # type: ignore[union-attr]
    assert len(a.cast_order) == 5 and a.open_boundaries == ()
    # the element policy: element packing, every cast after redistribution
    e = baseline_plan(g, c600, policy="element")
    assert e.packing == "element" and [k for k, _ in e.recipes] == want
    assert all(order == "after" for _, order in e.cast_order)


def test_default_policy_takes_the_cheaper_packing_and_cast_orders(
        c600: simulator.Device) -> None:
    """On siglip-so400m-map (c600) the estimates choose rows packing and every
    encoder cast early; each draft is the policy at its packing."""
    from planner.search.context import PlanningContext
    from planner.search.policies import DEFAULT_PACKINGS, _default_at

    g = planner.load_model("siglip-so400m-map", layers=2)
    ctx = PlanningContext()
    drafts = {p: _default_at(g, c600, 8, ctx, p) for p in DEFAULT_PACKINGS}
    plan = baseline_plan(g, c600, ctx=ctx)
    assert plan.packing == "rows" and plan == drafts["rows"][0]
    assert drafts["rows"][1] < drafts["element"][1]
    for cast in ("cast_ln1", "cast_ln2", "cast_attn", "cast_gelu", "cast_probs"):
        assert plan.cast_before(f"encoder/{cast}"), cast
    assert not plan.cast_before("encoder/cast_v")  # read by SplitHeads: not absorbable


def test_every_canonical_value_is_row_blocks_of_one_element(c600: simulator.Device) -> None:
    g = planner.load_model("vit-tiny", layers=2)
    lw = lower(g, c600, baseline_plan(g, c600, policy="element"))
    canon = [v for v in lw.values.values() if v.role in ("canonical", "output", "input")]
    assert len(canon) > 10
    for v in canon:
        rows, cols = view2d(v.shape)
        row_bytes = cols * DTYPE_BYTES[v.dtype]
        assert v.layout.is_row_blocks(), v.name
        heights = np.diff(v.layout.row_cuts)
        assert heights.max() == max(1, min(rows, c600.element_bytes // row_bytes)), v.name
        assert heights.max() * row_bytes <= c600.element_bytes
    # every op reads canonical values (or converts from them): no boundary is open;
    # a matmul's result moves to canonical (a row op may already run on the canonical owners)
    text = lw.describe()
    assert "canon encoder/fc1" in text and "canon out" in text


def test_casts_follow_redistribution(c600: simulator.Device) -> None:
    g = planner.load_model("vit-tiny", layers=1)
    lw = lower(g, c600, baseline_plan(g, c600, policy="element"))
    assert any(s.kind == "cast" for s in lw.steps)
    for k, s in enumerate(lw.steps):
        if s.kind == "cast":
            src = s.inputs[0]
            prev = lw.steps[k - 1]
            assert lw.values[src].dtype == "fp16" and lw.values[s.outputs[0]].dtype == "fp8"
            # the wide value was moved into the consumer's layout first
            assert prev.kind == "redistribute" and prev.outputs == (src,)
    plan = baseline_plan(g, c600, policy="element").with_cast_order("encoder/cast_ln1",
                                                                     "before")
    lw2 = lower(g, c600, plan)
    assert any(s.kind == "compute" and s.label == "encoder/cast_ln1" for s in lw2.steps)


def test_parameter_homes_compact_and_balanced_on_siglip(c600: simulator.Device) -> None:
    g = planner.load_model("siglip-so400m")
    plan = baseline_plan(g, c600)
    lw = lower(g, c600, plan)
    assert sorted(lw.homes) == list(g.parameters)
    for name, vname in lw.homes.items():
        v = lw.values[vname]
        t = g.tensor(name)
        rows, cols = view2d(v.shape)
        seen = np.zeros((rows, cols), dtype=np.int8)
        for ri, ci in v.layout.cells():
            r0, r1, c0, c1 = v.layout.rect(ri, ci)
            assert len(v.layout.cell_owners(ri, ci)) == 1
            seen[r0:r1, c0:c1] += 1
        assert (seen == 1).all(), name  # each element stored exactly once
        assert v.trips in (0, t.shape[0])
    per = np.array(parameter_tile_bytes(lw, c600.tiles))
    total = sum(g.tensor(p).nbytes for p in g.parameters)
    assert per.sum() == total
    assert per.max() / per.mean() <= 1.25


def test_policies(c600: simulator.Device) -> None:
    g = planner.load_model("vit-tiny", layers=1)
    known = r"baseline policy.*known: \['default', 'element', 'capacity'.*greedy"
    with pytest.raises(ConfigError, match=known):
        baseline_plan(g, c600, policy="greedy")


def test_capacity_policy_spreads_whole_rows_and_builds(micro_toml: Path) -> None:
    from planner.lowering.stages import build

    g = planner.load_model(micro_toml, layers=2)
    dev = simulator.load_device("tiny")
    plan = baseline_plan(g, dev, policy="capacity")
    assert plan.packing == "rows" and plan == baseline_plan(g, dev, policy="capacity")
    assert {order for _, order in plan.cast_order} <= {"before", "after"}
    lw = lower(g, dev, plan)
    for v in lw.values.values():
        if v.role in ("canonical", "input", "output"):
            rows = view2d(v.shape)[0]
            assert v.layout.nr == min(rows, -(-rows // -(-rows // dev.tiles)))
            assert max(np.diff(v.layout.row_cuts)) == -(-rows // dev.tiles)
    default = build(g, dev, baseline_plan(g, dev, policy="element"))
    built = build(g, dev, plan)
    params, inputs = planner.init_params(g, seed=0), planner.init_inputs(g, seed=1)
    want = planner.reference(g, params, inputs)["out"]
    sim = simulator.run(built.package, params=params, inputs=inputs, numerics=True)
    assert not sim.faults
    assert np.linalg.norm(sim.outputs["out"] - want) <= 1e-2 * np.linalg.norm(want)
    assert built.stats["peak_live_tensor_bytes"] <= default.stats["peak_live_tensor_bytes"]


def test_model_too_large_for_tiny_fails_naming_stage_tile_bytes() -> None:
    from planner.lowering.expand import expand_program

    dev = simulator.load_device("tiny")
    g = planner.load_model("vit-tiny", layers=1)
    with pytest.raises(BuildFailure) as e:
        expand_program(g, dev, baseline_plan(g, dev))
    assert e.value.stage == "expand" and e.value.tile >= 0
    assert e.value.need > e.value.have > 0
    assert e.value.profile and all(v > 0 for v in e.value.profile.values())
    assert f"tile {e.value.tile}" in str(e.value)


def test_persistent_overflow_fails_in_expand(micro_toml: Path) -> None:
    """27 layers of micro weights on one small tile: the homes alone overflow."""
    from planner.lowering.expand import expand_program

    dev = simulator.Device.from_dict({**simulator.load_device("tiny").to_dict(),
                                      "tiles": 2, "memory_size": 32768})
    g = planner.load_model(micro_toml, layers=40)
    with pytest.raises(BuildFailure) as e:
        expand_program(g, dev, baseline_plan(g, dev))
    assert e.value.stage == "expand" and e.value.need > e.value.have
    assert e.value.profile.get("persistent parameter", 0) > 0
