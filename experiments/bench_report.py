"""Benchmark: writing the interactive report and the full-chip trace of a run.

Question: are the profile outputs quick and small enough for the 27-layer
anchor workload?  Targets: the HTML report of siglip-so400m-map (27 layers,
c600) written in under 10 s and under 20 MB; the full-chip Perfetto trace
(all 1472 tiles) written in well under a minute.  Each output is timed
against a timing-only simulation of the same package in the same process
(the report runs one itself), so the ratio survives a noisy machine.

The package is the default baseline plus STEPS optimizer proposals.  Every
timed region is the median of REPEATS.

Reproduce:  .venv/bin/python experiments/bench_report.py [--small] [--steps N]
(--small: vit-micro on the tiny device, for the test suite).  Writes
artifacts/bench_report.txt.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from experiments.common import ARTIFACTS, publish, setup
from planner.html_report import write_report
from planner.ir.models import load_model
from planner.pipeline import run_model
from planner.search.incumbent import PipelineConfig
from simulator.chiptrace import write_chip_trace
from simulator.device import load_device
from simulator.run import run
from tilecommon.tables import table

REPEATS = 3
HEADER = ("model", "layers", "tiles", "output", "seconds", "x simulate", "MB", "target")


def _median(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    model, layers, device = (("vit-micro", None, "tiny") if args.small
                             else ("siglip-so400m-map", None, "c600"))
    graph = load_model(model) if layers is None else load_model(model, layers=layers)
    out = run_model(graph, load_device(device), PipelineConfig(optimization_steps=args.steps),
                    numerics=False)
    pkg = out.result.package
    sim = run(pkg, numerics=False)
    t_sim = _median(lambda: run(pkg, numerics=False), args.repeats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "report.html"
        trace = Path(tmp) / "chip.pftrace"
        t_html = _median(lambda: write_report(html, pkg, out.summary), args.repeats)
        t_trace = _median(lambda: write_chip_trace(pkg, sim, trace), args.repeats)
        n_layers = out.summary.get("layers", "-")
        for name, secs, path, target in (
                ("timing simulation", t_sim, None, "-"),
                ("HTML report", t_html, html, "< 10 s, < 20 MB"),
                ("full-chip trace", t_trace, trace, "< 60 s")):
            size = f"{path.stat().st_size / 1e6:.3f}" if path is not None else "-"
            rows.append((model, n_layers, pkg.tiles, name, f"{secs:.2f}",
                         f"{secs / t_sim:.1f}", size, target))
    text = (f"profile outputs of {model} on {device} ({args.steps} optimizer steps), "
            f"median of {args.repeats}\n" + table(HEADER, rows))
    print(text)
    publish("bench_report", "Report and full-chip trace: time and size", text, args.out_dir)
    return text


if __name__ == "__main__":
    main()
