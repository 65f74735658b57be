"""planner.search.proposals: ordered, deterministic neighbourhood changes of the incumbent."""

from __future__ import annotations

import dataclasses

import pytest

import simulator
from planner.ir.graph import Graph, op_sites
from planner.lowering.lower import lower
from planner.search.around import Proposal
from planner.search.incumbent import Incumbent, evaluate
from planner.search.optimize import profile
from planner.search.policies import baseline_plan
from planner.search.profile import Profile
from planner.search.proposals import KINDS, proposals
from tilecommon.errors import ConfigError

TINY = simulator.load_device("tiny")


@pytest.fixture(scope="module")
def incumbent(micro_graph: Graph) -> Incumbent:
    return evaluate(micro_graph, TINY, baseline_plan(micro_graph, TINY, policy="element"))


def test_ordered_by_gain_then_kind_and_description(micro_graph: Graph,
                                                    incumbent: Incumbent) -> None:
    prof = profile(incumbent)
    props = proposals(micro_graph, TINY, incumbent.plan, prof)
    again = proposals(micro_graph, TINY, incumbent.plan, dataclasses.replace(
        prof, moves=dict(reversed(list(prof.moves.items()))),
        ops=dict(reversed(list(prof.ops.items())))))
    assert props == again  # profile dict order does not matter
    keys = [(-p.gain, p.kind, p.description) for p in props]
    assert keys == sorted(keys)
    # micro has no K-split, and its merged steps are bound by canonical owners
    # (tile 0 holds every small canonical tensor), which no op shift moves
    assert {p.kind for p in props} == set(KINDS) - {"overlap", "tiles"}
    assert len({p.plan for p in props}) == len(props)  # no duplicate plans
    for p in props:
        assert "\n" not in p.description and p.description
        assert p.plan != incumbent.plan
    hash(props[0])  # frozen values can key caches


def test_unaffected_parameter_homes_stay(micro_graph: Graph, incumbent: Incumbent) -> None:
    """A recipe change moves only the parameter homes of the op it changes."""
    props = [p for p in proposals(micro_graph, TINY, incumbent.plan, profile(incumbent))
             if p.kind == "operator"]
    base = lower(micro_graph, TINY, incumbent.plan)
    sites = {s.name: s for s in op_sites(micro_graph)}
    moved_homes = 0
    for p in props:
        op_name = p.description.split(":")[0]
        site = sites[op_name]
        own = {f"{site.scope}{t}" for t in site.op.inputs}
        lw = lower(micro_graph, TINY, p.plan)
        for name in sorted(base.homes):
            before = base.values[base.homes[name]]
            after = lw.values[lw.homes[name]]
            if before.layout != after.layout:
                moved_homes += 1
                # the outer name of an iterated parameter is layers.<body name>
                assert any(name.endswith(o.split("/")[-1].split(".")[-1]) for o in own), \
                    (p.description, name)
    assert moved_homes > 0  # some proposals do move their own op's weights


def test_profile_accounts_for_the_cycles(incumbent: Incumbent) -> None:
    prof = profile(incumbent)
    sched = incumbent.built.schedule
    # a K-split's phases and a move's pack/unpack name the lowered step they expand
    for st in sched.steps:
        for lab, (src, part) in zip(st.labels, st.phases, strict=True):
            assert lab == (f"{src} {part}" if part else src)
    total = sum(prof.moves.values())
    steps = len(incumbent.built.schedule.steps)
    # each step's cycles are split among its labels (integer shares) and loop
    # overhead belongs to no label: the profile accounts for nearly everything
    assert incumbent.cycles * 0.97 <= total <= incumbent.cycles
    assert total >= incumbent.cycles - steps * 2 - 0.03 * incumbent.cycles


def test_unknown_kind(micro_graph: Graph, incumbent: Incumbent) -> None:
    with pytest.raises(ConfigError, match="proposal kind.*unknown.*bogus"):
        proposals(micro_graph, TINY, incumbent.plan, Profile.empty(), kinds=("bogus",))


