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

Reproduce:  .venv/bin/python experiments/crosscheck_engines.py
Writes artifacts/crosscheck_engines.txt (the table).
"""

# ruff: noqa: E402  (the BLAS thread variables must be set before numpy loads)
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import tempfile
import time
from pathlib import Path

import numpy as np

import planner
from planner.ir.graph import Graph
from simulator import load_device, run
from simulator.package import Package
from simulator.run import SimResult

SEED = 0
REPEATS = 3
OUT_DIR = Path("artifacts")
MICRO_TOML = """\
name = "vit-micro"
hidden = 32
heads = 2
mlp = 64
patch = 4
channels = 3
tokens = 10
layers = 2
batch = 2
eps = 1e-6
"""
# (model: zoo name or "micro", device, layers)
CASES: tuple[tuple[str, str, int], ...] = (
    ("micro", "tiny", 1),
    ("micro", "tiny", 2),
    ("micro", "c600", 2),
    ("vit-tiny", "c600", 1),
)
SMALL_CASES: tuple[tuple[str, str, int], ...] = (("micro", "tiny", 1),)
FIELDS = ("cycles", "cycles_per_step", "tile_busy", "tile_bytes_in", "tile_bytes_out",
          "outputs", "faults")


def differences(fast: SimResult, slow: SimResult) -> list[str]:
    """Names of the FIELDS in which two results differ (outputs bit for bit)."""
    diff = []
    if fast.cycles != slow.cycles:
        diff.append("cycles")
    for name in FIELDS[1:5]:
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


def _package(model: str, device: str, layers: int, micro_path: Path) -> tuple[Graph, Package]:
    g = planner.load_model(micro_path if model == "micro" else model, layers=layers)
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
    header = (f"{'model':<9} {'device':<6} {'layers':>6} {'vertices':>9} {'transfers':>9} "
              f"{'numba cycles':>12} {'simpy cycles':>12} {'agree':>5} {'numba s':>8} "
              f"{'simpy s':>8} {'ratio':>7}")
    lines = [header]
    print(header, flush=True)
    warm = True
    with tempfile.TemporaryDirectory() as tmp:
        micro = Path(tmp) / "vit-micro.toml"
        micro.write_text(MICRO_TOML)
        for model, device, layers in cases:
            g, pkg = _package(model, device, layers, micro)
            params = planner.init_params(g, seed=SEED)
            inputs = planner.init_inputs(g, seed=SEED + 1)
            if warm:  # Numba compilation (both engines call jitted kernels) is not timed
                _timed(pkg, params, inputs, "numba")
                _timed(pkg, params, inputs, "simpy")
                warm = False
            fast, t_fast = _timed(pkg, params, inputs, "numba", repeats)
            slow, t_slow = _timed(pkg, params, inputs, "simpy", repeats)
            diff = differences(fast, slow)
            agree = "yes" if not diff else "NO: " + ",".join(diff)
            lines.append(
                f"{model:<9} {device:<6} {layers:>6} {fast.vertex_invocations:>9} "
                f"{pkg.n_transfers:>9} {fast.cycles:>12} {slow.cycles:>12} {agree:>5} "
                f"{t_fast:>8.3f} {t_slow:>8.3f} {t_slow / max(t_fast, 1e-9):>6.0f}x")
            print(lines[-1], flush=True)
    lines.append("vertices = vertex invocations (Repeat iterations counted); transfers = "
                 f"package transfers; seconds = simulator.run with numerics, best of {repeats}")
    print(lines[-1])
    table = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "crosscheck_engines.txt").write_text(table)
    return table


if __name__ == "__main__":
    main()
