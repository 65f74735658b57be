"""Benchmark: the simulator's numerics on planner packages against the numpy
reference forward, in the same process (the ratio is the figure to quote).

    python experiments/bench_numerics.py [--layers 1,27] [--repeats 3]

For each layer count: siglip-so400m on c600, the default baseline (no
optimizer steps); one untimed warm-up of each side, then `repeats` timed runs
of `planner.reference` and of `simulator.run(..., numerics=True)` (run-time
checks on, as always), alternating; the median of each and their ratio.  The
peak RSS column is the process's high-water mark after that row
(`resource.getrusage`), so it only grows down the table.  The outputs are
checked against the reference (relative Frobenius error).
"""

from __future__ import annotations

# ruff: noqa: E402  (the BLAS thread variables must be set before numpy loads)
from kernels.runtime import pin_blas_env

pin_blas_env()

import argparse
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from experiments.common import publish, setup
from simulator.tables import table

MODEL = "siglip-so400m"


def measure(layers: int, repeats: int, model: str = MODEL, device: str = "c600"
            ) -> list[object]:
    """One table row (module docstring)."""
    from planner import PipelineConfig, init_inputs, init_params, load_model, plan, reference
    from simulator import load_device, run

    g = load_model(model, layers=layers)
    res = plan(g, load_device(device), PipelineConfig(optimization_steps=0))
    params, inputs = init_params(g, seed=0), init_inputs(g, seed=1)
    ref = reference(g, params, inputs)
    sim = run(res.package, params=params, inputs=inputs)
    t_ref, t_sim = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = reference(g, params, inputs)
        t_ref.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sim = run(res.package, params=params, inputs=inputs)
        t_sim.append(time.perf_counter() - t0)
    y, r = sim.outputs["out"].astype(np.float64), ref["out"].astype(np.float64)
    rel = float(np.linalg.norm(y - r) / max(np.linalg.norm(r), 1e-30))
    m_ref, m_sim = statistics.median(t_ref), statistics.median(t_sim)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return [layers, res.package.n_transfers, sim.vertex_invocations, m_ref, m_sim,
            m_sim / m_ref, rel, sim.n_faults, rss_gb]


def cells(row: list[object]) -> list[object]:
    """A `measure` row as the table prints it."""
    layers, transfers, inv, m_ref, m_sim, ratio, rel, faults, rss = row
    return [layers, transfers, inv, f"{m_ref:.2f}", f"{m_sim:.2f}", f"{ratio:.2f}x",
            f"{rel:.2e}", faults, f"{rss:.2f}"]


def main(argv: list[str] | None = None, out_dir: Path = Path("artifacts")) -> str:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="1", help="comma-separated layer counts (default 1)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    setup()
    rows = [cells(measure(int(n), args.repeats)) for n in args.layers.split(",")]
    text = (table(("layers", "transfers", "vertex inv.", "reference s", "simulator s",
                   "sim / ref", "rel. Frobenius", "faults", "peak RSS GB"), rows)
            + f"\n{MODEL} on c600, default baseline; medians of {args.repeats} (same "
              "process, alternating, after a warm-up); reproduce: python "
              f"experiments/bench_numerics.py --layers {args.layers}\n")
    print(text)
    publish("bench_numerics", "Simulator numerics against the reference (planner packages)",
            text, out_dir)
    return text


if __name__ == "__main__":
    main()
