"""planner.search.optimize: bounded, strictly-improving local search with in-order
decisions; speculation never changes the result; every kind can win."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import planner
import simulator
from planner.ir.graph import Graph, Tensor, make_graph
from planner.ir.ops.add import Add
from planner.ir.ops.cast import Cast
from planner.ir.ops.matmul import MatMul
from planner.lowering import stages as cache_mod
from planner.pipeline import plan as pipeline_plan
from planner.report import REL_FRO_TOLERANCE, compare
from planner.search import optimize
from planner.search.around import Proposal
from planner.search.context import PlanningContext
from planner.search.incumbent import Incumbent, PipelineConfig, evaluate
from planner.search.optimize import LocalOptimizer, Record
from planner.search.policies import baseline_plan
from simulator.device import Device

ROOT = Path(__file__).resolve().parents[1]
TINY = simulator.load_device("tiny")
# 64 tiles x 256 KiB: room for canonical tensors of several 16 KiB elements
SMALL = Device.from_dict({**TINY.to_dict(), "name": "small", "tiles": 64,
                          "memory_size": 262144})
PACKING_TOML = """\
name = "vit-packing"
hidden = 64
heads = 2
mlp = 256
patch = 4
channels = 3
tokens = 65
layers = 1
batch = 4
eps = 1e-6
"""


def two_matmuls(m: int = 32, k: int = 512, n: int = 32) -> Graph:
    """out = x8 @ w1 + x8 @ w2: two independent K-split matmuls, then an Add."""
    t = [Tensor("x", (m, k), "fp16", "input"), Tensor("x8", (m, k), "fp8", "activation", -2),
         Tensor("w1", (k, n), "fp8", "parameter", -6),
         Tensor("w2", (k, n), "fp8", "parameter", -6),
         Tensor("y1", (m, n), "fp16", "activation"), Tensor("y2", (m, n), "fp16", "activation"),
         Tensor("out", (m, n), "fp16", "output")]
    ops = [Cast("cast", "x", "x8"), MatMul("mm1", "x8", "w1", "y1"),
           MatMul("mm2", "x8", "w2", "y2"), Add("add", "y1", "y2", "out")]
    return make_graph("two", t, ops, ["x"], ["out"], attrs=(("layers", 1), ("batch", 1)))


@pytest.fixture(scope="module")
def packing_graph() -> Graph:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "vit-packing.toml"
        path.write_text(PACKING_TOML)
        return planner.load_model(path)


def _baseline(g: Graph, dev: Device) -> Incumbent:
    return evaluate(g, dev, baseline_plan(g, dev, policy="element"))


def _hash(inc: Incumbent) -> str:
    return inc.built.package.content_hash()


def _fixed(props: list[Proposal]):
    """A `proposals` stand-in returning `props` around the first incumbent only."""
    calls: list[int] = []

    def gen(graph, device, plan, prof, limit, kinds, ctx):  # noqa: ANN001, ANN202
        calls.append(1)
        return list(props) if len(calls) == 1 else []

    return gen


# ------------------------------------------------------------ decisions


def test_steps_zero_is_exactly_the_baseline(micro_graph: Graph) -> None:
    res = planner.plan(micro_graph, TINY, PipelineConfig(optimization_steps=0))
    ref = pipeline_plan(micro_graph, TINY, PipelineConfig(optimization_steps=0))
    assert res.history == () and res.cycles == res.baseline_cycles == ref.cycles
    assert res.package.content_hash() == ref.package.content_hash()


def test_slower_and_failed_proposals_keep_the_incumbent(
        micro_graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _baseline(micro_graph, TINY)
    slower = base.plan.with_recipes({"encoder/mm_q": "mm:1x1x16", "encoder/mm_k": "mm:1x1x16"})
    broken = base.plan.with_recipe("encoder/mm_v", "mm:bogus")
    props = [Proposal("operator", "slower", 100, slower),
             Proposal("operator", "broken", 50, broken)]
    monkeypatch.setattr(optimize, "proposals", _fixed(props))
    final, hist = LocalOptimizer()(micro_graph, TINY, PipelineConfig(optimization_steps=8),
                                   base)
    assert final is base and _hash(final) == _hash(base)
    assert [(r.description, r.built, r.accepted) for r in hist] == [
        ("slower", True, False), ("broken", False, False)]
    assert hist[0].cycles is not None and hist[0].cycles > base.cycles
    assert hist[1].cycles is None and "unknown recipe" in hist[1].why
    assert "not built: " in hist[1].line()


def test_failed_build_never_replaces_but_later_win_does(
        packing_graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real allocation failure (double packing does not fit) is recorded and
    skipped; the next, cheaper proposal is accepted."""
    base = _baseline(packing_graph, SMALL)
    props = [Proposal("packing", "double", 10, base.plan.with_packing("double")),
             Proposal("packing", "half", 5, base.plan.with_packing("half"))]
    monkeypatch.setattr(optimize, "proposals", _fixed(props))
    final, hist = LocalOptimizer()(packing_graph, SMALL, PipelineConfig(optimization_steps=8),
                                   base)
    assert [r.built for r in hist] == [False, True]
    assert hist[0].why.startswith("allocate")
    assert hist[1].accepted and final.cycles == hist[1].cycles < base.cycles
    assert final.plan.packing == "half"


