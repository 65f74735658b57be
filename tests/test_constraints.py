"""planner.decide.constraints and the CLI's --constraints / --save-plan / candidates:
pins hold in the baseline and through the optimizer, a saved plan replays to the
same package, and every bad pin is one line naming file, table and key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner
from planner.cli import main
from planner.decide.constraints import load_constraints, parse_constraints, plan_toml, resolve
from planner.search.incumbent import PipelineConfig
from simulator.device import load_device
from tilecommon.errors import ConfigError

TINY = load_device("tiny")


@pytest.fixture(scope="module")
def micro() -> planner.Graph:
    return planner.load_model("vit-micro")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    status = main(["run", *argv, "--json", "--quiet"])
    out = capsys.readouterr().out.strip().splitlines()
    return status, json.loads(out[-1]) if status in (0, 1) else {}


@pytest.mark.parametrize("model", [("vit-micro", "--device", "tiny"),
                                   ("vit-tiny", "--layers", "2")], ids=["micro", "vit-tiny"])
def test_save_then_replay_gives_the_same_package(tmp_path: Path, model: tuple[str, ...],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "plan.toml"
    status, first = _run(capsys, *model, "--save-plan", str(saved))
    assert status == 0 and first["proposals_accepted"] >= 1  # a plan the baseline is not
    text = saved.read_text()
    assert "exact = true" in text and first["package_hash"] in text
    status, again = _run(capsys, *model, "--constraints", str(saved),
                         "--optimization-steps", "0")
    assert status == 0 and again["package_hash"] == first["package_hash"]
    assert again["cycles"] == first["cycles"]


def test_a_pinned_recipe_is_built_and_never_proposed_away(
        micro: planner.Graph, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx = planner.PlanningContext()
    default = planner.baseline_plan(micro, TINY, 8, "default", ctx)
    from planner.decide.constraints import candidates

    offered = [c for c in candidates(micro, TINY, default, "encoder/mm_fc1")]
    chosen = next(c.recipe for c in offered if c.chosen)
    other = next(c.recipe for c in offered if not c.chosen)
    pins = tmp_path / "pin.toml"
    pins.write_text(f'[recipes]\n"encoder/mm_fc1" = "{other}"\n')
    c = load_constraints(pins)
    res = planner.plan(micro, TINY, PipelineConfig(optimization_steps=0, constraints=c))
    assert res.plan.recipe("encoder/mm_fc1") == other != chosen
    assert {k: v for k, v in res.plan.recipes if k != "encoder/mm_fc1"} == \
        {k: v for k, v in default.recipes if k != "encoder/mm_fc1"}  # nothing else moved
    prov = {op for step in res.package.provenance for op, _, _ in step}
    assert "encoder/mm_fc1" in prov
    # the optimizer: proposals on mm_fc1's recipe are skipped and cost no step
    pins.write_text('[recipes]\n"encoder/mm_*" = "' + chosen + '"\n[plan]\npacking = "'
                    + default.packing + '"\n')
    status, s = _run(capsys, "vit-micro", "--device", "tiny", "--constraints", str(pins))
    assert status == 0
    status = main(["run", "vit-micro", "--device", "tiny", "--constraints", str(pins),
                   "--quiet", "--no-numerics"])
    out = capsys.readouterr().out
    assert status == 0 and "skipped as pinned" in out and "not evaluated" in out
    assert "packing is pinned" in out or "recipe is pinned" in out


@pytest.mark.parametrize("text, field, words", [
    ('[recipes]\n"encoder/mm_nothing" = "mm:1x1x1"\n', "recipes.encoder/mm_nothing",
     "matches no op"),
    ('[recipes]\n"encoder/mm_fc1" = "mm:99999x1x1"\n', "recipes.encoder/mm_fc1",
     "has no recipe"),
    ('[recipes]\n"encoder/mm_fc1" = "bogus"\n', "recipes.encoder/mm_fc1", "its catalogue offers"),
    ('[recipes]\n"zzz*" = "rows:1"\n', "recipes.zzz*", "matches no op"),
    ('[cast]\n"encoder/mm_fc1" = "before"\n', "cast.encoder/mm_fc1", "not a Cast"),
    ('[cast]\n"encoder/cast_ln1" = "sideways"\n', "cast.encoder/cast_ln1", "one of"),
    ('[open]\n"encoder/nope" = true\n', "open.encoder/nope", "matches no tensor"),
    ('[fused]\n"encoder/mm_fc1" = true\n', "fused.encoder/mm_fc1", "sibling-matmul group"),
    ('[shift]\n"encoder/gelu" = -2\n', "shift.encoder/gelu", "integer >= 0"),
    ('[plan]\npacking = "tight"\n', "plan.packing", "one of"),
    ('[plan]\ncolour = "red"\n', "plan.colour", "unknown field"),
    ('[nonsense]\nx = 1\n', "nonsense", "unknown table"),
    ('[recipes\n', "toml", "not valid TOML"),
])
def test_bad_pins_exit_2_naming_them(tmp_path: Path, text: str, field: str, words: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["plan", "vit-micro", "--device", "tiny", "--constraints", str(path),
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and f"'{field}'" in err[0] and words in err[0]


def test_a_pin_that_cannot_fit_exits_3(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """vit-tiny's fc1 on one tile of the 16: its 147 kB of fp8 weights and the
    whole activation do not fit beside everything else tile 0 holds."""
    path = tmp_path / "one.toml"
    path.write_text('[recipes]\n"encoder/mm_fc1" = "mm:1x1x1"\n')
    status = main(["plan", "vit-tiny", "--device", "tiny", "--layers", "1", "--constraints",
                   str(path), "--quiet", "--optimization-steps", "0"])
    err = capsys.readouterr().err
    assert status == 3 and "tile" in err and "bytes" in err, err


def test_plan_toml_round_trips_every_decision(micro: planner.Graph) -> None:
    import tomllib

    res = planner.plan(micro, TINY, PipelineConfig(optimization_steps=4))
    c = parse_constraints(tomllib.loads(plan_toml(res.plan)), "saved")
    pins = resolve(c, micro, TINY)
    assert c.exact and pins.apply(planner.Plan()) == res.plan
    assert pins.violation(res.plan) is None
    assert pins.violation(res.plan.with_packing("half" if res.plan.packing != "half"
                                                else "double")) is not None


def test_candidates_lists_recipes_and_marks_the_default(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert main(["candidates", "vit-micro", "--device", "tiny", "--op", "encoder/mm_*",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_op: dict[str, list[dict]] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r)
    assert {"encoder/mm_q", "encoder/mm_fc1", "encoder/mm_fc2"} <= set(by_op)
    for op, rs in by_op.items():
        chosen = sum(r["chosen"] for r in rs)  # a group unfused by the baseline: none
        assert len(rs) >= 3 and (chosen == 1 if "+" not in op else chosen <= 1), op
        assert all(r["estimate_cycles"] > 0 and r["bytes_per_tile"] > 0 for r in rs)
    assert main(["candidates", "vit-micro", "--device", "tiny", "--op", "nothing*"]) == 2
    assert "matches no op" in capsys.readouterr().err


def test_bad_constraints_type_in_config() -> None:
    with pytest.raises(ConfigError, match="constraints"):
        PipelineConfig(constraints="pins.toml")  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_siglip_map_save_and_replay(batch: int, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The 27-layer tower: the saved final plan replays to the same package."""
    saved = tmp_path / "plan.toml"
    args = ["siglip-so400m-map", "--batch", str(batch), "--no-numerics"]
    status, first = _run(capsys, *args, "--save-plan", str(saved))
    assert status == 0
    status, again = _run(capsys, *args, "--constraints", str(saved), "--optimization-steps", "0")
    assert status == 0 and again["package_hash"] == first["package_hash"]
    assert again["cycles"] == first["cycles"]


