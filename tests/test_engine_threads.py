"""The Numba engine from several threads at once: the thread pool of its
parallel vertex pass is entered from the main thread only, so concurrent runs
(a ThreadPoolExecutor handed to the optimizer, a threaded Dask worker) neither
abort nor change a result; and the checks-off timing path used to price the
checks gives the same cycles."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from experiments.bench_simulator import build_package
from simulator import load_device, run
from simulator.engines import numba as engine


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
    import numpy as np

    from experiments.bench_simulator import random_operands

    dev = load_device("c600")
    pkg = build_package(dev, 2, shape=(4, 32, 16))  # 2944 vertices, 1472 transfers a step
    a, w = random_operands(dev, np.random.default_rng(5), (4, 32, 16))
    main = run(pkg, params={"W": w}, inputs={"A": a})
    with ThreadPoolExecutor(1) as pool:
        side = pool.submit(lambda: run(pkg, params={"W": w}, inputs={"A": a})).result()
    assert main.ok and side.ok
    assert main.outputs["C"].tobytes() == side.outputs["C"].tobytes()
    assert np.abs(main.outputs["C"]).max() > 0