def test_budget_bounds_builds(micro_graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []
    real = cache_mod.build_program

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cache_mod, "build_program", counting)
    base = _baseline(micro_graph, TINY)
    for steps in (1, 3, 5):
        builds.clear()
        final, hist = LocalOptimizer()(micro_graph, TINY,
                                       PipelineConfig(optimization_steps=steps), base,
                                       PlanningContext())
        assert len(hist) == steps and len(builds) <= steps
        assert final.cycles == min([base.cycles] + [r.cycles for r in hist if r.accepted])


def test_jobs_two_same_result_as_serial(micro_graph: Graph) -> None:
    """Each `planner.plan` call has its own planning context, so the parallel
    runs really build (nothing is inherited from the serial run)."""
    cfg1 = PipelineConfig(optimization_steps=6, jobs=1)
    cfg2 = PipelineConfig(optimization_steps=6, jobs=2)
    serial = planner.plan(micro_graph, TINY, cfg1)
    parallel = planner.plan(micro_graph, TINY, cfg2)
    with ThreadPoolExecutor(2) as pool:
        threaded = planner.plan(micro_graph, TINY, cfg2, LocalOptimizer(executor=pool))
    h = serial.package.content_hash()
    assert parallel.package.content_hash() == h == threaded.package.content_hash()
    key = [(r.kind, r.description, r.cycles, r.accepted) for r in serial.history]
    for res in (parallel, threaded):
        assert [(r.kind, r.description, r.cycles, r.accepted) for r in res.history] == key
        assert len(res.history) <= 6
        consumed = sum(1 for r in res.history if r.speculative)
        assert res.stats["speculative_builds"] > 0
        assert (res.stats["speculative_builds"] - res.stats["speculative_discarded"]
                == consumed)
    assert serial.stats["speculative_builds"] == 0
    assert any(r.accepted for r in serial.history)
    assert parallel.stats["speculative_rebuilt"] == sum(
        1 for r in parallel.history if r.speculative and r.accepted)
    for res in (serial, parallel, threaded):  # every trial built once, counted once
        assert res.stats["cache"]["trial"]["misses"] >= len(res.history)


def test_final_package_verifies_and_matches_reference(micro_graph: Graph) -> None:
    res = planner.plan(micro_graph, TINY, PipelineConfig(optimization_steps=6))
    assert res.cycles < res.baseline_cycles
    simulator.verify(res.package)
    params = planner.init_params(micro_graph, seed=0)
    inputs = planner.init_inputs(micro_graph, seed=1)
    sim = simulator.run(res.package, params=params, inputs=inputs, numerics=True)
    assert sim.n_faults == 0 and sim.cycles == res.cycles
    rel, _ = compare(sim.outputs, planner.reference(micro_graph, params, inputs))
    assert rel <= REL_FRO_TOLERANCE


