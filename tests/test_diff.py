"""tileplan diff: a run against itself has no delta; the baseline against the
optimized run names every accepted proposal's decision; sweep rows and bad
sides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("diff")
    base, opt = tmp / "base", tmp / "opt"
    common = ["run", "vit-tiny", "--layers", "2", "--quiet", "--no-numerics"]  # c600, 8 steps
    assert main([*common, "--optimization-steps", "0", "--out", str(base)]) == 0
    assert main([*common, "--out", str(opt)]) == 0
    return base, opt


def test_a_run_against_itself_is_identical(runs: tuple[Path, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = runs
    capsys.readouterr()
    assert main(["diff", str(base), str(base / "summary.json"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["identical"] and d["decisions"] == []
    assert all(v["delta"] == 0 for v in d["totals"].values())
    assert all(all(x == 0 for x in o["delta"].values()) for o in d["ops"])
    assert main(["diff", str(base), str(base)]) == 0
    assert "(identical)" in capsys.readouterr().out


def test_baseline_vs_optimized_names_every_accepted_decision(
        runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, opt = runs
    accepted = [p for p in json.loads((opt / "summary.json").read_text())["proposals"]
                if p["accepted"]]
    assert accepted
    capsys.readouterr()
    assert main(["diff", str(base), str(opt), "--json", "--html",
                 str(tmp_path / "d.html")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert not d["identical"]
    changed = " ".join(x["decision"] for x in d["decisions"])
    kinds = {"fuse": "fused ", "overlap": "plan reduction_overlap", "open": "open ",
             "packing": "plan packing", "cast": "cast ", "operator": "recipes ",
             "joint": "recipes ", "tiles": "shift ", "inplace": "recipes "}
    for p in accepted:
        assert kinds[p["kind"]] in changed, (p, changed)
    b, o = (json.loads((r / "summary.json").read_text()) for r in (base, opt))
    assert d["totals"]["cycles"]["delta"] == o["cycles"] - b["cycles"] < 0
    assert sum(x["delta"]["cycles"] for x in d["ops"]) == o["cycles"] - b["cycles"]
    page = (tmp_path / "d.html").read_text()
    assert "Decisions" in page and "<script" not in page


def test_diff_of_sweep_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text('[sweep]\nmodel = ["vit-micro"]\ndevice = ["tiny"]\n'
                     'optimization_steps = [0, 2]\nnumerics = [false]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--json"]) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    by = {r["optimization_steps"]: r["key"] for r in rows}
    capsys.readouterr()
    assert main(["diff", f"{out}@{by[0][:8]}", f"{out}@{by[2]}", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["decisions"] is None and any("no saved plan" in n for n in d["notes"])
    assert d["totals"]["cycles"]["a"] == next(r["cycles"] for r in rows
                                              if r["optimization_steps"] == 0)
    assert main(["diff", f"{out}@ffff", str(out)]) == 2
    assert "no case of the sweep matches" in capsys.readouterr().err


def test_bad_sides_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path / "nope"), str(tmp_path / "nope2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0]
