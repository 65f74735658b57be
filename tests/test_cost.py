"""One cost model, three entry points: `simulator.kernel_cycles`, `tileplan
cost` and the simulator's run of a one-vertex package agree, and so does the
catalogue's estimate."""

from __future__ import annotations

import json

import pytest

import simulator
from kernels.registry import by_name
from planner.cli import main
from planner.decide import catalogue as cat
from planner.decide.families.rows import block_cycles
from planner.ir.graph import Tensor, make_graph
from planner.ir.ops.gelu import Gelu
from planner.ir.ops.softmax import Softmax
from simulator import kernel_cycles, load_device, run, verify
from simulator.cost import call_args
from simulator.testing import PackageBuilder

C600 = load_device("c600")

CALLS = [
    ("MATMUL", dict(M=184, K=288, N=48, in_dtype="fp16", out_dtype="fp16")),
    ("MATMUL", dict(M=50, K=192, N=24, bias=1)),
    ("BATCH_MATMUL", dict(M=8, K=64, N=80, batch=3, in_dtype="fp16")),
    ("REDUCE", dict(M=2, N=1472, k=4)),
    ("ADD", dict(M=3, N=1152, broadcast=1)),
    ("BIAS_ADD", dict(M=4, N=100)),
    ("LAYERNORM", dict(M=7, N=1152)),
    ("GELU", dict(M=1, N=2208)),
    ("SOFTMAX", dict(M=8, N=729)),
    ("CAST", dict(M=7, N=1152)),
    ("COPY", dict(rows=3, row_bytes=4096)),
    ("TRANSPOSE", dict(M=24, N=40)),
]


@pytest.mark.parametrize("kernel, named", CALLS, ids=[c[0] for c in CALLS])
def test_one_vertex_package_runs_in_the_modelled_cycles(kernel: str, named: dict) -> None:
    """A package of one vertex with these arguments, operands on a tile's
    memory, simulates in exactly `kernel_cycles` cycles."""
    dev = C600.with_costs(runtime_bytes=0)  # room for every operand on one tile
    args = call_args(dev, kernel, **named)
    spec = by_name(kernel)
    b = PackageBuilder(dev)
    # one buffer over the whole tensor range: every operand lies inside it
    size = dev.memory_size - 200_000
    b.buffer("all", 0, dev.memory_base, size, "scratch")
    b.compute((0, spec.id, {i: int(v) for i, v in enumerate(args) if v}))
    pkg = b.build()
    verify(pkg)
    assert run(pkg, numerics=False).cycles == kernel_cycles(dev, kernel, **named)


def test_cli_cost_speaks_the_measurements_names(capsys: pytest.CaptureFixture[str]) -> None:
    """R/K/C as in measurement files, any case, and the defaults it filled in."""
    assert main(["cost", "matmul", "R=184", "K=288", "C=48", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["kernel"] == "MATMUL" and got["defaults"] == {"in_dtype": "fp8",
                                                             "out_dtype": "fp16"}
    assert got["cycles"] == kernel_cycles(C600, "MATMUL", M=184, K=288, N=48)
    assert main(["cost", "Gelu", "R=2", "C=96"]) == 0
    assert "GELU R=2 C=96" in capsys.readouterr().out


def test_cli_cost_prints_and_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cost", "MATMUL", "M=184", "K=288", "N=48", "in_dtype=fp16", "out_dtype=fp16"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    want = kernel_cycles(C600, "MATMUL", M=184, K=288, N=48, in_dtype="fp16", out_dtype="fp16")
    assert f"{want:,} cycles" in out and "call" in out
    assert main(argv + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernel"] == "MATMUL" and doc["cycles"] == want
    assert doc["call"] + doc["work"] == want and doc["conflict"] is False
    assert main(["cost", "GELU", "N=96", "--device", "c600-ideal", "--json"]) == 0
    ideal = json.loads(capsys.readouterr().out)["cycles"]
    assert ideal == kernel_cycles(load_device("c600-ideal"), "GELU", N=96)


@pytest.mark.parametrize("argv, needle", [
    (["cost", "CONV", "M=1"], "unknown kernel"),
    (["cost", "MATMUL", "Q=3"], "unknown argument"),
    (["cost", "MATMUL", "M"], "NAME=VALUE"),
    (["cost", "MATMUL", "M=big"], "integer or a dtype"),
    (["cost", "MATMUL", "in_dtype=fp4"], "integer or a dtype"),
    (["cost", "MATMUL", "M=0", "K=2", "N=2"], "shape argument < 1"),
    (["cost", "MATMUL", "M=-3", "K=2", "N=2"], "shape argument < 1"),
    (["cost", "MATMUL", "M=99999999999999999999", "K=2", "N=2"], "beyond any tile"),
    (["cost", "MATMUL", "M=4", "K=8", "N=8", "in_dtype=7"], "unsupported dtype"),
    (["cost", "SOFTMAX", "M=4", "N=8", "scale=nan"], "finite"),
    (["cost", "LAYERNORM", "M=4", "N=8", "eps=inf"], "finite"),
    (["cost", "MATMUL", "M=4", "K=8", "N=8", "flags=64"], "bad flags"),
    (["cost", "MATMUL", "M=4", "K=8", "N=8", "lda=2"], "row stride"),
    (["cost", "MATMUL", "M=4", "K=8", "N=8", "a=16"], "outside the tile's memory"),
    (["cost", "MATMUL", "M=100000", "K=4000", "N=8"], "outside the tile's memory"),
    (["cost", "MATMUL", "M=4", "M=5"], "given twice"),
    (["cost", "MATMUL", "R=4", "M=5"], "given twice"),
])
def test_cli_cost_bad_input_exits_2(argv: list[str], needle: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_catalogue_estimates_are_kernel_cycles() -> None:
    assert cat.matmul_cycles(50, 192, 24, "fp8", "fp16", C600) == kernel_cycles(
        C600, "MATMUL", M=50, K=192, N=24, in_dtype="fp8", out_dtype="fp16")
    assert cat.reduce_cycles(7, 96, 4, "fp16", C600, bias=True) == kernel_cycles(
        C600, "REDUCE", M=7, N=96, k=4, bias=1)
    # a row op's estimate is its own kernel call on a dense block (op.row_call)
    g = make_graph("sm", [Tensor("x", (8, 300), "fp16", "input"),
                          Tensor("y", (8, 300), "fp16", "activation"),
                          Tensor("z", (8, 300), "fp16", "output")],
                   [Gelu("ge", "x", "y"), Softmax("sm", "y", "z", 0.125)], ["x"], ["z"])
    assert block_cycles(g, g.op("ge"), 6, 300, C600) == kernel_cycles(C600, "GELU", M=6, N=300)
    assert block_cycles(g, g.op("sm"), 8, 197, C600) == kernel_cycles(
        C600, "SOFTMAX", M=8, N=197)
    assert simulator.kernel_cycles is kernel_cycles