def test_restricting_kinds(micro_graph: Graph, incumbent: Incumbent) -> None:
    props = proposals(micro_graph, TINY, incumbent.plan, profile(incumbent),
                      kinds=("cast", "open"))
    assert props and {p.kind for p in props} == {"cast", "open"}


def test_global_tile_mapping_is_cycle_neutral(micro_graph: Graph,
                                             incumbent: Incumbent) -> None:
    """Why the `tiles` kind shifts single ops and never proposes a global
    logical→physical mapping: tiles are homogeneous and the exchange is
    uniform all-to-all, so a permutation of all tiles leaves every step's
    cycles unchanged (Plan.tile_offset/tile_stride still work)."""
    for plan in (incumbent.plan.with_tile_mapping(8, 1), incumbent.plan.with_tile_mapping(0, 3)):
        trial = evaluate(micro_graph, TINY, plan)
        assert trial.cycles == incumbent.cycles
        assert trial.built.package.content_hash() != incumbent.built.package.content_hash()
    props = proposals(micro_graph, TINY, incumbent.plan, profile(incumbent))
    assert all((p.plan.tile_offset, p.plan.tile_stride) == (0, 1) for p in props)


def test_proposal_sorts_as_value() -> None:
    from planner.decide.plan import Plan

    a = Proposal("open", "b", 5, Plan())
    b = Proposal("cast", "a", 5, Plan(packing="half"))
    c = Proposal("tiles", "z", 9, Plan(packing="double"))
    assert sorted([a, b, c]) == [c, b, a]


def test_apply_change_replays_one_change_on_another() -> None:
    from planner.decide.plan import Plan
    from planner.search.plandiff import apply_change

    base = Plan(recipes=(("a", "rows:1"), ("b", "mm:1x1x1")), open_boundaries=("t",))
    first = base.with_recipe("a", "rows:2")
    second = base.with_open("u").with_open("t", False).with_packing("half")
    both = apply_change(base, second, first)
    assert both == first.with_open("u").with_open("t", False).with_packing("half")
    assert apply_change(base, base, first) == first
    assert apply_change(base, first, base) == first
    third = base.with_cast_order("c", "before").with_reduction_overlap(True)
    assert apply_change(base, third, first) == first.with_cast_order(
        "c", "before").with_reduction_overlap(True)


def test_next_round_proposes_the_replayed_change(micro_graph: Graph,
                                                 incumbent: Incumbent) -> None:
    """What speculation relies on: after accepting proposal A, the change of
    the next proposal B of another kind comes back as B replayed on A's plan
    (two packings are alternatives, not changes that compose; recipe
    alternatives are re-ranked around the new incumbent, so B is a boundary
    or cast change)."""
    from planner.search.around import pinned
    from planner.search.plandiff import apply_change

    props = proposals(micro_graph, TINY, incumbent.plan, profile(incumbent))
    a = props[0]
    b = next(p for p in props if p.kind not in (a.kind, "operator", "joint"))
    guess = apply_change(pinned(micro_graph, TINY, incumbent.plan), b.plan, a.plan)
    after = evaluate(micro_graph, TINY, a.plan)
    again = proposals(micro_graph, TINY, a.plan, profile(after))
    assert guess in {p.plan for p in again}


def test_op_costs_charge_every_lowered_step_once(micro_graph: Graph,
                                                  incumbent: Incumbent) -> None:
    """An op's measured cost (from the package's provenance) is its own steps
    + the conversions lowered for it + the move of its result to canonical;
    together they are the profile."""
    prof = profile(incumbent)
    lowered = lower(micro_graph, TINY, incumbent.plan)
    costs = prof.ops
    computes = [s.label for s in lowered.steps if s.kind == "compute"]
    assert sorted(costs) == sorted(set(computes))
    for name in costs:
        assert costs[name] >= prof.moves.get(name, 0)
    # only the Repeat's own steps (labelled with its name: carries) belong to no op
    loops = {s.label for s in lowered.steps if s.kind == "loop_begin"}
    total = sum(v for k, v in prof.moves.items() if k not in loops)
    assert sum(costs.values()) == total


