"""simulator.run: memory image, numerics vs numpy, SimResult, argument errors."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_device, run, verify
from simulator.engines.base import F_ARGS, F_OUTPUT, F_UNINIT
from simulator.testing import ksplit_matmul, repeat_program, repeat_reference
from tilecommon.errors import ConfigError, SimulationFault


@pytest.fixture(scope="module")
def ksplit():  # type: ignore[no-untyped-def]
    return ksplit_matmul(load_device("tiny"))


def test_ksplit_fp8_matmul_matches_numpy_exactly(ksplit) -> None:  # type: ignore[no-untyped-def]
    pkg, params, inputs, expected = ksplit
    verify(pkg)
    res = run(pkg, params=params, inputs=inputs)
    assert res.faults == () and res.n_faults == 0 and res.ok
    np.testing.assert_array_equal(res.outputs["out"], expected["out"])
    assert res.outputs["out"].dtype == np.float32 and res.outputs["out"].shape == (8, 16)
    # 4 matmuls (one per tile), 3 transfers, 1 reduce
    assert res.vertex_invocations == 5
    assert res.tile_bytes_in.tolist()[:4] == [3 * 512, 0, 0, 0]
    assert res.tile_bytes_out.tolist()[:4] == [0, 512, 512, 512]
    assert res.cycles == int(res.cycles_per_step.sum())
    assert res.seconds == pytest.approx(res.cycles / 1.5e9)


def test_ksplit_nonexact_values_match_within_fp16_rounding(ksplit) -> None:  # type: ignore[no-untyped-def]
    pkg, params, inputs, _ = ksplit
    rng = np.random.default_rng(7)
    a = rng.standard_normal((8, 128)).astype(np.float32)
    b = rng.standard_normal((128, 16)).astype(np.float32) * 0.1
    import ml_dtypes

    a8 = a.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    b8 = b.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    total = np.zeros((8, 16), np.float32)
    for t in range(4):
        total = total + a8[:, 32 * t:32 * (t + 1)] @ b8[32 * t:32 * (t + 1)]
    want = (total + params["bias"]).astype(np.float16).astype(np.float32)
    res = run(pkg, params={"b": b, "bias": params["bias"]}, inputs={"a": a})
    assert res.ok
    rel = np.linalg.norm(res.outputs["out"] - want) / np.linalg.norm(want)
    assert rel < 1e-3
    assert np.abs(res.outputs["out"] - want).max() <= 2 ** -10 * np.abs(want).max() * 2


def test_timing_only_gives_same_cycles_and_no_outputs(ksplit) -> None:  # type: ignore[no-untyped-def]
    pkg, params, inputs, _ = ksplit
    full = run(pkg, params=params, inputs=inputs)
    timing = run(pkg, numerics=False)
    assert timing.outputs == {}
    assert timing.cycles == full.cycles
    np.testing.assert_array_equal(timing.cycles_per_step, full.cycles_per_step)
    np.testing.assert_array_equal(timing.tile_busy, full.tile_busy)


def test_unknown_engine_names_the_engines(ksplit) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=r"engine.*unknown; engines: \['numba', 'simpy'\].*gpu"):
        run(ksplit[0], numerics=False, engine="gpu")


def test_missing_parameter_is_named(ksplit) -> None:  # type: ignore[no-untyped-def]
    pkg, params, inputs, _ = ksplit
    with pytest.raises(ValueError, match="parameter 'bias' missing"):
        run(pkg, params={"b": params["b"]}, inputs=inputs)
    with pytest.raises(ValueError, match="input 'a' missing"):
        run(pkg, params=params)


def test_wrong_shape_and_unknown_names_are_rejected(ksplit) -> None:  # type: ignore[no-untyped-def]
    pkg, params, inputs, _ = ksplit
    with pytest.raises(ValueError, match=r"input 'a': shape \(8, 64\)"):
        run(pkg, params=params, inputs={"a": inputs["a"][:, :64]})
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['c'\]"):
        run(pkg, params={**params, "c": params["b"]}, inputs=inputs)


def test_repeat_program_outputs_match_reference() -> None:
    dev = load_device("tiny")
    pkg = repeat_program(dev, 5)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((5, 4, 8)).astype(np.float32)
    res = run(pkg, params={"w": w}, inputs={"x": x})
    y, hist = repeat_reference(x, w)
    assert res.ok
    np.testing.assert_array_equal(res.outputs["y"], y)
    np.testing.assert_array_equal(res.outputs["hist"], hist)


def test_unwritten_output_is_a_fault_and_raise_on_fault(ksplit) -> None:  # type: ignore[no-untyped-def]
    pkg, params, inputs, _ = ksplit
    # drop the REDUCE vertex: the output is never written (and nothing is read)
    n_v = pkg.n_vertices
    sv = pkg["step_vtx"].copy()
    sv[-1] = n_v - 1
    bad = pkg.with_arrays(step_vtx=sv, v_tile=pkg["v_tile"][:-1],
                          v_kernel=pkg["v_kernel"][:-1], v_args=pkg["v_args"][:-1])
    res = run(bad, params=params, inputs=inputs)
    assert not res.ok
    assert [f.code for f in res.faults] == [F_OUTPUT]
    f = res.faults[0]
    assert f.tile == 0 and f.address == int(pkg["io_addr"][-1]) and f.detail == 8 * 16 * 2
    assert "output 'out'" in str(f) and "never written" in str(f)
    assert np.isnan(res.outputs["out"]).all()
    with pytest.raises(SimulationFault, match="1 fault"):
        res.raise_on_fault()


def test_fault_message_names_step_tile_address_iteration() -> None:
    dev = load_device("tiny")
    pkg = repeat_program(dev, 3)
    # the first COPY writes B instead of A: iteration 0 of the loop reads unwritten A
    args = pkg["v_args"].copy()
    a_addr = int(args[0, 2])
    args[0, 2] = int(args[1, 4])  # B (the ADD's first destination)
    bad = pkg.with_arrays(v_args=args)
    res = run(bad, params={"w": np.ones((3, 4, 8), np.float32)},
              inputs={"x": np.ones((4, 8), np.float32)})
    first = res.faults[0]
    assert first.code == F_UNINIT
    assert (first.step, first.tile, first.address, first.loop, first.iteration) == (
        2, 0, a_addr, 1, 0)
    assert "step 2 (COMPUTE), tile 0, address" in first.message
    assert "iteration 0 of loop at step 1" in first.message


# ---- CLI: tileplan verify / simulate ---------------------------------------------------


def test_cli_verify_and_simulate(ksplit, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from planner.cli import main
    from simulator import save_package

    path = save_package(ksplit[0], tmp_path / "pkg")
    assert main(["verify", str(path)]) == 0
    assert "ok: package ksplit" in capsys.readouterr().out
    assert main(["simulate", str(path), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    cycles = run(ksplit[0], numerics=False).cycles
    assert f"cycles {cycles}" in out and "faults 0" in out and "output out [8, 16]" in out
    assert main(["simulate", str(path), "--no-numerics"]) == 0
    assert "output" not in capsys.readouterr().out


def test_cli_verify_reports_invalid_package_in_one_line(ksplit, tmp_path,
                                                        capsys) -> None:  # type: ignore[no-untyped-def]
    from planner.cli import main
    from simulator import save_package

    pkg = ksplit[0]
    addr = pkg["buf_addr"].copy()
    addr[0] = pkg.device.memory_end
    path = save_package(pkg.with_arrays(buf_addr=addr), tmp_path / "bad")
    assert main(["verify", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tileplan: error: buffer 'a0'") and err.count("\n") == 1


def test_cli_simulate_exits_1_on_faults(ksplit, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from planner.cli import main
    from simulator import save_package
    from simulator.xschedule import rescheduled

    pkg = ksplit[0]
    nb = pkg["x_bytes"].copy()
    nb[0] -= 8
    path = save_package(rescheduled(pkg, x_bytes=nb), tmp_path / "short")
    assert main(["simulate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "faults 1" in out and "read of never-written memory at step 2" in out


def test_a_compute_steps_faults_come_in_vertex_order(ksplit) -> None:  # type: ignore[no-untyped-def]
    """The region checks run on the cores, the reports after them: vertex 0's
    unwritten read still comes before vertex 1's rejected arguments."""
    pkg, params, inputs, _ = ksplit
    args = pkg["v_args"].copy()
    c_at = int(args[0, 4])
    args[0, 0] = c_at + 8 * 16 * 4  # tile 0 reads A from the landing buffer, unwritten yet
    args[1, 6] = 0  # tile 1: M = 0
    res = run(pkg.with_arrays(v_args=args), params=params, inputs=inputs)
    first, second = res.faults[:2]
    assert (first.code, first.step, first.tile, first.item) == (F_UNINIT, 0, 0, 0)
    assert first.address == c_at + 8 * 16 * 4
    assert (second.code, second.step, second.tile, second.item) == (F_ARGS, 0, 1, 1)


