"""Per-op cycles (planner.breakdown) in every run summary: the rows add up to
the run's cycles exactly, name every op the lowering computes, and the step
kind totals and per-tile balance agree with the simulation."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.abi import STEP_EXCHANGE
from planner import PipelineConfig, load_model, run_model
from planner.breakdown import CONTROL, executions
from planner.lowering.lower import lower
from simulator import load_device, run


@pytest.fixture(scope="module")
def outcome():  # type: ignore[no-untyped-def]
    g, dev = load_model("vit-tiny", layers=2), load_device("c600")
    return g, dev, run_model(g, dev, PipelineConfig(optimization_steps=2), numerics=False)


def test_rows_add_up_to_the_total_and_name_every_computed_op(outcome) -> None:  # type: ignore[no-untyped-def]
    g, dev, out = outcome
    s = out.summary
    assert sum(o["cycles"] for o in s["ops"]) == s["cycles"]
    for o in s["ops"]:
        assert o["compute"] + o["exchange"] + o["sync"] == o["cycles"]
        assert sum(o["roles"].values()) == o["cycles"]
    computed = {st.label for st in lower(g, dev, out.result.plan).steps if st.kind == "compute"}
    names = {o["op"] for o in s["ops"]}
    assert computed <= names and names - computed <= {CONTROL}
    assert {o["family"] for o in s["ops"]} >= {"MatMul", "BatchMatMul", "Softmax", "LayerNorm"}


def test_totals_and_balance_agree_with_the_simulation(outcome) -> None:  # type: ignore[no-untyped-def]
    _, dev, out = outcome
    s, pkg = out.summary, out.result.package
    sim = run(pkg, numerics=False)
    assert sum(s["cycle_totals"].values()) == sim.cycles == s["cycles"]
    n_exchange = int((executions(pkg) * (pkg["step_kind"] == STEP_EXCHANGE)).sum())
    assert s["cycle_totals"]["sync"] == n_exchange * dev.costs.sync_cycles
    busy = sim.tile_busy[sim.tile_busy > 0]
    tb = s["tile_busy"]
    assert tb["max"] == busy.max() and tb["tiles"] == busy.size
    assert tb["imbalance"] == pytest.approx(busy.max() / busy.mean())
    assert sum(o["vertices"] for o in s["ops"]) == sim.vertex_invocations


def test_executions_count_repeat_iterations() -> None:
    from simulator.testing import repeat_program

    pkg = repeat_program(load_device("tiny"), 5)
    runs = executions(pkg)
    assert runs.max() == 5 and runs[0] == 1
    assert int((np.diff(pkg["step_vtx"]) * runs).sum()) == pkg.vertex_invocations()


def test_the_package_records_provenance_and_hashes_it(outcome, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from simulator import load_package, save_package

    g, dev, out = outcome
    pkg = out.result.package
    assert len(pkg.provenance) == pkg.n_steps and all(pkg.provenance)
    computed = {st.label for st in lower(g, dev, out.result.plan).steps if st.kind == "compute"}
    served = {op for step in pkg.provenance for op, _, _ in step}
    assert computed <= served
    roles = {role for step in pkg.provenance for _, _, role in step}
    assert {"compute", "input", "canonical", "parameter", "loop"} <= roles
    save_package(pkg, tmp_path / "p")
    assert load_package(tmp_path / "p").provenance == pkg.provenance
    m = json.loads((tmp_path / "p" / "package.json").read_text())
    m["provenance"][0][0][0] = "someone else"
    (tmp_path / "p" / "package.json").write_text(json.dumps(m))
    with pytest.raises(Exception, match="content hash mismatch"):
        load_package(tmp_path / "p")


def test_trace_spans_carry_graph_op_names(outcome) -> None:  # type: ignore[no-untyped-def]
    from simulator.trace import trace_events

    g, dev, out = outcome
    pkg = out.result.package
    sim = run(pkg, numerics=False)
    events = trace_events(pkg, sim)["traceEvents"]
    compute = [e for e in events if e.get("cat") == "compute"]
    assert compute and all(not e["name"].startswith("step ") for e in compute)
    named = " ".join(e["name"] for e in compute)
    for op in ("encoder/mm_q", "encoder/softmax", "encoder/mm_fc2"):
        assert f"{op} compute" in named
    assert all(e["args"]["ops"] for e in compute)


def test_trace_has_a_memory_counter_per_traced_tile(outcome) -> None:  # type: ignore[no-untyped-def]
    from simulator.trace import live_tensor_bytes, trace_events

    _, _, out = outcome
    pkg = out.result.package
    events = trace_events(pkg, run(pkg, numerics=False), tiles=[0, 7])["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C"]
    assert {e["tid"] for e in counters} == {0, 7}
    live = live_tensor_bytes(pkg, np.array([0, 7]))
    assert max(e["args"]["bytes"] for e in counters if e["tid"] == 7) == live[1].max() > 0
