"""The SimPy event-level engine against the Numba engine (the slow, obvious twin).

Both engines must agree exactly on total cycles, cycles per step, per-tile busy
cycles and exchange bytes, outputs (bit for bit) and faults, on hand-built
packages and on a small planner package.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import planner
from kernels.abi import ADD, COPY
from planner.ir.graph import Graph
from simulator import load_device, run, verify
from simulator.device import Device
from simulator.engines.base import (
    F_DST_BUFFER,
    F_MISALIGNED,
    F_NO_BUFFER,
    F_RACE,
    F_UNINIT,
    MAX_FAULTS,
)
from simulator.package import Package
from simulator.run import SimResult
from simulator.testing import (
    PackageBuilder,
    ksplit_matmul,
    repeat_program,
    repeat_reference,
)
from simulator.timing import loop_patch_words
from simulator.xschedule import rescheduled
from tilecommon.errors import ConfigError

TRIPS = 4


@pytest.fixture(scope="module")
def dev() -> Device:
    return load_device("tiny")


def _both(pkg: Package, params: dict[str, np.ndarray] | None = None,
          inputs: dict[str, np.ndarray] | None = None,
          numerics: bool = True) -> tuple[SimResult, SimResult]:
    return (run(pkg, params=params, inputs=inputs, numerics=numerics, engine="numba"),
            run(pkg, params=params, inputs=inputs, numerics=numerics, engine="simpy"))


def _fault_rows(res: SimResult) -> list[tuple[object, ...]]:
    """Fault rows; a race is compared by step, tile, iteration and the racing pair
    (which of several racing bytes is reported first is each engine's own choice)."""
    return [(f.code, f.step, f.tile, f.loop, f.iteration, frozenset((f.item, f.detail)))
            if f.code == F_RACE else
            (f.code, f.step, f.tile, f.address, f.loop, f.iteration, f.item, f.detail)
            for f in res.faults]


def _assert_agree(fast: SimResult, slow: SimResult) -> None:
    assert slow.cycles == fast.cycles
    np.testing.assert_array_equal(slow.cycles_per_step, fast.cycles_per_step)
    np.testing.assert_array_equal(slow.tile_busy, fast.tile_busy)
    np.testing.assert_array_equal(slow.tile_bytes_in, fast.tile_bytes_in)
    np.testing.assert_array_equal(slow.tile_bytes_out, fast.tile_bytes_out)
    np.testing.assert_array_equal(slow.tile_send_busy, fast.tile_send_busy)
    np.testing.assert_array_equal(slow.tile_receive_busy, fast.tile_receive_busy)
    assert slow.vertex_invocations == fast.vertex_invocations
    assert sorted(slow.outputs) == sorted(fast.outputs)
    for name, arr in fast.outputs.items():
        # bit for bit, NaN (unwritten) included
        np.testing.assert_array_equal(slow.outputs[name].view(np.uint32), arr.view(np.uint32))
    assert slow.n_faults == fast.n_faults
    assert _fault_rows(slow) == _fault_rows(fast)


def _drop_transfer(pkg: Package, x: int) -> Package:
    keep = np.arange(pkg.n_transfers) != x
    sx = pkg["step_xfer"].copy()
    sx[np.searchsorted(sx, x, side="right"):] -= 1
    return rescheduled(pkg, step_xfer=sx, **{k: pkg[k][keep] for k in (
        "x_src_tile", "x_src_addr", "x_dst_tile", "x_dst_addr", "x_bytes")})


def _repeat_io() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    return ({"w": rng.standard_normal((TRIPS, 4, 8)).astype(np.float32)},
            {"x": rng.standard_normal((4, 8)).astype(np.float32)})


# ---- agreement ----------------------------------------------------------------------


def test_ksplit_matmul_engines_agree(dev: Device) -> None:
    pkg, params, inputs, expected = ksplit_matmul(dev)
    fast, slow = _both(pkg, params, inputs)
    _assert_agree(fast, slow)
    assert slow.ok and slow.cycles > 0
    np.testing.assert_array_equal(slow.outputs["out"], expected["out"])
    # timing only: same timing, no outputs
    fast_t, slow_t = _both(pkg, numerics=False)
    _assert_agree(fast_t, slow_t)
    assert slow_t.cycles == slow.cycles and slow_t.outputs == {}


@pytest.mark.parametrize("unrolled", [False, True])
def test_repeat_with_table_and_arithmetic_patches_agrees(dev: Device, unrolled: bool) -> None:
    pkg = repeat_program(dev, TRIPS, unrolled=unrolled)
    params, inputs = _repeat_io()
    fast, slow = _both(pkg, params, inputs)
    _assert_agree(fast, slow)
    y, hist = repeat_reference(inputs["x"], params["w"])
    np.testing.assert_array_equal(slow.outputs["y"], y)
    np.testing.assert_array_equal(slow.outputs["hist"], hist)
    if not unrolled:  # loop overhead is charged to the END step, once per iteration
        assert slow.cycles_per_step[4] == TRIPS * dev.costs.loop_overhead_cycles + (
            (TRIPS - 1) * dev.costs.patch_word_cycles * int(loop_patch_words(pkg).max()))


def test_nested_repeat_and_multicast_exchange_agree(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("src", 0, base, 64, "activation")
    b.buffer("dst", 0, base + 64, 3 * 64, "activation")
    for t in (1, 2, 3):
        b.buffer(f"land{t}", t, base, 2 * 64, "exchange-landing")
    x = b.io("x", "input", (4, 8), "fp16")
    b.io_block(x, 0, base, (0, 0), (4, 8), 0, 16)
    b.repeat(2)
    inner = b.repeat(3)
    (v,) = b.compute((0, COPY, {0: base, 1: 16, 2: base + 64, 3: 16, 4: 4, 5: 16}))
    b.patch(0, v, 2, inner, base + 64, 64)
    b.end_repeat()
    b.end_repeat()
    # a multicast (one source to three tiles) plus a second, different send of tile 0
    b.exchange(*[(0, base, t, base, 64) for t in (1, 2, 3)], (0, base + 64, 1, base + 64, 40))
    pkg = b.build()
    verify(pkg)
    fast, slow = _both(pkg, inputs={"x": np.arange(32, dtype=np.float32).reshape(4, 8)})
    _assert_agree(fast, slow)
    assert slow.ok and slow.vertex_invocations == 6
    assert int(slow.tile_bytes_out[0]) == 64 + 40  # the multicast leaves tile 0 once
    assert int(slow.tile_bytes_in[1]) == 64 + 40


def test_sync_cycles_mutation_moves_both_engines_equally(dev: Device) -> None:
    pkg = repeat_program(dev, TRIPS)
    slower = dataclasses.replace(pkg, device=dev.with_costs(
        sync_cycles=dev.costs.sync_cycles + 37))
    params, inputs = _repeat_io()
    fast0, slow0 = _both(pkg, params, inputs)
    fast1, slow1 = _both(slower, params, inputs)
    _assert_agree(fast1, slow1)
    # one exchange step per iteration: TRIPS syncs
    assert slow1.cycles - slow0.cycles == fast1.cycles - fast0.cycles == 37 * TRIPS


# ---- the same faults on deliberate corruptions ---------------------------------------


def test_dropped_transfer_same_faults(dev: Device) -> None:
    pkg, params, inputs, _ = ksplit_matmul(dev)
    fast, slow = _both(_drop_transfer(pkg, 1), params, inputs)
    _assert_agree(fast, slow)
    assert slow.faults[0].code == F_UNINIT
    assert (slow.faults[0].step, slow.faults[0].address) == (2, int(pkg["x_dst_addr"][1]))


def test_read_before_write_same_faults(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    for k, name in enumerate("abc"):
        b.buffer(name, 0, base + 64 * k, 64, "activation")
    x = b.io("a", "input", (4, 8), "fp16")
    b.io_block(x, 0, base, (0, 0), (4, 8), 0, 16)
    b.compute((0, ADD, {0: base, 1: 16, 2: base + 64, 3: 16, 4: base + 128, 5: 16, 6: 4, 7: 8,
                        8: 1, 9: 1, 10: 1}))
    fast, slow = _both(b.build(), inputs={"a": np.ones((4, 8), np.float32)})
    _assert_agree(fast, slow)
    assert [(f.code, f.address) for f in slow.faults] == [(F_UNINIT, base + 64)]


def test_out_of_range_and_misaligned_same_faults(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 256, "activation")
    b.buffer("c", 0, base + 256, 64, "activation")
    b.buffer("b", 1, base, 256, "activation")
    x = b.io("a", "input", (64,), "fp32")
    b.io_block(x, 0, base, (0,), (64,), 0, 0)
    far = dev.memory_end - 32
    b.compute((0, COPY, {0: base, 1: 64, 2: far, 3: 64, 4: 4, 5: 64}),
              (0, COPY, {0: base + 2, 1: 64, 2: base + 256, 3: 64, 4: 1, 5: 8}))
    b.exchange((0, base, 0, dev.memory_end + 64, 8), (0, base + 4, 1, base + 2, 8))
    fast, slow = _both(b.build(), inputs={"a": np.ones(64, np.float32)})
    _assert_agree(fast, slow)
    codes = [f.code for f in slow.faults]
    assert codes == [F_NO_BUFFER, F_MISALIGNED, F_DST_BUFFER, F_MISALIGNED]
    assert slow.faults[0].address == far and slow.faults[2].address == dev.memory_end + 64


def test_fault_inside_a_loop_names_the_same_iteration(dev: Device) -> None:
    pkg = repeat_program(dev, TRIPS)
    # the destination stride walks the last iteration's transfer off tile 1's image
    stride = pkg["p_stride"].copy()
    p = int(np.flatnonzero(pkg["p_target"] == 2)[0])
    stride[p] = 2 * stride[p]
    fast, slow = _both(pkg.with_arrays(p_stride=stride), *_repeat_io())
    _assert_agree(fast, slow)
    out = [f for f in slow.faults if f.code == F_DST_BUFFER]
    assert out and {f.iteration for f in out} == {2, 3} and out[0].loop == 1


def test_races_in_compute_and_exchange_same_faults_and_outputs(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 256, "activation")
    b.buffer("c", 0, base + 256, 256, "activation")
    b.buffer("d", 1, base, 256, "exchange-landing")
    b.io_block(b.io("a", "input", (64,), "fp32"), 0, base, (0,), (64,), 0, 0)
    b.io_block(b.io("c", "output", (48,), "fp32"), 0, base + 256, (0,), (48,), 0, 0)
    b.io_block(b.io("d", "output", (64,), "fp32"), 1, base, (0,), (64,), 0, 0)
    cp = {1: 64, 3: 64, 4: 3, 5: 64}
    # two vertices write overlapping rows (step 0); two transfers land on the same
    # bytes of tile 1 and a third overwrites bytes another one reads (step 1)
    b.compute((0, COPY, {**cp, 0: base, 2: base + 256}),
              (0, COPY, {**cp, 0: base + 64, 2: base + 256 + 32}))
    b.exchange((0, base, 1, base, 128), (0, base + 64, 1, base + 32, 64),
               (0, base + 256, 0, base, 64), (0, base + 128, 1, base + 128, 128))
    fast, slow = _both(b.build(), inputs={"a": np.arange(64, dtype=np.float32)})
    _assert_agree(fast, slow)
    assert [(f.code, f.step) for f in slow.faults] == [(F_RACE, 0), (F_RACE, 1)]
    # the later transfer wins on tile 1; every copy read the pre-step state
    np.testing.assert_array_equal(slow.outputs["d"][8:24], np.arange(16, 32))


def test_fault_cap_keeps_the_same_first_faults(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 64, "activation")
    b.buffer("c", 0, base + 64, 64, "activation")
    b.repeat(300)
    b.compute((0, COPY, {0: base, 1: 16, 2: base + 64, 3: 16, 4: 4, 5: 16}))  # a: never written
    b.end_repeat()
    fast, slow = _both(b.build())
    _assert_agree(fast, slow)
    assert slow.n_faults == 300 and len(slow.faults) == MAX_FAULTS
    assert [f.iteration for f in slow.faults[:3]] == [0, 1, 2]


# ---- a planner package ---------------------------------------------------------------


@pytest.fixture(scope="module")
def micro_package(micro_graph: Graph) -> Package:
    res = planner.plan(micro_graph, load_device("tiny"),
                       planner.PipelineConfig(optimization_steps=0))
    return res.package


def test_micro_vit_package_engines_agree(micro_graph: Graph, micro_package: Package) -> None:
    params = planner.init_params(micro_graph, seed=0)
    inputs = planner.init_inputs(micro_graph, seed=1)
    fast, slow = _both(micro_package, params, inputs)
    _assert_agree(fast, slow)
    assert slow.ok and slow.outputs and slow.vertex_invocations > micro_package.n_vertices


def test_micro_vit_dropped_transfer_same_faults(micro_graph: Graph,
                                               micro_package: Package) -> None:
    params = planner.init_params(micro_graph, seed=0)
    inputs = planner.init_inputs(micro_graph, seed=1)
    fast, slow = _both(_drop_transfer(micro_package, micro_package.n_transfers // 2),
                       params, inputs)
    _assert_agree(fast, slow)
    assert not slow.ok


@pytest.mark.parametrize("seed", range(8))
def test_micro_vit_random_transfer_corruptions_same_faults(
        micro_graph: Graph, micro_package: Package, seed: int) -> None:
    """A seeded corruption of one transfer (length, source or destination moved by
    an arbitrary byte count): both engines report the same faults (a race by
    step, tile and iteration) and the same outputs.  (Seeds 1, 2, 5, 6, 7 give
    misaligned, racy and unwritten-read faults; 0, 3, 4 corrupt harmlessly.)"""
    rng = np.random.default_rng(seed)
    pkg = micro_package
    x = int(rng.integers(pkg.n_transfers))
    field_name = ("x_bytes", "x_src_addr", "x_dst_addr")[seed % 3]
    values = pkg[field_name].copy()
    values[x] += int(rng.choice([-1, 1])) * int(rng.integers(1, 200))
    values[x] = max(int(values[x]), 1)
    _assert_same_faults(micro_graph, pkg.with_arrays(**{field_name: values}))


@pytest.mark.parametrize("seed", range(8))
def test_micro_vit_random_vertex_address_corruptions_same_faults(
        micro_graph: Graph, micro_package: Package, seed: int) -> None:
    """A seeded move of one operand address (arg 0, 2 or 4: an operand of every
    kernel) of one vertex by an arbitrary byte count.  (Misaligned accesses on
    most seeds; seed 2 a kernel error status and an unwritten read, seed 7 a race
    and an unwritten read, seed 1 harmless.)"""
    rng = np.random.default_rng(100 + seed)
    pkg = micro_package
    args = pkg["v_args"].copy()
    v = int(rng.integers(pkg.n_vertices))
    args[v, (0, 2, 4)[seed % 3]] += int(rng.choice([-1, 1])) * int(rng.integers(1, 600))
    _assert_same_faults(micro_graph, pkg.with_arrays(v_args=args))


def _assert_same_faults(graph: Graph, bad: Package) -> None:
    fast, slow = _both(bad, planner.init_params(graph, seed=0),
                       planner.init_inputs(graph, seed=1))

    def rows(res: SimResult) -> list[tuple[object, ...]]:
        return [r[:5] if r[0] == F_RACE else r for r in _fault_rows(res)]

    assert rows(slow) == rows(fast) and slow.n_faults == fast.n_faults
    assert slow.cycles == fast.cycles
    for name, arr in fast.outputs.items():
        np.testing.assert_array_equal(slow.outputs[name].view(np.uint32), arr.view(np.uint32))


@pytest.mark.parametrize("change", [{"sync_cycles": 600 + 123}, {"loop_overhead_cycles": 57},
                                    {"exchange_in_bytes_per_cycle": 1},
                                    {"receive_cycles": 40}, {"send_cycles": 30},
                                    {"patch_word_cycles": 500}])
def test_micro_vit_timing_mutations_move_both_engines_equally(
        micro_package: Package, change: dict[str, Any]) -> None:
    # the fabric changes: the package's exchange is scheduled afresh for it
    mutated = rescheduled(micro_package, device=micro_package.device.with_costs(**change))
    fast0, slow0 = _both(micro_package, numerics=False)
    fast1, slow1 = _both(mutated, numerics=False)
    _assert_agree(fast1, slow1)
    assert slow1.cycles != slow0.cycles
    assert slow1.cycles - slow0.cycles == fast1.cycles - fast0.cycles


@pytest.mark.slow
def test_vit_tiny_two_layers_on_c600_engines_agree() -> None:
    g = planner.load_model("vit-tiny", layers=2)
    pkg = planner.plan(g, load_device("c600"), planner.PipelineConfig(optimization_steps=0)).package
    fast, slow = _both(pkg, planner.init_params(g, seed=0), planner.init_inputs(g, seed=1))
    _assert_agree(fast, slow)
    assert slow.ok


def test_unknown_engine_lists_simpy(dev: Device) -> None:
    pkg = repeat_program(dev, 2)
    with pytest.raises(ConfigError, match="simpy"):
        run(pkg, numerics=False, engine="gem5")


def test_cli_simulate_engine_simpy(dev: Device, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from planner.cli import main
    from simulator import save_package

    pkg = ksplit_matmul(dev)[0]
    path = save_package(pkg, tmp_path / "pkg")
    outs = []
    for engine in ("numba", "simpy"):
        assert main(["simulate", str(path), "--seed", "3", "--engine", engine]) == 0
        outs.append([line.split("(simulated")[0] for line in capsys.readouterr().out.splitlines()])
    assert outs[0] == outs[1]
    assert f"cycles {run(pkg, numerics=False).cycles}" in "\n".join(outs[1])
