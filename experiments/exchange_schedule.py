"""Experiment: how far the scheduled exchange lies above the endpoint bound.

Every exchange step of a package carries a static schedule (simulator.
xschedule); both engines charge its transfer window.  The planner still
estimates an exchange by its endpoint bound (simulator.timing.
endpoint_bound: the busiest tile's bytes in or out at 4 bytes a cycle, or
its control cycles).  This prints, per package, the distribution of
schedule / bound over its exchange steps, the two totals, the scheduler's
speed (transfers per second, median of REPEATS, in this process), and the
baseline's total cycles as simulated and as they were when each exchange
step was charged its bound; then the published schedule-over-bound figures of
the C600 toolchain beside it (simulator/calibration/ipu21.toml, kind
"exchange": the entries that state both a scheduled horizon and a bound).

Reproduce:  .venv/bin/python experiments/exchange_schedule.py [--no-27]
Writes artifacts/exchange_schedule.txt.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from experiments.common import ARTIFACTS, publish, setup
from tilecommon.tables import table

REPEATS = 3
# (model, layers) planned with the default baseline on c600, no optimizer steps
CASES = (("vit-tiny", 1), ("siglip-so400m-map", 1), ("siglip-so400m-map", 27))
# published scheduled horizon and the bound it was compared with, by entry id
PUBLISHED = (
    ("diag-attn-phase6", 33542, 2624, "attention prep: scheduled vs endpoint-only bound"),
    ("diag-attn-phase7", 36987, 2624, "attention prep: scheduled vs endpoint-only bound"),
    ("diag-attn-phase8", 37377, 2624, "attention prep: scheduled vs endpoint-only bound"),
    ("overlap-mlpup-p23", 17676, 11616, "MLP up: combined schedule vs max receive words"),
    ("overlap-mlpdown-p27", 15957, 10000, "MLP down: combined schedule vs max receive words"),
)


def _quantiles(r: np.ndarray) -> str:
    q = np.quantile(r, [0.0, 0.5, 0.9, 1.0])
    return " / ".join(f"{v:.2f}" for v in q)


def measure(model: str, layers: int) -> tuple[tuple[str, ...], np.ndarray]:
    """One row of the table and the per-step ratios of one package."""
    import planner
    import simulator
    from simulator.timing import package_bounds
    from simulator.xschedule import forget, schedule

    res = planner.plan(planner.load_model(model, layers=layers), simulator.load_device("c600"),
                       planner.PipelineConfig(optimization_steps=0))
    pkg = res.package
    a = pkg.arrays
    bounds = package_bounds(pkg)
    ex = (a["step_kind"] == 1) & (bounds > 0)
    win = a["step_xcycles"]
    ratio = win[ex] / bounds[ex]
    times = []
    for _ in range(REPEATS):
        forget()  # time the scheduler, not its memo of steps scheduled before
        t0 = time.perf_counter()
        schedule(pkg.device, a["step_xfer"], a["x_src_tile"], a["x_dst_tile"], a["x_bytes"],
                 a["x_send"])
        times.append(time.perf_counter() - t0)
    secs = statistics.median(times)
    from simulator.trace import step_executions

    # the same package timed as before the schedule: each exchange at its bound
    execs = step_executions(pkg)
    before = res.cycles - int((execs[ex] * (win[ex] - bounds[ex])).sum())
    row = (f"{model} {layers}L", f"{int(ex.sum())}", f"{pkg.n_transfers:,}",
           f"{int(bounds[ex].sum()):,}", f"{int(win[ex].sum()):,}",
           f"{win[ex].sum() / bounds[ex].sum():.3f}", _quantiles(ratio), f"{secs:.2f}",
           f"{pkg.n_transfers / secs / 1e6:.2f}", f"{before:,}", f"{res.cycles:,}")
    return row, ratio


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-27", action="store_true", help="skip the 27-layer package")
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    rows = []
    for model, layers in CASES:
        if args.no_27 and layers == 27:
            continue
        rows.append(measure(model, layers)[0])
    text = ("Scheduled exchange vs the endpoint bound, default baseline on c600 (no optimizer "
            "steps); ratio quantiles min / median / p90 / max over exchange steps; "
            f"scheduling time median of {REPEATS}\n"
            + table(("package", "steps", "transfers", "bound cycles", "scheduled cycles",
                     "total ratio", "per-step ratio", "schedule s", "M transfers/s",
                     "cycles at bound", "cycles scheduled"), rows)
            + "\n\nPublished C600 toolchain schedules against a bound "
            "(simulator/calibration/ipu21.toml)\n"
            + table(("entry", "scheduled", "bound", "ratio", "what"),
                    [(i, f"{s:,}", f"{b:,}", f"{s / b:.2f}", w) for i, s, b, w in PUBLISHED]))
    print(text)
    publish("exchange_schedule", "Scheduled exchange against the endpoint bound", text,
            args.out_dir)
    return text


if __name__ == "__main__":
    main()