def test_record_line_and_dict() -> None:
    r = Record("cast", "cast c before redistribution", 10, True, "", 1234, True, 0.5, False)
    assert r.line() == "[cast] cast c before redistribution: 1,234 cycles; ACCEPTED (0.50 s)"
    assert r.as_dict()["cycles"] == 1234


# ------------------------------------------------------------ every kind can win


def _accepted_kinds(g: Graph, dev: Device, base: Incumbent, kinds: tuple[str, ...],
                    steps: int = 8) -> tuple[Incumbent, list[Record]]:
    final, hist = LocalOptimizer(kinds=kinds)(g, dev, PipelineConfig(optimization_steps=steps),
                                              base)
    assert all(r.kind in kinds for r in hist)
    return final, list(hist)


@pytest.mark.parametrize("kind", ["operator", "joint", "open", "cast"])
def test_kind_accepted_on_micro_vit(micro_graph: Graph, kind: str) -> None:
    base = _baseline(micro_graph, TINY)
    final, hist = _accepted_kinds(micro_graph, TINY, base, (kind,))
    won = [r for r in hist if r.accepted]
    assert won and final.cycles == won[-1].cycles < base.cycles
    simulator.verify(final.built.package)


def test_packing_accepted(packing_graph: Graph) -> None:
    """Canonical tensors of several 16 KiB elements: more owners (whole rows
    over the device, or half-element blocks) shorten every canonical
    redistribution; the estimate ranks whole rows first."""
    base = _baseline(packing_graph, SMALL)
    final, hist = _accepted_kinds(packing_graph, SMALL, base, ("packing",), steps=2)
    assert hist[0].description == "canonical packing element -> rows" and hist[0].accepted
    assert final.plan.packing in ("rows", "half") and final.cycles < 0.8 * base.cycles


def test_reduction_overlap_accepted() -> None:
    """Two independent K-split matmuls whose results go straight to the Add
    (open boundaries): with overlap, mm1's reduction shares a superstep with
    mm2's partial products.  Narrow pieces packed (row_moves 0): the unpack
    phase after the result moves is what a reduction is delayed past."""
    g = two_matmuls()
    plan0 = baseline_plan(g, TINY, policy="element")
    assert int(plan0.recipe("mm1").rpartition("x")[2]) > 1  # the baseline K-splits
    base = evaluate(g, TINY, plan0.with_open("y1").with_open("y2").with_row_moves(0))
    final, hist = _accepted_kinds(g, TINY, base, ("overlap",), steps=1)
    assert hist[0].accepted and final.plan.reduction_overlap
    assert final.built.stats["delayed_reductions"] >= 1


