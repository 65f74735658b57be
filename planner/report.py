"""Run summaries: what `tileplan run` / `tileplan plan` print and save.

A summary is one flat JSON-able dict with at least the keys listed below
(`SUMMARY_KEYS`).  Units: cycles; `time_ms` at the device clock;
`roofline_fraction` = graph FLOPs / (tiles × 2 × fp8 MACs/cycle × cycles);
errors against `planner.reference` over all outputs together: relative
Frobenius ‖sim − ref‖ / ‖ref‖ and max |sim − ref| (None without numerics);
bytes; wall seconds.

`save_run(dir, package, summary)` writes `dir/package/` (simulator.save_package,
atomic) and then `dir/summary.json` (temporary file + os.replace), so a run
directory holding a summary.json is complete.  `load_summary(dir)` reads it
back (ConfigError naming the file when it is missing or not a summary).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kernels.exceptions import ConfigError
from planner.build.stages import STAGES
from planner.ir.graph import Graph, graph_flops
from simulator.device import Device
from simulator.files import write_file_atomic
from simulator.package import Package, save_package

SUMMARY_KEYS = (
    "model", "device", "layers", "batch", "cycles", "time_ms", "roofline_fraction",
    "max_abs_error", "rel_fro_error", "peak_tile_bytes", "plan_seconds", "simulate_seconds",
    "package_hash", "proposals_evaluated", "proposals_accepted",
)
REL_FRO_TOLERANCE = 1e-2
SUMMARY_FILE = "summary.json"
PACKAGE_DIR = "package"


def roofline_fraction(graph: Graph, device: Device, cycles: int) -> float:
    """FLOPs / (tiles × 2 × fp8 MACs/cycle × cycles); 0 for 0 cycles."""
    if cycles <= 0:
        return 0.0
    return graph_flops(graph) / (device.tiles * 2.0 * device.amp_macs_fp8 * cycles)


def compare(outputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]
            ) -> tuple[float, float]:
    """(relative Frobenius error, max abs error) over all outputs in `ref`.

    Raises KeyError naming an output the simulation did not produce."""
    num = 0.0
    den = 0.0
    worst = 0.0
    for name in sorted(ref):
        if name not in outputs:
            raise KeyError(f"simulation produced no output {name!r}; got {sorted(outputs)}")
        r = np.asarray(ref[name], dtype=np.float64)
        d = np.asarray(outputs[name], dtype=np.float64) - r
        num += float(np.sum(d * d))
        den += float(np.sum(r * r))
        worst = max(worst, float(np.max(np.abs(d))) if d.size else 0.0)
    rel = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    return rel, worst


def summarize(graph: Graph, device: Device, package: Package, cycles: int,
              baseline_cycles: int, history: tuple[Any, ...], stats: Mapping[str, Any],
              plan_seconds: float, simulate_seconds: float,
              errors: tuple[float, float] | None, faults: int) -> dict[str, Any]:
    """The summary dict (module docstring)."""
    rel, worst = errors if errors is not None else (None, None)
    return {
        "model": graph.name,
        "device": device.name,
        "layers": graph.attr_int("layers"),
        "batch": graph.attr_int("batch"),
        "cycles": int(cycles),
        "baseline_cycles": int(baseline_cycles),
        "time_ms": cycles / device.clock_hz * 1e3,
        "roofline_fraction": roofline_fraction(graph, device, cycles),
        "max_abs_error": worst,
        "rel_fro_error": rel,
        "numerics_ok": None if rel is None else bool(rel <= REL_FRO_TOLERANCE),
        "faults": int(faults),
        "peak_tile_bytes": int(stats.get("peak_tile_bytes", 0)),
        "peak_tile": dict(stats.get("peak_tile", {})),
        "plan_seconds": plan_seconds,
        "simulate_seconds": simulate_seconds,
        "package_hash": package.content_hash(),
        "proposals_evaluated": len(history),
        "proposals_accepted": sum(1 for h in history if getattr(h, "accepted", False)),
        "optimizer": stats.get("optimizer", "none"),
        "baseline_policy": stats.get("baseline_policy", "default"),
        "steps": int(stats.get("steps", package.n_steps)),
        "vertices": int(stats.get("vertices", package.n_vertices)),
        "transfers": int(stats.get("transfers", package.n_transfers)),
        "arithmetic_patches": int(stats.get("arithmetic_patches", 0)),
        "table_patches": int(stats.get("table_patches", 0)),
        "stage_seconds": dict(stats.get("stage_seconds", {})),
    }


def _peak_detail(p: Mapping[str, int]) -> str:
    if not p:
        return ""
    return (f" (tile {p['tile']}: code {p['code']:,}, exchange tables {p['exchange-table']:,}, "
            f"support {p['support']:,}, tensors {p['tensor']:,})")


def format_summary(s: Mapping[str, Any]) -> str:
    """Human-readable summary, one fact per line."""
    errs = "not computed (--no-numerics)"
    if s.get("rel_fro_error") is not None:
        verdict = "ok" if s["numerics_ok"] else f"OUTSIDE tolerance {REL_FRO_TOLERANCE:g}"
        errs = (f"rel. Frobenius {s['rel_fro_error']:.3e}, max abs {s['max_abs_error']:.4g} "
                f"({verdict})")
    secs = dict(s.get("stage_seconds", {}))
    names = sorted(secs, key=lambda k: (STAGES.index(k) if k in STAGES else 99, k))
    stages = ", ".join(f"{k} {secs[k]:.2f}" for k in names)
    lines = [
        f"model {s['model']} ({s['layers']} layers, batch {s['batch']}) on {s['device']}",
        f"cycles           {s['cycles']:,} ({s['time_ms']:.4f} ms); baseline "
        f"{s['baseline_cycles']:,}",
        f"fp8 roofline     {100 * s['roofline_fraction']:.2f}%",
        f"numerics         {errs}",
        f"faults           {s['faults']}",
        f"peak tile bytes  {s['peak_tile_bytes']:,}{_peak_detail(s.get('peak_tile', {}))}",
        f"program          {s['steps']} steps, {s['vertices']} vertices, {s['transfers']} "
        f"transfers, patches {s['arithmetic_patches']} arithmetic / {s['table_patches']} table",
        f"proposals        {s['proposals_evaluated']} evaluated, {s['proposals_accepted']} "
        f"accepted (baseline: {s.get('baseline_policy', 'default')}, optimizer: "
        f"{s['optimizer']})",
        f"planning         {s['plan_seconds']:.2f} s ({stages})",
        f"simulation       {s['simulate_seconds']:.2f} s",
        f"package          {s['package_hash']}",
    ]
    return "\n".join(lines)


def save_run(out: str | os.PathLike[str], package: Package, summary: Mapping[str, Any]) -> Path:
    """Write package/ and summary.json under `out` (module docstring)."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(str(root), "--out", "exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    save_package(package, root / PACKAGE_DIR)
    write_file_atomic(root / SUMMARY_FILE,
                      lambda f: json.dump(dict(summary), f, indent=1, sort_keys=True))
    return root


def load_summary(run: str | os.PathLike[str]) -> dict[str, Any]:
    """The summary saved in run directory `run` (or a summary.json path)."""
    path = Path(run)
    if path.is_dir():
        path = path / SUMMARY_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), "run", "no such run summary") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(str(path), "run", f"not a JSON summary: {e}") from None
    missing = [k for k in SUMMARY_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ConfigError(str(path), missing[0], "missing from the run summary")
    return data
