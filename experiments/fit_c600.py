"""How well does the calibrated c600 match the published IPU21 measurements,
and does its footprint model put a 27-layer siglip-so400m where the hardware
builds put it?

1. The kernel-level fit: `simulator.calibrate.calibrate` on the repo's copy of
   the published measurements (simulator/calibration/ipu21.toml, its header
   names the public source), starting from the c600 preset; the per-family
   error table as `tileplan calibrate` prints it, with the measurements held
   back to check that the fit generalises.
2. The footprint: the default baseline of siglip-so400m (27 layers, batch 1)
   on the calibrated c600, per-tile code, exchange-table, support and tensor
   bytes (min / median / max over the tiles that hold anything), beside the
   published figures of the hardware builds (dataset entries by id).

Usage: python experiments/fit_c600.py [--small] [--out-dir DIR]
(`--small` fits only and skips the 27-layer build).  Prints the tables,
writes DIR/fit_c600.txt and the measured-vs-fitted plot DIR/fit_c600.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.common import ARTIFACTS, publish, setup
from planner.ir.models import load_model
from planner.pipeline import plan
from planner.search.incumbent import PipelineConfig
from simulator.calibrate import PROGRAM_CALLS, PROGRAM_STEPS, calibrate, format_report, plot
from simulator.device import Device, load_device
from simulator.measurements import by_id, read_file
from simulator.package import Package
from tilecommon.tables import table

DATASET = Path(__file__).resolve().parents[1] / "simulator" / "calibration" / "ipu21.toml"
MODEL, LAYERS = "siglip-so400m", 27
# (our column, dataset id, what the published figure is)
PUBLISHED = (
    ("code", "linked-exec-bytes-tile0", "linked runtime + kernel sections, tile 0"),
    ("code", "generated-program-bytes-27l", "generated program storage, 27 layers"),
    ("exchange tables", "27l-baseline-exchange-table", "largest exchange table, 27L baseline"),
    ("tensor", "support-tensor-bytes-before", "tensor bytes available per tile, 27L"),
)


def footprint(pkg: Package) -> dict[str, np.ndarray]:
    """Per-tile bytes by part (the package's footprint arrays) of the tiles
    that hold anything."""
    a = pkg.arrays
    per = {"code": a["fp_code"], "exchange tables": a["fp_xtable"],
           "support": a["fp_support"], "tensor": a["fp_tensor"]}
    used = sum(per.values()) > 0
    return {n: v[used] for n, v in per.items()}


def program_structure(pkg: Package) -> tuple[int, int]:
    """Median vertex calls and compute steps per tile that holds a vertex
    (a Repeat body once): what calibrate.PROGRAM_CALLS / PROGRAM_STEPS assume."""
    a = pkg.arrays
    v_tile = a["v_tile"]
    v_step = np.repeat(np.arange(pkg.n_steps), np.diff(a["step_vtx"]))
    calls = np.bincount(v_tile, minlength=pkg.tiles)
    steps = np.bincount(np.unique(v_step * pkg.tiles + v_tile) % pkg.tiles,
                        minlength=pkg.tiles)
    used = calls > 0
    return int(np.median(calls[used])), int(np.median(steps[used]))


def footprint_table(device: Device, pkg: Package) -> str:
    ours = footprint(pkg)
    entries = by_id(read_file(DATASET))
    rows = []
    for part, values in ours.items():
        rows.append((part, f"{int(values.min()):,}", f"{int(np.median(values)):,}",
                     f"{int(values.max()):,}", "", ""))
        for col, eid, what in PUBLISHED:
            if col == part:
                rows.append(("", "", "", "", f"{int(entries[eid].fields['value']):,}",
                             f"{what} ({eid})"))
    total = sum(ours.values())
    head = (f"{MODEL}, {LAYERS} layers, batch 1, default baseline on {device.name}: "
            f"{pkg.tiles} tiles, fullest tile {int(total.max()):,} of "
            f"{device.memory_size:,} bytes")
    calls, steps = program_structure(pkg)
    tail = (f"median tile: {calls} vertex calls in {steps} compute steps of the Repeat body "
            f"(the fit of vertex_code_bytes assumes {PROGRAM_CALLS} and {PROGRAM_STEPS})")
    return (head + "\n" + table(("per tile", "min", "median", "max", "published", "entry"),
                                rows, left=(0, 5)) + "\n" + tail)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="the fit only (no 27-layer build)")
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    start = load_device("c600")
    cal = calibrate(read_file(DATASET), start)
    parts = [format_report(cal, "simulator/calibration/ipu21.toml")]
    if not args.small:
        res = plan(load_model(MODEL, layers=LAYERS), cal.device,
                   PipelineConfig(optimization_steps=0))
        parts.append(footprint_table(cal.device, res.package))
    text = "\n\n".join(parts)
    print(text)
    publish("fit_c600", "Calibrated c600 against the published IPU21 measurements", text,
            args.out_dir)
    plot(cal, args.out_dir / "fit_c600.png")
    return text


if __name__ == "__main__":
    main()
