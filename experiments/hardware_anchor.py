"""Our plans of SigLIP-so400m as it ran on a C600, beside the published results.

    python experiments/hardware_anchor.py [--layers 27] [--batches 1,2] [--steps 8]

For each batch: `siglip-so400m-map` (patch embedding, the layers, final
LayerNorm, MAP head; fp8 projections / MLP / PV, fp16 QK) planned on the
calibrated c600 with the default baseline and `--steps` optimizer proposals,
then simulated (timing). Printed: cycles, ms at the c600 clock (1.5 GHz),
fraction of the fp8 AMP peak, cycles per layer, the compute / exchange / sync
split (and the Repeat loop's control), planning seconds and the peak tile
bytes; and the cosine to the fp32 forward of a 1-layer run with numerics (min
over output rows). Beside them the published figures, read by id from the
measurements the c600 preset is fitted to (simulator/calibration/ipu21.toml):
the best hand-tuned compiler runs (`vit27-b1-best-0913`,
`vit27-b2-qkfp8-search`) and the vendor SDK (`sdk-model-fp8-cycles`). A batch
whose baseline does not fit prints the failing stage, tile and bytes instead
of numbers.

Then, per batch, where the cycles went: per op family (the graph op kinds;
the Repeat loop's control as its own row) the cycles per layer split into
compute, exchange and sync (planner.breakdown, from the package's
provenance), and the share of the total.  Last, how well the optimizer's
estimates rank its proposals: Kendall's tau-b between estimated and simulated
gains of the proposals evaluated on the same model at 1 layer
(experiments/estimate_accuracy.py).
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from experiments.common import ROOT, publish, setup
from tilecommon.tables import table

MODEL = "siglip-so400m-map"
DATASET = ROOT / "simulator" / "calibration" / "ipu21.toml"
# batch -> the published runs to stand beside ours (ids in DATASET)
PUBLISHED = {1: ("vit27-b1-best-0913", "sdk-model-fp8-cycles"), 2: ("vit27-b2-qkfp8-search",)}
COLUMNS = ("run", "batch", "cycles", "ms @1.5GHz", "fp8 peak", "cycles/layer", "compute",
           "exchange", "sync", "loop", "plan s", "peak tile B", "cosine fp32")


def published(ids: tuple[str, ...]) -> list[list[object]]:
    """Rows of the published runs `ids` (cycles; cosine when the entry notes one)."""
    from simulator.measurements import by_id, read_file

    entries = by_id(read_file(DATASET))
    rows = []
    for i in ids:
        e = entries[i]
        cycles = int(e.get("cycles"))
        cos = re.search(r"cosine\s+([0-9.]+)", str(e.get("note", "")))
        rows.append([f"published {i}", int(e.get("batch")), f"{cycles:,}",
                     f"{cycles / 1.5e6:.3f}", "", f"{cycles // int(e.get('layers')):,}", "", "",
                     "", "", "", "", cos.group(1) if cos else ""])
    return rows


FAMILY_COLUMNS = ("batch", "family", "ops", "cycles/layer", "compute", "exchange", "sync",
                  "share")


def family_rows(batch: int, layers: int, ops: list[dict], total: int) -> list[list[object]]:
    """Per op family (planner.breakdown's `family`), biggest first: op count,
    cycles per layer and their compute / exchange / sync split, share of
    `total`."""
    fams: dict[str, list[int]] = {}
    for o in ops:
        f = fams.setdefault(o["family"], [0, 0, 0, 0, 0])
        f[0] += 1
        f[1] += o["cycles"]
        f[2] += o["compute"]
        f[3] += o["exchange"]
        f[4] += o["sync"]
    rows = []
    for name, (n, cyc, comp, xch, syn) in sorted(fams.items(), key=lambda kv: -kv[1][1]):
        rows.append([batch, name, n, f"{cyc // layers:,}", f"{comp // layers:,}",
                     f"{xch // layers:,}", f"{syn // layers:,}", f"{100 * cyc / total:.1f}%"])
    return rows


def ours(layers: int, batch: int, steps: int, cosine: str, model: str = MODEL,
         device_name: str = "c600", notes: list[str] | None = None,
         families: list[list[object]] | None = None) -> list[object]:
    """Our row for one batch (module docstring); a baseline that does not fit
    gives a row saying so and its failure, in full, appended to `notes`; the
    per-family rows are appended to `families`."""
    from planner import PipelineConfig, load_model, plan
    from planner.pipeline import breakdown
    from planner.report import roofline_fraction
    from simulator import load_device
    from tilecommon.errors import BuildFailure

    device = load_device(device_name)
    g = load_model(model, layers=layers, batch=batch)
    t0 = time.perf_counter()
    try:
        res = plan(g, device, PipelineConfig(optimization_steps=steps))
    except BuildFailure as e:
        if notes is not None:
            notes.append(f"batch {batch} does not fit: {e}")
        return [f"ours ({steps} steps)", batch, "does not fit"] + [""] * 9 + [cosine]
    secs = time.perf_counter() - t0
    bd = breakdown(res)
    tot = bd["cycle_totals"]
    c = res.cycles
    if families is not None:
        families += family_rows(batch, layers, bd["ops"], c)
    share = [f"{100 * tot[k] / c:.1f}%" for k in ("compute", "exchange", "sync", "loop")]
    return [f"ours ({steps} steps)", batch, f"{c:,}", f"{c / device.clock_hz * 1e3:.3f}",
            f"{100 * roofline_fraction(g, device, c):.1f}%", f"{c // layers:,}", *share,
            f"{secs:.1f}", f"{int(res.stats['peak_tile_bytes']):,}", cosine]


def one_layer_cosine(batch: int, model: str = MODEL, device: str = "c600") -> str:
    """min cosine to fp32 of a 1-layer run with numerics ("ok" / "FAIL" verdict)."""
    from planner import PipelineConfig, load_model
    from planner.pipeline import run_model
    from simulator import load_device

    out = run_model(load_model(model, layers=1, batch=batch), load_device(device),
                    PipelineConfig(optimization_steps=0))
    s = out.summary
    verdict = "" if s["numerics_ok"] else " (numerics FAIL)"
    return f"{s['cosine_fp32_min']:.4f} (1 layer){verdict}"


def tau_line(model: str, device: str, steps: int) -> str:
    """Kendall's tau-b of the proposals evaluated on `model` at 1 layer."""
    from experiments.estimate_accuracy import kendall_tau, proposal_rows
    from simulator import load_device

    props = proposal_rows(model, 1, load_device(device), steps)
    built = sum(r.simulated is not None for r in props)
    return (f"estimated vs simulated proposal gains on {model}, 1 layer, {steps} steps: "
            f"Kendall tau-b {kendall_tau(props):.2f} over {built} built proposals "
            "(experiments/estimate_accuracy.py)\n")


def main(argv: list[str] | None = None, out_dir: Path = Path("artifacts")) -> str:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--batches", default="1,2", help="comma-separated batch sizes")
    ap.add_argument("--steps", type=int, default=8, help="optimizer proposals (default 8)")
    ap.add_argument("--no-cosine", action="store_true", help="skip the 1-layer numerics run")
    ap.add_argument("--model", default=MODEL, help=f"zoo name or TOML path (default {MODEL})")
    ap.add_argument("--device", default="c600", help="device preset (default c600)")
    args = ap.parse_args(argv)
    setup()
    rows: list[list[object]] = []
    notes: list[str] = []
    families: list[list[object]] = []
    for b in (int(x) for x in args.batches.split(",")):
        cos = "" if args.no_cosine else one_layer_cosine(b, args.model, args.device)
        rows.append(ours(args.layers, b, args.steps, cos, args.model, args.device, notes,
                         families))
        if (args.layers, args.model, args.device) == (27, MODEL, "c600"):
            rows += published(PUBLISHED.get(b, ()))
    text = (table(COLUMNS, rows)
            + f"\n{args.model}, {args.layers} layers, on the calibrated {args.device}; ours: "
              f"default baseline + {args.steps} optimizer proposals, timing simulation; "
              "cosine: min over output rows to the fp32 forward (published: the runs' own notes).\n"
              "Published rows: the measurements file the c600 preset is fitted to "
              "(simulator/calibration/ipu21.toml), by id.\n"
            + "".join(f"{n}\n" for n in notes)
            + "\nwhere the cycles went (per layer: the totals over all steps / layers)\n"
            + table(FAMILY_COLUMNS, families) + "\n"
            + tau_line(args.model, args.device, args.steps))
    print(text)
    publish("hardware_anchor", "Hardware anchor: siglip-so400m-map against the published C600 "
            "runs", text, out_dir)
    return text


if __name__ == "__main__":
    main()
