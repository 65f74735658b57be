"""Fused sibling matmuls (planner.decide.fusion): which ops are siblings, a
fused build that agrees with the reference bit for bit and costs less, the
plan errors, and the `fuse` proposal kind in the optimizer."""

from __future__ import annotations

from pathlib import Path

import pytest

import planner
import simulator
from planner.decide import fusion
from planner.decide.plan import Plan
from planner.ir.reference import init_inputs, init_params, reference
from planner.lowering.stages import build
from planner.pipeline import run_model
from planner.report import compare
from planner.search.incumbent import PipelineConfig
from planner.search.policies import baseline_plan
from simulator.device import load_device
from tilecommon.errors import BuildFailure

MICRO = (Path(planner.__file__).parent / "ir" / "zoo" / "vit-micro.toml").read_text()
QKV, HEAD_KV = "encoder/mm_q+mm_k+mm_v", "mm_head_k+mm_head_v"


@pytest.fixture()
def graph(tmp_path: Path) -> planner.Graph:
    path = tmp_path / "m.toml"
    path.write_text(MICRO.replace('name = "vit-micro"', 'name = "m"') + 'pool = "map"\n')
    return planner.load_model(path)


def test_sibling_groups(graph: planner.Graph) -> None:
    body = graph.op("encoder").body  # type: ignore[union-attr]
    groups = fusion.sibling_groups(body)
    assert [fusion.group_key("encoder/", grp) for grp in groups] == [QKV]
    assert [fusion.group_key("", grp) for grp in fusion.sibling_groups(graph)] == [HEAD_KV]
    fg, op = fusion.fused_graph(body, groups[0])
    assert fg.tensor("w").shape == (32, 96) and fg.tensor("out").shape == (20, 96)


def test_fused_build_is_exact_and_cheaper(graph: planner.Graph) -> None:
    dev = load_device("tiny")
    plain = baseline_plan(graph, dev)
    fused = plain.with_fused(QKV).with_fused(HEAD_KV)
    params, inputs = init_params(graph, 0), init_inputs(graph, 1)
    ref = reference(graph, params, inputs)
    cycles = []
    for plan in (plain, fused):
        pkg = build(graph, dev, plan).package
        sim = simulator.run(pkg, params=params, inputs=inputs)
        assert sim.n_faults == 0 and compare(sim.outputs, ref) == (0.0, 0.0)
        cycles.append(sim.cycles)
    assert cycles[1] < cycles[0]
    lowered = planner.lower(graph, dev, fused)
    members = [s for s in lowered.steps if s.fused == QKV]
    assert [s.label for s in members] == ["encoder/mm_q", "encoder/mm_k", "encoder/mm_v"]
    a_values = {s.inputs[0] for s in members}
    assert len(a_values) == 1  # the shared input is converted once for the group


def test_plan_errors(graph: planner.Graph) -> None:
    dev = load_device("tiny")
    plan = baseline_plan(graph, dev)
    with pytest.raises(BuildFailure, match="no such sibling"):
        build(graph, dev, plan.with_fused("encoder/mm_q+mm_o"))
    with pytest.raises(BuildFailure, match="unknown recipe"):
        build(graph, dev, plan.with_fused(QKV).with_recipe(QKV, "mm:bogus"))
    with pytest.raises(ValueError, match="sorted unique"):
        Plan(fused=("b", "a"))
    assert "fused" not in repr(Plan()) and "fused" in repr(Plan(fused=("a",)))


def test_fuse_proposals_in_the_optimizer(graph: planner.Graph) -> None:
    out = run_model(graph, load_device("tiny"),
                    PipelineConfig(optimization_steps=2, proposals=("fuse",)))
    res = out.result
    assert [h.kind for h in res.history] == ["fuse", "fuse"]
    assert all(h.accepted for h in res.history) and res.cycles < res.baseline_cycles
    assert res.plan.fused == (QKV, HEAD_KV) or res.plan.fused == (HEAD_KV, QKV)
    assert out.summary["rel_fro_error"] == 0.0
