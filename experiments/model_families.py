"""Every zoo model at full depth on the calibrated c600: does it fit, how fast?

For each zoo model (its TOML's layers, batch 1) this plans the default
baseline and STEPS optimizer proposals (`planner.plan`), simulates the final
package timing-only, and reports its cycles, the fraction of the fp8 compute
roofline, the compute / exchange / sync (and Repeat-loop control) split of the
cycles (planner.breakdown), the planning seconds and the peak tile bytes — or,
for a model that does not fit one chip, the failing stage, tile and bytes of
its BuildFailure (a baseline that does not fit is never retried).

Usage: python experiments/model_families.py [--small] [--steps N] [--out-dir DIR]
(--small: vit-micro and minilm-l6 at one layer, for the test suite).  Prints
the table and writes DIR/model_families.txt (experiments.common).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from experiments.common import ARTIFACTS, publish, setup
from planner.breakdown import step_kind_totals
from planner.ir.graph import model_parameter_count
from planner.ir.models import load_config, load_model, zoo_names
from planner.lowering.stages import peak_tile_bytes
from planner.pipeline import plan
from planner.report import roofline_fraction
from planner.search.incumbent import PipelineConfig
from simulator.device import Device, load_device
from simulator.run import run
from tilecommon.errors import BuildFailure
from tilecommon.tables import table

DEVICE = "c600"
STEPS = 8
SMALL = (("vit-micro", None), ("minilm-l6", 1))
HEADER = ("model", "kind", "layers", "parameters", "cycles", "fp8 peak", "compute",
          "exchange", "sync", "loop", "plan s", "peak tile B", "result")


def kind_of(model: str) -> str:
    cfg = load_config(model)
    if cfg.input == "patches":
        return "vit"
    return "decoder" if cfg.attention == "causal" else "encoder"


def family_row(model: str, layers: int | None, device: Device, steps: int) -> tuple[str, ...]:
    """One table row (module docstring)."""
    g = load_model(model, layers=layers, batch=1)
    n_layers = g.attr_int("layers")
    head = (model, kind_of(model), str(n_layers), f"{model_parameter_count(g):,}")
    t0 = time.perf_counter()
    try:
        res = plan(g, device, PipelineConfig(optimization_steps=steps))
    except BuildFailure as e:
        secs = time.perf_counter() - t0
        where = f"tile {e.tile}" if e.tile >= 0 else "device"
        return head + ("-",) * 6 + (f"{secs:.1f}", "-",
                                    f"does not fit: {e.stage}, {where}, needs {e.need:,} B "
                                    f"of {e.have:,}")
    secs = time.perf_counter() - t0
    sim = run(res.package, numerics=False)
    totals = step_kind_totals(res.package, sim.cycles_per_step)
    whole = max(sum(totals.values()), 1)

    def share(kind: str) -> str:
        return f"{100 * totals.get(kind, 0) / whole:.1f}%"

    return head + (f"{res.cycles:,}", f"{100 * roofline_fraction(g, device, res.cycles):.1f}%",
                   share("compute"), share("exchange"), share("sync"), share("loop"),
                   f"{secs:.1f}", f"{peak_tile_bytes(res.package):,}", "ok")


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="two small cases (the test suite's)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps ({STEPS})")
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    device = load_device(DEVICE)
    cases = SMALL if args.small else tuple((m, None) for m in zoo_names())
    rows = []
    for model, layers in cases:
        rows.append(family_row(model, layers, device, args.steps))
        print(" ".join(rows[-1]), flush=True)
    text = (f"zoo models at full depth, batch 1, on {DEVICE}, default baseline + {args.steps} "
            f"optimizer steps\n" + table(HEADER, rows, left=(0, 1, -1)))
    print(text)
    publish("model_families", "Model families: every zoo model at full depth", text,
            args.out_dir)
    return text


if __name__ == "__main__":
    main()