def test_packing_gain_scales_canonical_moves() -> None:
    """The `packing` estimate: each measured canonical move's payload scales
    with the canonical rows per owner; element -> rows on vit-tiny ranks
    first (it is the largest measured win: 496k -> ~104k cycles)."""
    import planner
    from planner.decide.layout import canonical_rows_per_owner

    c600 = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    plan = baseline_plan(g, c600, policy="element")
    fixed = c600.exchange_fixed_cycles  # one sync and setup per move, not scaled
    to_ln1 = next(st.label for st in lower(g, c600, plan).steps
                  if st.label.startswith("to encoder/ln1@"))
    prof = Profile({"canon encoder/q": fixed + 4000, to_ln1: fixed + 1000,
                    "encoder/mm_q": 99}, {}, 0, ())
    props = {p.description: p.gain
             for p in proposals(g, c600, plan, prof, kinds=("packing",))}
    rpo = canonical_rows_per_owner(197, 192, 2, c600.element_bytes, c600.tiles)
    assert rpo == 42
    for packing, new in (("rows", 1), ("half", 21), ("double", 85)):
        assert canonical_rows_per_owner(197, 192, 2, c600.element_bytes, c600.tiles,
                                        packing) == new
        assert props[f"canonical packing element -> {packing}"] == round(5000 * (1 - new / 42))
    assert max(props, key=props.__getitem__) == "canonical packing element -> rows"


def test_packing_moves_canonical_row_ops_along() -> None:
    """Row ops that ran on the canonical owners follow the new packing's
    owners (rows:42 -> rows:1 on vit-tiny); every other recipe stays."""
    import planner

    c600 = simulator.load_device("c600")
    g = planner.load_model("vit-tiny", layers=1)
    plan = baseline_plan(g, c600, policy="element")
    prop = next(p for p in proposals(g, c600, plan, Profile({"canon encoder/q": 5000}, {}, 0, ()),
                                     kinds=("packing",))
                if p.description.endswith("-> rows"))
    assert prop.plan.packing == "rows"
    moved = 0
    for name, key in plan.recipes:
        if key == "rows:42":
            assert prop.plan.recipe(name) == "rows:1"
            moved += 1
        else:
            assert prop.plan.recipe(name) == key
    assert moved >= 3  # add_pos, add_attn, add_mlp run on the canonical owners


def test_cast_proposal_runs_the_cast_on_its_canonical_owners(micro_graph: Graph,
                                                             incumbent: Incumbent) -> None:
    """Early casting pins the Cast to its input's canonical owners, so the
    wide value does not move before it is narrowed."""
    from planner.decide.layout import canonical_rows_per_owner, view2d
    from planner.ir.graph import DTYPE_BYTES

    props = proposals(micro_graph, TINY, incumbent.plan, profile(incumbent), kinds=("cast",))
    assert props
    sites = {s.name: s for s in op_sites(micro_graph)}
    for p in props:
        name = p.description.removeprefix("cast ").removesuffix(" before redistribution")
        x = sites[name].graph.tensor(sites[name].op.inputs[0])
        rows, cols = view2d(x.shape)
        rpo = canonical_rows_per_owner(rows, cols, DTYPE_BYTES[x.dtype], TINY.element_bytes,
                                       TINY.tiles, incumbent.plan.packing)
        assert p.plan.cast_before(name) and p.plan.recipe(name) == f"rows:{rpo}"
        text = lower(micro_graph, TINY, p.plan).describe()
        assert f"compute {name} [rows:{rpo}]" in text


