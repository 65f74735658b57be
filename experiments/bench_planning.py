"""How long does baseline planning take, and how good is the baseline?

For each case (model, layers) on DEVICE this plans the baseline only
(`optimization_steps=0`: baseline policy → expand → schedule → allocate →
link → verify), simulates it timing-only, and reports planning seconds
(wall time of `planner.plan`: baseline policy, build and the timing
simulation that costs it), simulated
cycles, the fraction of the fp8 compute roofline (graph FLOPs / (tiles × 2 ×
fp8 MACs/cycle × cycles)), the peak tile bytes (code + exchange tables +
support + tensor range), or the BuildFailure of a case that does not fit.

One untimed warm-up plan (WARMUP) runs first, so no row pays numba's
one-time compilation.

Targets: siglip-so400m 1 layer planned in ≤ 10 s, 27 layers in ≤ 20 s (the
Repeat body is planned once).  Planning is deterministic, so no seed is
involved.

Usage: python experiments/bench_planning.py [--small] [--out-dir DIR]
Prints the table and writes DIR/bench_planning.txt (experiments.common).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from experiments.common import ARTIFACTS, publish, setup
from planner.ir.models import load_model
from planner.lowering.stages import peak_tile_bytes
from planner.pipeline import plan
from planner.report import roofline_fraction
from planner.search.incumbent import PipelineConfig
from simulator.device import Device, load_device
from tilecommon.errors import BuildFailure
from tilecommon.tables import table

DEVICE = "c600"
CASES = (("vit-tiny", 2), ("siglip-so400m", 1), ("siglip-so400m", 27))
SMALL_CASES = (("vit-tiny", 1),)
WARMUP = ("vit-tiny", 1)
HEADER = ("model", "layers", "plan s", "cycles", "fp8 roofline", "peak tile bytes", "result")


def bench_case(model: str, layers: int, device: Device) -> tuple[str, ...]:
    """One table row: planning seconds, cycles, roofline, peak bytes, result."""
    graph = load_model(model, layers=layers)
    t0 = time.perf_counter()
    try:
        res = plan(graph, device, PipelineConfig(optimization_steps=0))
    except BuildFailure as e:
        secs = time.perf_counter() - t0
        return (model, str(layers), f"{secs:.2f}", "-", "-", "-", " ".join(str(e).split()))
    secs = time.perf_counter() - t0
    frac = roofline_fraction(graph, device, res.cycles)
    return (model, str(layers), f"{secs:.2f}", f"{res.cycles:,}", f"{100 * frac:.2f}%",
            f"{peak_tile_bytes(res.package):,}", "ok")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="run SMALL_CASES only")
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    device = load_device(DEVICE)
    cases = SMALL_CASES if args.small else CASES
    bench_case(*WARMUP, device)  # numba compiles (or loads its cache) once, untimed
    rows = [bench_case(m, n, device) for m, n in cases]
    text = f"baseline planning on {DEVICE}\n" + table(HEADER, rows, left=(0, -1))
    print(text)
    publish("bench_planning", "Baseline planning time and quality", text, args.out_dir)
    return text


if __name__ == "__main__":
    main()
