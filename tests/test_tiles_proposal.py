"""Per-op tile shifts: the Plan field, lowering that honours it, and the
`tiles` proposal that moves one op off the tiles it shares a merged step with."""

from __future__ import annotations

import pytest

import planner
import simulator
from planner.decide.layout import row_layout, spread_tiles
from planner.decide.plan import Plan
from planner.ir.graph import Graph, Tensor, make_graph
from planner.ir.ops.add import Add
from planner.ir.ops.gelu import Gelu
from planner.lowering.lower import lower
from planner.lowering.stages import plan_digest
from planner.report import REL_FRO_TOLERANCE, compare
from planner.search.incumbent import PipelineConfig, evaluate
from planner.search.optimize import LocalOptimizer, profile
from planner.search.plandiff import apply_change
from planner.search.policies import baseline_plan
from planner.search.proposals import proposals
from planner.search.tileload import phase_load, shifted, step_cycles
from simulator.device import Device
from tilecommon.errors import BuildFailure

TINY = simulator.load_device("tiny")
# 64 tiles x 256 KiB: canonical (128, 256) fp16 tensors have 4 owners (0, 16, 32, 48)
SMALL = Device.from_dict({**TINY.to_dict(), "name": "small", "tiles": 64,
                          "memory_size": 262144})


def two_gelus(m: int = 128, n: int = 256) -> Graph:
    """out = gelu(x1) + gelu(x2): two independent branches."""
    t = [Tensor("x1", (m, n), "fp16", "input"), Tensor("x2", (m, n), "fp16", "input"),
         Tensor("y1", (m, n), "fp16", "activation"), Tensor("y2", (m, n), "fp16", "activation"),
         Tensor("out", (m, n), "fp16", "output")]
    ops = [Gelu("g1", "x1", "y1"), Gelu("g2", "x2", "y2"), Add("add", "y1", "y2", "out")]
    return make_graph("two_gelus", t, ops, ["x1", "x2"], ["out"],
                      attrs=(("layers", 1), ("batch", 1)))


def _colliding(g: Graph) -> Plan:
    """g1 in 16 row blocks, g2 in 2: the move of y1 to its canonical owners
    (0, 16, 32, 48) and the move of x2 into g2's blocks (tiles 0 and 32)
    share an exchange step and both bring bytes into tiles 0 and 32."""
    return baseline_plan(g, SMALL, policy="element").with_recipes({"g1": "rows:8",
                                                                   "g2": "rows:64"})


# ------------------------------------------------------------ the plan field


def test_tile_shift_field_is_validated_sorted_and_described() -> None:
    p = Plan().with_tile_shift("b", 3).with_tile_shift("a", 5)
    assert p.tile_shift == (("a", 5), ("b", 3))
    assert p.shift("a") == 5 and p.shift("zz") == 0
    assert p.with_tile_shift("a", 0).tile_shift == (("b", 3),)  # 0 removes the shift
    assert p == Plan().with_tile_shift("a", 5).with_tile_shift("b", 3)
    assert "shift a by 5 tiles" in p.describe().splitlines()
    assert "shift" not in Plan().describe()
    with pytest.raises(ValueError, match="positive"):
        Plan(tile_shift=(("a", 0),))
    with pytest.raises(ValueError, match="sorted"):
        Plan(tile_shift=(("b", 1), ("a", 1)))
    with pytest.raises(ValueError, match="< 0"):
        Plan().with_tile_shift("a", -1)


def test_repr_and_digest_of_plans_without_shifts_are_unchanged() -> None:
    """build.plan_digest hashes repr(plan): a plan without shifts keeps the
    repr (and so the package hash) it had before the field existed."""
    p = Plan(recipes=(("g1", "rows:8"),), packing="half")
    assert repr(p) == ("Plan(recipes=(('g1', 'rows:8'),), open_boundaries=(), cast_order=(), "
                       "packing='half', reduction_overlap=False, tile_offset=0, tile_stride=1, "
                       "rotation=())")
    q = p.with_tile_shift("g1", 2)
    assert repr(q).endswith("rotation=(), tile_shift=(('g1', 2),))")
    assert eval(repr(q), {"Plan": Plan}) == q
    assert plan_digest(q) != plan_digest(p)


def test_apply_change_merges_and_removes_shifts() -> None:
    base = Plan().with_tile_shift("a", 4)
    first = base.with_recipe("x", "rows:1")
    moved = base.with_tile_shift("b", 2)
    assert apply_change(base, moved, first) == first.with_tile_shift("b", 2)
    unshifted = base.with_tile_shift("a", 0)
    assert apply_change(base, unshifted, first).tile_shift == ()
    assert apply_change(base, base.with_tile_shift("a", 7), first).shift("a") == 7


# ------------------------------------------------------------ lowering


def test_layout_helpers_shift_owners() -> None:
    plan = Plan()
    assert spread_tiles(4, 64, plan, 3) == (3, 19, 35, 51)
    assert spread_tiles(4, 64, plan, 62) == (62, 14, 30, 46)  # wraps
    lay = row_layout(8, 4, 2, 16, plan.with_tile_mapping(1, 3), shift=2)
    assert [o[0] for o in lay.owners] == [plan.with_tile_mapping(1, 3).physical(q, 16)
                                          for q in (2, 6, 10, 14)]


