"""Cross-check: the Numba engine against the SimPy event-level engine.

Question: on small planner packages, do the two independent engines
(simulator/engines/numba.py, simulator/engines/simpy.py) agree exactly — total cycles,
cycles per step, per-tile busy cycles, exchange bytes in/out, outputs bit for
bit, faults — and what does the event-level model cost in wall time?

For each case in CASES (model, device, layers) the baseline package is planned
(optimization_steps=0) and run with numerics by both engines on the same
params/inputs (SEED, SEED + 1).  Wall times cover `simulator.run` (memory
image, engine, outputs), best of REPEATS; one untimed run of both engines on
the first package comes first, so Numba compilation is not counted.  "agree" is "yes" only if
every compared field is identical.

With --siglip27: the 27-layer siglip-so400m-map package as `tileplan plan`
makes it (c600, 8 optimization steps), run once by each engine without
numerics (the memory image of 27 layers is beside the point: the question is
cycles), every timing field compared.

Reproduce:  .venv/bin/python experiments/crosscheck_engines.py [--siglip27]
Writes artifacts/crosscheck_engines.txt (or crosscheck_engines_27.txt).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import planner
from experiments.common import publish, setup
from planner.ir.graph import Graph
from simulator import load_device, run
from simulator.package import Package
from simulator.run import SimResult
from tilecommon.tables import table as table_text

SEED = 0
REPEATS = 3
OUT_DIR = Path("artifacts")
# (zoo model, device, layers)
CASES: tuple[tuple[str, str, int], ...] = (
    ("vit-micro", "tiny", 1),
    ("vit-micro", "tiny", 2),
    ("vit-micro", "c600", 2),
    ("vit-tiny", "c600", 1),
)
SMALL_CASES: tuple[tuple[str, str, int], ...] = (("vit-micro", "tiny", 1),)
FIELDS = ("cycles", "cycles_per_step", "tile_busy", "tile_bytes_in", "tile_bytes_out",
          "tile_send_busy", "tile_receive_busy", "outputs", "faults")


def differences(fast: SimResult, slow: SimResult) -> list[str]:
    """Names of the FIELDS in which two results differ (outputs bit for bit)."""
    diff = []
    if fast.cycles != slow.cycles:
        diff.append("cycles")
    for name in FIELDS[1:7]:
        if not np.array_equal(getattr(fast, name), getattr(slow, name)):
            diff.append(name)
    same_out = sorted(fast.outputs) == sorted(slow.outputs) and all(
        np.array_equal(fast.outputs[k].view(np.uint32), slow.outputs[k].view(np.uint32))
        for k in fast.outputs)
    if not same_out:
        diff.append("outputs")
    if [f.message for f in fast.faults] != [f.message for f in slow.faults]:
        diff.append("faults")
    return diff


def _package(model: str, device: str, layers: int) -> tuple[Graph, Package]:
    g = planner.load_model(model, layers=layers)
    res = planner.plan(g, load_device(device), planner.PipelineConfig(optimization_steps=0))
    return g, res.package


def _timed(pkg: Package, params: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
           engine: str, repeats: int = 1) -> tuple[SimResult, float]:
    """The result of the last run and the best wall time of `repeats` runs."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = run(pkg, params=params, inputs=inputs, engine=engine)
        best = min(best, time.perf_counter() - t0)
    return res, best


def main(cases: tuple[tuple[str, str, int], ...] = CASES, out_dir: Path = OUT_DIR,
         repeats: int = REPEATS) -> str:
    """Run every case, print and write the table; returns it."""
    setup()
    header = ("model", "device", "layers", "vertices", "transfers", "numba cycles",
              "simpy cycles", "agree", "numba s", "simpy s", "ratio")
    rows = []
    warm = True
    for model, device, layers in cases:
        g, pkg = _package(model, device, layers)
        params = planner.init_params(g, seed=SEED)
        inputs = planner.init_inputs(g, seed=SEED + 1)
        if warm:  # Numba compilation (both engines call jitted kernels) is not timed
            _timed(pkg, params, inputs, "numba")
            _timed(pkg, params, inputs, "simpy")
            warm = False
        fast, t_fast = _timed(pkg, params, inputs, "numba", repeats)
        slow, t_slow = _timed(pkg, params, inputs, "simpy", repeats)
        diff = differences(fast, slow)
        rows.append((model, device, layers, fast.vertex_invocations, pkg.n_transfers,
                     fast.cycles, slow.cycles, "yes" if not diff else "NO: " + ",".join(diff),
                     f"{t_fast:.3f}", f"{t_slow:.3f}", f"{t_slow / max(t_fast, 1e-9):.0f}x"))
        print(f"{model} {device} {layers}: done", flush=True)
    table = (table_text(header, rows) + "\nvertices = vertex invocations (Repeat iterations "
             "counted); transfers = package transfers; seconds = simulator.run with numerics, "
             f"best of {repeats}\n")
    print(table)
    publish("crosscheck_engines", "Numba engine against the SimPy engine", table, out_dir)
    return table


def siglip27(out_dir: Path = OUT_DIR) -> str:
    """Both engines, timing only, on the planned 27-layer siglip-so400m-map."""
    setup()
    g = planner.load_model("siglip-so400m-map")
    pkg = planner.plan(g, load_device("c600"), planner.PipelineConfig()).package
    runs = {}
    for engine in ("numba", "simpy"):
        t0 = time.perf_counter()
        runs[engine] = (run(pkg, numerics=False, engine=engine), time.perf_counter() - t0)
        print(f"{engine}: {runs[engine][0].cycles} cycles in {runs[engine][1]:.1f} s", flush=True)
    (fast, t_fast), (slow, t_slow) = runs["numba"], runs["simpy"]
    diff = [d for d in differences(fast, slow) if d != "outputs"]
    agree = "yes" if not diff else "NO: " + ",".join(diff)
    rows = [("siglip-so400m-map", "c600", 27, pkg.content_hash()[:12], fast.vertex_invocations,
             pkg.n_transfers, fast.cycles, slow.cycles, agree, f"{t_fast:.1f}", f"{t_slow:.0f}")]
    table = (table_text(("model", "device", "layers", "package", "vertices", "transfers",
                         "numba cycles", "simpy cycles", "agree", "numba s", "simpy s"), rows)
             + "\nvertices = vertex invocations (Repeat iterations counted); transfers = package "
               "transfers; timing only; "
               "agree = cycles, cycles per step, per-tile busy and bytes in/out, faults\n")
    print(table)
    publish("crosscheck_engines_27", "Both engines on the 27-layer package", table, out_dir)
    return table


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--siglip27", action="store_true",
                    help="the planned 27-layer siglip-so400m-map, timing only")
    if ap.parse_args().siglip27:
        siglip27()
    else:
        main()
