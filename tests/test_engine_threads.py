"""The Numba engine from several threads at once: the thread pool of its
parallel vertex pass is entered from the main thread only, so concurrent runs
(a ThreadPoolExecutor handed to the optimizer, a threaded Dask worker) neither
abort nor change a result; and the checks-off timing path used to price the
checks gives the same cycles."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from experiments.bench_simulator import build_package, random_operands
from simulator import load_device, run
from simulator.engines import numba as engine
from simulator.engines.base import F_DST_BUFFER, F_RACE, F_SRC_BUFFER
from simulator.package import Package
from simulator.run import SimResult

SHAPE = (4, 32, 16)  # c600: 2944 vertices and 1472 transfers a step, both parallel passes


def ring(**changes: np.ndarray) -> Package:
    """The benchmark's ring package at SHAPE, with `changes` to its arrays."""
    pkg = build_package(load_device("c600"), 2, shape=SHAPE)
    return pkg.with_arrays(**changes) if changes else pkg


def main_and_worker(pkg: Package) -> tuple[SimResult, SimResult]:
    """`pkg` run with numerics from this (main) thread, on the cores, and from
    a worker thread, in program order."""
    a, w = random_operands(load_device("c600"), np.random.default_rng(5), SHAPE)
    main = run(pkg, params={"W": w}, inputs={"A": a})
    with ThreadPoolExecutor(1) as pool:
        side = pool.submit(lambda: run(pkg, params={"W": w}, inputs={"A": a})).result()
    return main, side


def test_concurrent_runs_from_threads_match_the_main_thread() -> None:
    pkg = build_package(load_device("c600"), 2)  # 2944 vertices a step: the parallel pass
    assert max(int(d) for d in (pkg["step_vtx"][1:] - pkg["step_vtx"][:-1])) >= \
        engine.PARALLEL_VERTICES
    main = run(pkg, numerics=False)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: run(pkg, numerics=False), range(6)))
    for r in results:
        assert (r.cycles, r.n_faults, r.vertex_invocations) == \
            (main.cycles, 0, main.vertex_invocations)
        assert (r.tile_busy == main.tile_busy).all()


def test_checks_off_changes_no_cycles() -> None:
    pkg = build_package(load_device("tiny"), 3, shape=(8, 32, 16))
    on, off = engine.execute(pkg), engine.execute(pkg, checks=False)
    assert on.cycles == off.cycles and (on.cycles_per_step == off.cycles_per_step).all()
    assert on.n_faults == off.n_faults == 0


def test_numerics_on_the_cores_match_a_run_in_one_thread() -> None:
    # the main thread executes large race-free compute steps and copies large
    # exchange steps on all cores, and costs exchange steps beside their checks
    # (simulator.engines.numba_data, numba_exchange); a worker thread
    # runs everything in program order: the images must agree bit for bit
    main, side = main_and_worker(ring())
    assert main.ok and side.ok
    assert main.outputs["C"].tobytes() == side.outputs["C"].tobytes()
    assert np.abs(main.outputs["C"]).max() > 0
    for name in ("cycles_per_step", "tile_busy", "tile_bytes_in", "tile_bytes_out"):
        assert (getattr(main, name) == getattr(side, name)).all(), name


def test_flagged_transfers_of_a_parallel_pass_fault_in_program_order() -> None:
    # the parallel exchange pass only flags; the main thread then reports the
    # flagged transfers in order, and a source address too wide for the
    # packed send sort takes the plain one: all as a worker thread's run
    pkg = ring()
    src, dst = pkg.arrays["x_src_addr"].copy(), pkg.arrays["x_dst_addr"].copy()
    src[5] = 1 << 40  # in no buffer, and wider than the packed sort's keys
    dst[900] = dst[900] + 1  # past its buffer's end
    dst[77] = 3  # in no buffer
    main, side = main_and_worker(ring(x_src_addr=src, x_dst_addr=dst))
    assert main.faults == side.faults and main.n_faults == side.n_faults
    first = main.faults[0]
    firsts = [f for f in main.faults if (f.step, f.iteration) == (first.step, first.iteration)]
    assert [(f.code, f.item) for f in firsts] == \
        [(F_SRC_BUFFER, 5), (F_DST_BUFFER, 77), (F_DST_BUFFER, 900)]
    for name in ("cycles_per_step", "tile_bytes_in", "tile_bytes_out"):
        assert (getattr(main, name) == getattr(side, name)).all(), name


@pytest.mark.parametrize("race", ["two destinations", "a destination on a source"])
def test_a_race_in_a_parallel_exchange_step_is_found_as_in_a_worker_thread(race: str) -> None:
    # the parallel pass stamps the sources' buffers and race_rows walks the
    # destinations by classes of tiles; a worker thread does both in order
    pkg = ring()
    dt, da = pkg.arrays["x_dst_tile"].copy(), pkg.arrays["x_dst_addr"].copy()
    if race == "two destinations":  # transfer 600 lands where 601 does
        dt[600], da[600] = dt[601], da[601]
    else:  # transfer 40 lands on what 41 sends
        dt[40], da[40] = pkg.arrays["x_src_tile"][41], pkg.arrays["x_src_addr"][41]
    main, side = main_and_worker(ring(x_dst_tile=dt, x_dst_addr=da))
    assert main.faults == side.faults and main.n_faults == side.n_faults
    races = [f for f in main.faults if f.code == F_RACE]
    assert races and {races[0].item, races[0].detail} == ({600, 601} if race == "two destinations"
                                                         else {40, 41})
    assert main.outputs["C"].tobytes() == side.outputs["C"].tobytes()
