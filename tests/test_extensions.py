"""planner.search.registry: baseline policies, proposal kinds and optimizers by
name, from the CLI and through entry points (experiments/custom_policy.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import planner
import simulator
from planner.cli import main
from planner.ir.graph import Graph
from planner.pipeline import extension_rows
from planner.search.incumbent import PipelineConfig
from planner.search.policies import default_plan
from planner.search.profile import Profile
from planner.search.proposals import KINDS, proposals
from planner.search.registry import BASELINES, PROPOSALS
from tilecommon import registry
from tilecommon.errors import ConfigError
from tilecommon.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
TINY = simulator.load_device("tiny")


def test_entry_points_register_the_worked_example() -> None:
    from experiments import custom_policy

    assert BASELINES.get("overlapped") is custom_policy.overlapped
    assert PROPOSALS.get("row-moves") is custom_policy.row_moves
    rows = {(kind, name): module for kind, name, module, _ in extension_rows()}
    assert rows[("baseline policy", "overlapped")] == "experiments.custom_policy"
    assert rows[("optimizer", "local")] == "planner.search.optimize"
    assert {name for kind, name in rows if kind == "proposal kind"} >= set(KINDS)


def test_custom_policy_and_kind_plan(micro_graph: Graph) -> None:
    cfg = PipelineConfig(optimization_steps=2, baseline="overlapped", proposals=("row-moves",))
    res = planner.plan(micro_graph, TINY, cfg)
    base = default_plan(micro_graph, TINY, cfg.operator_candidate_limit, planner.PlanningContext())
    assert res.stats["baseline_policy"] == "overlapped"
    assert [r.kind for r in res.history] == ["row-moves", "row-moves"]
    moves = base.row_moves
    assert {r.description for r in res.history} == {
        f"row moves {moves} -> {moves // 2}", f"row moves {moves} -> {2 * moves}"}
    if not any(r.accepted for r in res.history):
        assert res.plan == base.with_reduction_overlap(True)


def test_a_registered_kind_joins_only_when_named(micro_graph: Graph) -> None:
    inc = planner.plan(micro_graph, TINY, PipelineConfig(optimization_steps=0))
    default = proposals(micro_graph, TINY, inc.plan, Profile.empty())
    assert {p.kind for p in default} <= set(KINDS)
    named = proposals(micro_graph, TINY, inc.plan, Profile.empty(), kinds=("row-moves",))
    assert named and {p.kind for p in named} == {"row-moves"}


def test_cli_names_extensions(micro_toml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(micro_toml), "--device", "tiny", "--no-numerics", "--json",
            "--optimization-steps", "1", "--baseline", "capacity", "--proposals", "row-moves"]
    assert main(["run", *args]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["baseline_policy"] == "capacity" and s["optimizer"] == "local"
    assert [p["kind"] for p in s["proposals"]] == ["row-moves"]
    for flag, bad in (("--baseline", "greedy"), ("--optimizer", "anneal"),
                      ("--proposals", "operator,bogus")):
        assert main(["run", str(micro_toml), "--device", "tiny", flag, bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0] and bad.split(",")[-1] in err[0]
    assert main(["extensions"]) == 0
    out = capsys.readouterr().out
    assert "overlapped" in out and "row-moves" in out and "capacity" in out


def test_registry_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    reg: Registry[object] = Registry("widget", "tileplan.widgets", "--widget")
    reg.register("a")(len)
    reg.register("a")(len)  # the same object again: no-op
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(max)
    broken = SimpleNamespace(name="b", value="nowhere.at_all:thing",
                             load=lambda: __import__("nowhere.at_all"))
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    with pytest.raises(ConfigError, match=r"tileplan.widgets.*'b'.*nowhere.at_all:thing"):
        reg.get("b")


def test_custom_policy_script_runs() -> None:
    """`python experiments/custom_policy.py` as a user runs it (vit-tiny, 1 layer)."""
    out = subprocess.run([sys.executable, "experiments/custom_policy.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("baseline ") and "-> final" in last
    base, final = (int(x.replace(",", "")) for x in
                   (last.split()[1], last.split("final ")[1].split()[0]))
    assert final <= base
    assert sum(1 for line in out.splitlines() if line.startswith("[")) == 8