@pytest.mark.parametrize("ld0, ld1, ext1", [(8, 0, 1), (40, 0, 1), (24, 8, 3), (48, 8, 3),
                                            (48, 12, 3), (64, 8, 3)])
def test_placing_a_block_marks_exactly_its_bytes(ld0: int, ld1: int, ext1: int) -> None:
    # dense blocks are marked in one span, others row by row: either way
    # the gaps between rows stay unwritten (an unwritten read must fault)
    from simulator.run import _scatter, _scatter_parallel

    rb, ext0, off = 8, 4, 5
    for place in (_scatter, _scatter_parallel):
        mem = np.zeros((16, 256), dtype=np.uint8)
        written = np.zeros((16, 4), dtype=np.uint64)
        src = np.arange(1, 1 + ext0 * ext1 * rb, dtype=np.uint8)
        geo = np.array([[off, ld0, ld1, ext0, ext1, rb, 0, ext1 * rb, rb]], dtype=np.int64)
        place(mem, written, np.array([9], dtype=np.int64), geo, src)
        want = np.zeros(256, dtype=bool)
        for a in range(ext0):
            for b in range(ext1):
                want[off + a * ld0 + b * ld1:][:rb] = True
        marked = np.unpackbits(written[9].view(np.uint8), bitorder="little").astype(bool)
        np.testing.assert_array_equal(marked, want)
        np.testing.assert_array_equal(mem[9][want], src)
        assert not mem[9][~want].any() and not written[:9].any()
