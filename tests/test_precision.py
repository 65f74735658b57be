"""--precision fp8 | fp16 and --tokens: the fp16 graph has no fp8 tensor and no fp8 cast, plans,
runs within tolerance of its reference, and the summary says which."""

from __future__ import annotations

import json

import pytest

import planner
from planner.cli import main


@pytest.mark.parametrize("model", ["vit-micro", "minilm-l6", "qwen2.5-0.5b"])
def test_fp16_graph_has_no_fp8_and_no_casts(model: str) -> None:
    g8 = planner.load_model(model, layers=1)
    g16 = planner.load_model(model, layers=1, precision="fp16")
    assert "fp8" in {t.dtype for t in g8.tensors} and any(o.kind == "Cast" for o in g8.ops)
    assert "fp8" not in {t.dtype for t in g16.tensors}
    # only the fp8 casts go (a decoder's residual stream starts as an fp16 copy)
    casts8 = {o.name for o in g8.ops if o.kind == "Cast"
              and g8.tensor(o.outputs[0]).dtype != "fp8"}
    assert {o.name for o in g16.ops if o.kind == "Cast"} == casts8
    assert g16.attr("precision") == "fp16"
    # the same parameters, now fp16
    assert sorted(g8.parameters) == sorted(g16.parameters)
    assert {g16.tensor(p).dtype for p in g16.parameters} <= {"fp16"}


@pytest.mark.parametrize("precision", ["fp8", "fp16"])
def test_run_states_its_precision(precision: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "vit-micro", "--device", "tiny", "--precision", precision,
                 "--optimization-steps", "1", "--json", "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["precision"] == precision and s["numerics_ok"]
    assert (s["casts"] == {}) == (precision == "fp16")  # no fp8 tensor, no cast report
    assert main(["run", "vit-micro", "--device", "tiny", "--precision", precision,
                 "--optimization-steps", "0", "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert (", fp16) on tiny" in first) == (precision == "fp16")


def test_bad_precision_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "vit-micro", "--precision", "fp32"]) == 2  # reference-only
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision" in err[0]


def test_tokens_override(capsys: pytest.CaptureFixture[str]) -> None:
    g = planner.load_model("bert-base", layers=1, tokens=64)
    assert g.attr("tokens") == 64 and g.tensor("embeds").shape == (64, 768)
    assert planner.load_model("qwen2.5-0.5b", layers=1, tokens=256).tensor(
        "rope_cos").shape[0] == 256
    # bert's learned position table has 512 rows: a longer sequence is named
    assert main(["inspect", "bert-base", "--tokens", "600"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'max_positions': must be at least tokens (600)" in err[0]