def test_inplace_runs_where_the_input_arrives(micro_graph: Graph,
                                              incumbent: Incumbent) -> None:
    """An `inplace` proposal runs an elementwise op (recipe rows:0) on the
    cells its producer wrote, on each cell's first owner, its boundary open:
    no move between them, and the same numbers."""
    import numpy as np

    import planner
    from planner.lowering.stages import build

    props = [p for p in proposals(micro_graph, TINY, incumbent.plan, profile(incumbent))
             if p.kind == "inplace"]
    assert props
    params = planner.init_params(micro_graph, seed=0)
    inputs = planner.init_inputs(micro_graph, seed=1)
    want = planner.reference(micro_graph, params, inputs)
    for p in props:
        name = p.description.split(" in place")[0]
        assert p.plan.recipe(name) == "rows:0"
        lw = lower(micro_graph, TINY, p.plan)
        step = next(s for s in lw.steps if s.kind == "compute" and s.label == name)
        made = next(s for s in lw.steps if step.inputs[0] in s.outputs)
        assert made.kind == "compute", (name, made.label)  # straight from its producer
        lead = lw.values[step.inputs[0]].layout
        out = lw.values[step.outputs[0]].layout
        assert (out.row_cuts, out.col_cuts) == (lead.row_cuts, lead.col_cuts)
        assert out.owners == tuple((o[0],) for o in lead.owners)
        sim = simulator.run(build(micro_graph, TINY, p.plan).package, params=params,
                            inputs=inputs, numerics=True)
        assert not sim.faults
        for t, ref in want.items():
            assert np.linalg.norm(sim.outputs[t] - ref) <= 1e-2 * np.linalg.norm(ref), name


def test_in_place_recipe_only_by_key(micro_graph: Graph) -> None:
    """rows:0 is asked for, never shortlisted, and only for elementwise ops."""
    from planner.decide import catalogue as cat

    sites = {s.op.kind: s for s in op_sites(micro_graph)}
    gelu, ln = sites["Gelu"], sites["LayerNorm"]
    r = cat.recipe_from_key(gelu.graph, gelu.op, TINY, "rows:0")
    assert r.key == "rows:0" and r.grid == (0,) and r.cycles > 0
    assert all(x.key != "rows:0" for x in cat.catalogue(gelu.graph, gelu.op, TINY, 64))
    with pytest.raises(KeyError):
        cat.recipe_from_key(ln.graph, ln.op, TINY, "rows:0")


def test_open_lets_a_move_op_read_where_the_producer_wrote(micro_graph: Graph,
                                                           incumbent: Incumbent) -> None:
    """Opening the boundary into a SplitHeads / MergeHeads: the value is not
    moved to canonical first, the move op's redistribution starts from the
    producer's cells, the gain is the measured canonical move, and the
    numbers stay."""
    import numpy as np

    import planner
    from planner.lowering.provenance import move_role
    from planner.lowering.stages import build
    from planner.search.around import Around

    prof = profile(incumbent)
    around = Around(micro_graph, TINY, incumbent.plan, prof, 8)
    movers = {f"{s.scope}{s.op.outputs[0]}": s.op for s in op_sites(micro_graph)
              if s.op.FAMILY == "move"}
    props = [p for p in proposals(micro_graph, TINY, incumbent.plan, prof, kinds=("open",))
             if p.description.split("(into ")[1].rstrip(")").split("/")[-1]
             in {op.name for op in movers.values()}]
    assert props
    params = planner.init_params(micro_graph, seed=0)
    inputs = planner.init_inputs(micro_graph, seed=1)
    want = planner.reference(micro_graph, params, inputs)
    for p in props:
        q = p.description.split("open boundary ")[1].split(" (into")[0]
        assert p.gain == around.measured_moves("canonical", q) > 0
        cons = p.description.split("(into ")[1].rstrip(")")
        for plan, canonical in ((incumbent.plan, True), (p.plan, False)):
            lw = lower(micro_graph, TINY, plan)
            assert any(s.kind == "redistribute" and move_role(lw, s) == "canonical"
                       and lw.values[s.outputs[0]].tensor == q for s in lw.steps) == canonical
            mover = next(s for s in lw.steps if s.label == cons)
            made = next(s for s in lw.steps if mover.inputs[0] in s.outputs)
            # the move op reads the canonical value, or what its producer computed
            assert made.kind == ("redistribute" if canonical else "compute"), (q, made.label)
        sim = simulator.run(build(micro_graph, TINY, p.plan).package, params=params,
                            inputs=inputs, numerics=True)
        assert not sim.faults
        for t, ref in want.items():
            assert np.linalg.norm(sim.outputs[t] - ref) <= 1e-2 * np.linalg.norm(ref), q