def test_every_accepted_step_reverifies(micro_graph: Graph,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = optimize.verify

    def counting(pkg):  # noqa: ANN001, ANN202
        calls.append(pkg.content_hash())
        return real(pkg)

    monkeypatch.setattr(optimize, "verify", counting)
    res = planner.plan(micro_graph, TINY, PipelineConfig(optimization_steps=5))
    accepted = [r for r in res.history if r.accepted]
    assert accepted and len(calls) == len(accepted)
    assert calls[-1] == res.package.content_hash()


def test_a_failed_reverification_fails_the_run(micro_graph: Graph,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-verification runs beside the next build, but what it raises
    still ends the run (here the first accepted package's check fails)."""
    from tilecommon.errors import PackageInvalid

    def failing(pkg):  # noqa: ANN001, ANN202
        raise PackageInvalid(f"planted: {pkg.content_hash()[:12]}")

    monkeypatch.setattr(optimize, "verify", failing)
    with pytest.raises(PackageInvalid, match="planted"):
        planner.plan(micro_graph, TINY, PipelineConfig(optimization_steps=5))


def test_a_build_the_verifier_rejects_fails_after_its_simulation(
        micro_graph: Graph, monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate verifies beside the timing simulation, and what it returns is
    verified: a rejected package is BuildFailure("verify"), as from build."""
    from planner.lowering import stages
    from tilecommon.errors import BuildFailure, PackageInvalid

    plan0 = baseline_plan(micro_graph, TINY)
    inc = evaluate(micro_graph, TINY, plan0)
    assert [s for s, _ in inc.built.timings][-1] == "verify" and inc.cycles > 0

    def rejecting(pkg):  # noqa: ANN001, ANN202
        raise PackageInvalid(f"planted {pkg.n_steps}")

    monkeypatch.setattr(stages, "verify", rejecting)
    with pytest.raises(BuildFailure, match="verify.*planted"):
        evaluate(micro_graph, TINY, plan0)


def test_same_final_hash_under_different_hash_seeds(micro_toml: Path) -> None:
    hashes = []
    for seed in ("0", "777"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        env.setdefault("NUMBA_CACHE_DIR", "/tmp/numba_cache")
        out = subprocess.run(
            [sys.executable, "-m", "planner", "plan", str(micro_toml), "--device", "tiny",
             "--json", "--optimization-steps", "4"],
            env=env, capture_output=True, text=True, check=True, cwd=ROOT)
        s = json.loads(out.stdout)
        assert s["proposals_evaluated"] == 4
        hashes.append((s["package_hash"], [p["description"] for p in s["proposals"]]))
    assert hashes[0] == hashes[1]


# ------------------------------------------------------------ full-size models


@pytest.mark.slow
def test_vit_tiny_optimized_package_matches_reference() -> None:
    g = planner.load_model("vit-tiny", layers=2)
    dev = simulator.load_device("c600")
    res = planner.plan(g, dev, PipelineConfig(optimization_steps=8))
    assert len(res.history) == 8 and res.cycles < res.baseline_cycles
    simulator.verify(res.package)
    params, inputs = planner.init_params(g, seed=0), planner.init_inputs(g, seed=1)
    sim = simulator.run(res.package, params=params, inputs=inputs, numerics=True)
    assert sim.n_faults == 0 and sim.cycles == res.cycles
    rel, _ = compare(sim.outputs, planner.reference(g, params, inputs))
    assert rel <= REL_FRO_TOLERANCE


@pytest.mark.slow
def test_siglip_one_layer_at_least_15_percent_fewer_cycles() -> None:
    """The optimizer's quality target, timing only (siglip's numerics are checked
    against the fp32 model by the pipeline's slow test)."""
    g = planner.load_model("siglip-so400m", layers=1)
    dev = simulator.load_device("c600")
    res = planner.plan(g, dev, PipelineConfig(optimization_steps=8))
    assert res.cycles <= 0.85 * res.baseline_cycles
    simulator.verify(res.package)
    assert simulator.run(res.package, numerics=False).n_faults == 0


def test_overlap_estimate_counts_what_the_flag_changes() -> None:
    """The `overlap` gain: half a K-split matmul's share of the measured
    reductions when its next compute step is independent (mm1, before mm2;
    not mm2, whose result the Add reads); no exchange step here fetches
    parameters alone (each would add a sync and setup)."""
    from planner.search.around import Around
    from planner.search.kinds.overlap import overlap_gain
    from planner.search.optimize import profile

    g = two_matmuls()
    plan0 = baseline_plan(g, TINY, policy="element")
    base = evaluate(g, TINY, plan0.with_open("y1").with_open("y2").with_row_moves(0))
    prof = profile(base)
    assert prof.reduction > 0
    assert overlap_gain(Around(g, TINY, base.plan, prof, 8)) == prof.reduction // 2 // 2
