"""Any DAG of the IR's op kinds from an ONNX file (planner/ir/onnx_dag.py):
the committed tiny-dag fixture (experiments/export_fixtures.py: two branches
off one LayerNorm, an RMSNorm, a SwiGLU residual, tanh, a linear head and a
Softmax; none of the templates) from both exporters plans to one package and
agrees with onnxruntime; files built here with onnx.helper show the graph
that comes out and each refusal, naming node, input or field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import planner
from planner.cli import main
from planner.ir.onnx_import import onnx_model

DAG = Path(__file__).parent / "fixtures" / "models" / "tiny-dag"
EXPORTERS = ("torchscript", "dynamo")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--device", "tiny", "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_the_fixture_imports_as_its_ops(exporter: str) -> None:
    m = onnx_model(DAG / f"model.{exporter}.onnx")
    assert m.dag is not None and m.table == {}
    assert [s[0] for s in m.dag.steps] == [
        "layernorm", "linear", "gelu_erf", "linear", "add", "linear", "add", "rmsnorm",
        "linear", "linear", "swiglu", "linear", "add", "tanh", "linear", "softmax"]
    g = planner.load_model(DAG / f"model.{exporter}.onnx", precision="fp8")
    assert g.outputs == ("probs", "hidden") and g.inputs == ("x",)
    assert g.tensor("probs").shape == (16, 10)
    kinds = [type(op).__name__ for op in g.ops]
    # one cast per value a MatMul reads: the LayerNorm's and RMSNorm's outputs feed two each
    assert kinds.count("Cast") == 5 and kinds.count("MatMul") == 7
    assert sorted(m.weights) == sorted(g.parameters)  # the file's initializers, our names


@pytest.mark.parametrize("precision, floor", [("fp16", 0.9999), ("fp8", 0.99)])
def test_both_exports_run_to_one_package_and_agree_with_onnxruntime(
        precision: str, floor: float, capsys: pytest.CaptureFixture[str]) -> None:
    got = [_run(capsys, "run", str(DAG / f"model.{e}.onnx"), "--precision", precision,
                "--optimization-steps", "2") for e in EXPORTERS]
    for s in got:
        assert s["numerics_ok"] and s["faults"] == 0
        assert s["ort_cosine_min"] >= floor
    assert got[0]["package_hash"] == got[1]["package_hash"]
    assert got[0]["cycles"] == got[1]["cycles"] > 0


def _model(tmp_path: Path, nodes: list, inits: dict[str, np.ndarray],
           shape: list = (4, 8), out_shape: list | None = None, name: str = "m",
           dtype: str = "float") -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT if dtype == "float" else TensorProto.INT64
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or list(shape))],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def test_a_diamond_of_matmuls_plans_and_agrees(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """x -> two linears -> Add -> Softmax: a diamond, no template."""
    from onnx import helper

    rng = np.random.default_rng(0)
    path = _model(tmp_path, [
        helper.make_node("MatMul", ["x", "w1"], ["y1"]),
        helper.make_node("MatMul", ["x", "w2"], ["y2"]),
        helper.make_node("Add", ["y1", "y2"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1)],
        {"w1": rng.normal(0, 0.3, (8, 8)), "w2": rng.normal(0, 0.3, (8, 8))}, name="diamond")
    s = _run(capsys, "run", str(path), "--precision", "fp16")
    assert s["ort_cosine_min"] >= 0.9999 and s["numerics_ok"]
    g = planner.load_model(path, precision="fp16")
    assert [type(op).__name__ for op in g.ops] == ["MatMul", "MatMul", "Add", "Softmax"]


@pytest.mark.parametrize("case, words", [
    ("two-activations", ["node mm", "MatMul", "as a DAG of IR ops", "two activations"]),
    ("cubic", ["node square", "computes none of GELU"]),
    ("reshape", ["node flat", "Reshape", "a DAG import takes"]),
    ("dynamic", ["input x", "static shape"]),
    ("constant-add", ["node shift", "Add by a constant tensor", "a linear's bias"]),
    ("int-input", ["input x", "float inputs"]),
    ("gemm-bias-per-row", ["node g", "a bias of shape (4, 8)"]),
])
def test_what_a_dag_import_refuses_exits_2_naming_it(
        tmp_path: Path, case: str, words: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    from onnx import helper

    w = {"w": np.eye(8)}
    if case == "two-activations":
        path = _model(tmp_path, [helper.make_node("MatMul", ["x", "x"], ["y"], name="mm")],
                      {}, shape=[8, 8])
    elif case == "cubic":
        path = _model(tmp_path, [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
                                 helper.make_node("Mul", ["sq", "x"], ["y"], name="cube")], {})
    elif case == "reshape":
        path = _model(tmp_path, [helper.make_node("Reshape", ["x", "s"], ["y"], name="flat")],
                      {"s": np.array([8, 4])}, out_shape=[8, 4])
    elif case == "constant-add":
        path = _model(tmp_path, [helper.make_node("Add", ["x", "b"], ["y"], name="shift")],
                      {"b": np.ones(8)})
    elif case == "gemm-bias-per-row":
        path = _model(tmp_path, [helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="g")],
                      {**w, "c": np.ones((4, 8))})
    elif case == "int-input":
        path = _model(tmp_path, [helper.make_node("Cast", ["x"], ["c"], to=1, name="c"),
                                 helper.make_node("MatMul", ["c", "w"], ["y"], name="mm")],
                      w, dtype="int64")
    else:
        path = _model(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                      w, shape=["n", 8], out_shape=["n", 8])
    assert main(["plan", str(path), "--device", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err
    for word in words:
        assert word in err, (word, err)


def test_a_dag_has_no_sizes_to_override(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(DAG / "model.dynamo.onnx"), "--device", "tiny",
                 "--layers", "2"]) == 2
    err = capsys.readouterr().err
    assert "layers" in err and "sizes it was exported with" in err


def test_both_engines_agree_on_the_dag_package() -> None:
    """The imported DAG's package (SwiGLU, RMSNorm, Softmax, fused sibling
    matmuls among its ops) runs identically in the Numba and SimPy engines:
    cycles per step, per-tile busy, outputs bit for bit."""
    from planner.ir.weights import load_weights
    from simulator.device import load_device
    from simulator.run import run

    path = DAG / "model.torchscript.onnx"
    g = planner.load_model(path, precision="fp8")
    res = planner.plan(g, load_device("tiny"), planner.PipelineConfig(optimization_steps=2))
    params = load_weights(g, path)
    inputs = planner.init_inputs(g, seed=1)
    fast = run(res.package, params=params, inputs=inputs, engine="numba")
    slow = run(res.package, params=params, inputs=inputs, engine="simpy")
    assert fast.ok and slow.ok and fast.cycles == slow.cycles == res.cycles
    np.testing.assert_array_equal(slow.cycles_per_step, fast.cycles_per_step)
    np.testing.assert_array_equal(slow.tile_busy, fast.tile_busy)
    assert sorted(slow.outputs) == sorted(fast.outputs) == ["hidden", "probs"]
    for name, arr in fast.outputs.items():
        np.testing.assert_array_equal(slow.outputs[name].view(np.uint32), arr.view(np.uint32))


def test_a_sweep_over_a_dag_file(tmp_path: Path) -> None:
    """A sweep's model axis takes the ONNX file; a layers axis over it fails
    up front (a DAG has no layers to override): exit 2 naming the sweep's
    field and the case, nothing written."""
    from planner.sweep import load_sweep, run_sweep

    (tmp_path / "s.toml").write_text(
        f'[sweep]\nmodel = ["{DAG / "model.dynamo.onnx"}"]\ndevice = ["tiny", "c600"]\n'
        'optimization_steps = [0]\nnumerics = [false]\n')
    res = run_sweep(load_sweep(tmp_path / "s.toml"), tmp_path / "out", workers=1,
                    progress=False)
    rows = {r["device"]: r for r in res.rows}
    assert sorted(rows) == ["c600", "tiny"] and all(r["status"] == "ok" for r in rows.values())
    assert rows["tiny"]["cycles"] > 0 and rows["c600"]["cycles"] > 0
    assert rows["tiny"]["cycles"] != rows["c600"]["cycles"]

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[sweep]\nmodel = ["{DAG / "model.dynamo.onnx"}"]\ndevice = ["tiny"]\n'
                   'layers = [1]\n')
    assert main(["sweep", str(bad), "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_a_decomposed_layernorm_in_a_dag(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """LayerNorm as exporters write it below opset 17 (ReduceMean, Sub, Pow 2,
    ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta), then a linear: one
    LayerNorm op, and onnxruntime agrees."""
    from onnx import helper

    rng = np.random.default_rng(1)
    c = helper.make_node
    path = _model(tmp_path, [
        c("ReduceMean", ["x"], ["m"], axes=[-1]), c("Sub", ["x", "m"], ["d"]),
        c("Pow", ["d", "two"], ["p"]), c("ReduceMean", ["p"], ["v"], axes=[-1]),
        c("Add", ["v", "eps"], ["ve"]), c("Sqrt", ["ve"], ["s"]), c("Div", ["d", "s"], ["n"]),
        c("Mul", ["n", "gamma"], ["ng"]), c("Add", ["ng", "beta"], ["h"]),
        c("MatMul", ["h", "w"], ["y"])],
        {"two": np.array(2.0), "eps": np.array(1e-5), "gamma": rng.normal(1, 0.1, 8),
         "beta": rng.normal(0, 0.1, 8), "w": rng.normal(0, 0.3, (8, 8))}, name="ln14")
    g = planner.load_model(path, precision="fp16")
    assert [type(op).__name__ for op in g.ops] == ["LayerNorm", "MatMul"]
    s = _run(capsys, "run", str(path), "--precision", "fp16")
    assert s["ort_cosine_min"] >= 0.9999 and s["numerics_ok"]