def test_shifted_row_op_moves_only_its_own_tiles() -> None:
    g = two_gelus()
    plan = _colliding(g)
    a = lower(g, SMALL, plan)
    b = lower(g, SMALL, plan.with_tile_shift("g2", 5))
    assert [(s.kind, s.label, s.inputs, s.outputs) for s in a.steps] == \
        [(s.kind, s.label, s.inputs, s.outputs) for s in b.steps]
    out2 = next(s.outputs[0] for s in a.steps if s.label == "g2")
    assert [o[0] for o in a.values[out2].layout.owners] == [0, 32]
    assert [o[0] for o in b.values[out2].layout.owners] == [5, 37]
    for name in sorted(a.values):
        if a.values[name].tensor not in ("y2",) and not name.startswith("x2@"):
            assert a.values[name].layout == b.values[name].layout, name


def test_shifted_matmul_takes_its_homes_along(micro_graph: Graph) -> None:
    """A matmul's grid moves by the shift with its weight and bias homes (they
    live on its readers); the rotation bases and every other home stay."""
    plan = baseline_plan(micro_graph, TINY, policy="element")
    a = lower(micro_graph, TINY, plan)
    b = lower(micro_graph, TINY, plan.with_tile_shift("encoder/mm_q", 3))
    assert a.rotation == b.rotation
    mm = next(s for s in a.steps if s.label == "encoder/mm_q")
    for v in mm.outputs:
        old, new = a.values[v].layout.owners, b.values[v].layout.owners
        assert new == tuple(tuple((t + 3) % TINY.tiles for t in o) for o in old)
    for name in sorted(a.homes):
        old, new = a.values[a.homes[name]].layout, b.values[b.homes[name]].layout
        if name in ("layers.w_q", "layers.b_q"):
            assert new.owners == tuple(tuple((t + 3) % TINY.tiles for t in o)
                                       for o in old.owners), name
        else:
            assert new == old, name


@pytest.mark.parametrize("op", ["encoder/split_q", "encoder/nope"])
def test_shift_of_an_op_without_placement_fails_lowering(micro_graph: Graph, op: str) -> None:
    with pytest.raises(BuildFailure, match="tile shift") as e:
        lower(micro_graph, TINY,
              baseline_plan(micro_graph, TINY, policy="element").with_tile_shift(op, 1))
    assert e.value.stage == "lower"


# ------------------------------------------------------------ the proposal


def test_profile_keeps_merged_steps(micro_graph: Graph) -> None:
    inc = evaluate(micro_graph, TINY, baseline_plan(micro_graph, TINY, policy="element"))
    prof = profile(inc)
    sched = inc.built.schedule
    multi = [st for st in sched.steps if len(st.labels) > 1]
    assert prof.merged and len(prof.merged) == len(multi)
    for m, st in zip(prof.merged, multi, strict=True):
        assert m.kind == st.kind
        assert [lab for lab, _, _ in m.phases] == list(st.labels)
        assert [(src, part) for _, src, part in m.phases] == list(st.phases)


def test_tile_load_model_matches_the_measured_merged_step() -> None:
    """The modelled per-tile loads of the one merged step (y1 to its
    canonical owners, x2 into g2's blocks) give its measured cycles; moving
    g2's side by 2 tiles takes 16 KiB off the busiest tiles."""
    g = two_gelus()
    inc = evaluate(g, SMALL, _colliding(g))
    merged = profile(inc).merged
    assert len(merged) == 1
    m = merged[0]
    assert m.kind == "exchange"
    assert m.phases[0][:2] == ("canon y1", "canon y1") and m.phases[1][1].startswith("to x2@")
    cycles = m.cycles
    lw = lower(g, SMALL, inc.plan)
    loads = [phase_load(lw, next(s for s in lw.steps if s.label == src), part, True, SMALL)
             for _, src, part in m.phases]
    # the busiest tile's three 16 KiB blocks, and one arrival latency (one row)
    assert step_cycles(loads, True, SMALL) == cycles == (
        SMALL.exchange_fixed_cycles + SMALL.costs.arrival_latency_cycles + 3 * 16384 // 4)
    moved = [loads[0], shifted(loads[1], ("bytes_in",), 2)]
    assert step_cycles(moved, True, SMALL) == cycles - 16384 // 4


def test_estimate_is_the_measured_gain_on_colliding_branches() -> None:
    g = two_gelus()
    inc = evaluate(g, SMALL, _colliding(g))
    props = proposals(g, SMALL, inc.plan, profile(inc), kinds=("tiles",))
    assert props and all(p.gain > 0 for p in props)
    best = props[0]
    assert best.description.startswith("shift g2 by ")
    trial = evaluate(g, SMALL, best.plan)
    # 16 KiB fewer bytes into tiles 0 and 32 at 4 bytes per cycle; the
    # shifted step's last arrival also comes from one row nearer (the
    # estimate leaves latency out)
    assert best.gain == 4096
    assert inc.cycles - trial.cycles == best.gain + SMALL.costs.arrival_latency_row_cycles


def test_tiles_proposal_accepted() -> None:
    """Moving g2 off the canonical owners of y1 lets the two moves that share
    a step run on different tiles; the optimizer accepts it."""
    g = two_gelus()
    base = evaluate(g, SMALL, _colliding(g))
    final, hist = LocalOptimizer(kinds=("tiles",))(g, SMALL, PipelineConfig(optimization_steps=2),
                                                   base)
    assert all(r.kind == "tiles" for r in hist)
    won = [r for r in hist if r.accepted]
    assert won and won[0].description.startswith("shift g2 by ")
    assert final.cycles == won[-1].cycles <= base.cycles - 4096
    assert final.plan.shift("g2") > 0
    simulator.verify(final.built.package)
    inputs = planner.init_inputs(g, seed=1)
    sim = simulator.run(final.built.package, params={}, inputs=inputs, numerics=True)
    assert sim.n_faults == 0 and sim.cycles == final.cycles
    rel, _ = compare(sim.outputs, planner.reference(g, {}, inputs))
    assert rel <= REL_FRO_TOLERANCE