@pytest.mark.slow
def test_siglip_map_one_pinned_matmul(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Pinning encoder/mm_fc1 to a non-default candidate changes that op's recipe
    and no other, the package's provenance has it, and the optimizer skips the
    proposals that would move it."""
    g = planner.load_model("siglip-so400m-map")
    dev = load_device("c600")
    ctx = planner.PlanningContext()
    default = planner.baseline_plan(g, dev, 8, "default", ctx)
    from planner.decide.constraints import candidates

    offered = candidates(g, dev, default, "encoder/mm_fc1", cache=ctx.catalogue)
    other = next(c.recipe for c in offered if not c.chosen)
    pins = tmp_path / "pin.toml"
    pins.write_text(f'[recipes]\n"encoder/mm_fc1" = "{other}"\n')
    res = planner.plan(g, dev, PipelineConfig(optimization_steps=0,
                                              constraints=load_constraints(pins)))
    changed = {k for k, v in res.plan.recipes if default.recipe(k) != v}
    assert changed == {"encoder/mm_fc1"} and res.plan.recipe("encoder/mm_fc1") == other
    assert any(op == "encoder/mm_fc1" for step in res.package.provenance for op, _, _ in step)
    status = main(["plan", "siglip-so400m-map", "--constraints", str(pins), "--quiet"])
    out = capsys.readouterr().out
    assert status == 0 and "skipped as pinned: encoder/mm_fc1's recipe is pinned" in out


@pytest.mark.slow
def test_siglip_map_candidates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["candidates", "siglip-so400m-map", "--op", "encoder/mm_*", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ops = {r["op"] for r in rows if "+" not in r["op"]}
    assert {"encoder/mm_q", "encoder/mm_k", "encoder/mm_v", "encoder/mm_o", "encoder/mm_fc1",
            "encoder/mm_fc2"} <= ops
    for op in ops:
        rs = [r for r in rows if r["op"] == op]
        assert len(rs) >= 3 and sum(r["chosen"] for r in rs) == 1
        assert all(r["estimate_cycles"] > 0 for r in rs)
