"""Run summaries: what `tileplan run` / `tileplan plan` print and save.

A summary is one flat JSON-able dict with at least the keys listed below
(`SUMMARY_KEYS`; every field, its type and range in
planner/schemas/summary.schema.json, `SUMMARY_SCHEMA`).  Units: cycles;
`time_ms` at the device clock;
`roofline_fraction` = graph FLOPs / (tiles × 2 × fp8 MACs/cycle × cycles);
errors against `planner.reference` over all outputs together: relative
Frobenius ‖sim − ref‖ / ‖ref‖ and max |sim − ref| (None without numerics);
accuracy as hardware runs report it: `cosine_fp32_min` / `_mean`, the cosine
of each simulated output row to the same row of the fp32 forward
(`reference.fp32_graph`, same parameters), min and mean; `fp8_noise` the
relative Frobenius distance of the fp8 reference from that fp32 forward
(numerics pass within `tolerance(fp8_noise)`);
bytes; wall seconds.

`save_run(dir, package, summary)` writes `package/`, `summary.json`, `tiles.npz`
(per-tile arrays, docs/contracts.md section 8) and `plan.toml` into a
directory beside `dir` that then replaces it (tilecommon.files.atomic_dir), so
`dir` is always either the old run or the whole new one.  `load_summary(dir)` reads it
back (ConfigError naming the file when it is missing or not a summary).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from planner.ir.graph import Graph, graph_flops
from planner.lowering.stages import STAGES
from simulator.device import Device
from simulator.package import Package, save_package
from tilecommon.config import check_regular_file
from tilecommon.errors import ConfigError
from tilecommon.files import atomic_dir, check_output_dir, write_file_atomic

# the one definition of a summary's fields, their types and ranges (JSON Schema,
# shipped with the package so other tools can validate a summary.json too)
SUMMARY_SCHEMA: dict[str, Any] = json.loads(
    (Path(__file__).parent / "schemas" / "summary.schema.json").read_text())
SUMMARY_KEYS: tuple[str, ...] = tuple(SUMMARY_SCHEMA["required"])


def _is_numeric(prop: Mapping[str, Any]) -> bool:
    ref = prop.get("$ref", "")
    if ref:
        prop = SUMMARY_SCHEMA["$defs"][ref.rsplit("/", 1)[1]]
    kinds = prop.get("type", ())
    kinds = (kinds,) if isinstance(kinds, str) else kinds
    return bool({"integer", "number"} & set(kinds))


# keys whose values are numbers (sweeps plot and tabulate these)
NUMERIC_SUMMARY_KEYS: tuple[str, ...] = tuple(
    k for k, p in SUMMARY_SCHEMA["properties"].items() if _is_numeric(p))
SUMMARY_DEFAULTS: dict[str, Any] = {
    "precision": "fp8",
    "baseline_cycles": None, "numerics_ok": None, "faults": 0, "peak_tile": {}, "steps": "?",
    "vertices": "?", "transfers": "?", "arithmetic_patches": "?", "table_patches": "?",
    "optimizer": "?", "baseline_policy": "?", "stage_seconds": {}, "nonfinite": None,
    "casts": {}, "ops": [], "cycle_totals": {}, "tile_busy": {}, "cosine_fp32_min": None,
    "cosine_fp32_mean": None, "fp8_noise": None,
}
REL_FRO_TOLERANCE = 1e-2
NOISE_SPREAD = 2 ** 0.5  # two forwards with independent errors of size n are √2·n apart
SUMMARY_FILE = "summary.json"
PLAN_FILE = "plan.toml"  # the final plan (planner.decide.constraints grammar)
TILES_FILE = "tiles.npz"  # per-tile arrays (planner.breakdown.tile_arrays)
MAX_SUMMARY_BYTES = 1 << 30
PACKAGE_DIR = "package"


def roofline_fraction(graph: Graph, device: Device, cycles: int) -> float:
    """FLOPs / (tiles × 2 × fp8 MACs/cycle × cycles); 0 for 0 cycles."""
    if cycles <= 0:
        return 0.0
    return graph_flops(graph) / (device.tiles * 2.0 * device.amp_macs_fp8 * cycles)


def compare(outputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]
            ) -> tuple[float, float]:
    """(relative Frobenius error, max abs error) over all outputs in `ref`.

    A non-finite value on either side makes both errors NaN (never a pass).
    Raises KeyError naming an output the simulation did not produce."""
    num = 0.0
    den = 0.0
    worst = [0.0]
    for name in sorted(ref):
        if name not in outputs:
            raise KeyError(f"simulation produced no output {name!r}; got {sorted(outputs)}")
        r = np.asarray(ref[name], dtype=np.float64)
        d = np.asarray(outputs[name], dtype=np.float64) - r
        num += float(np.sum(d * d))
        den += float(np.sum(r * r))
        if d.size:
            worst.append(float(np.max(np.abs(d))))
    rel = float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
    return rel, float(np.max(worst))


def cosine_rows(outputs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]
                ) -> tuple[float, float]:
    """(min, mean) cosine similarity of each output row (last axis: a token,
    or a pooled image) of `outputs` to the same row of `ref`, over all
    outputs; a zero row on either side counts 1 when both are zero, else 0;
    a non-finite value makes both NaN."""
    cos: list[np.ndarray] = []
    for name in sorted(ref):
        r = np.asarray(ref[name], dtype=np.float64).reshape(-1, ref[name].shape[-1])
        s = np.asarray(outputs[name], dtype=np.float64).reshape(r.shape)
        nr, ns = np.linalg.norm(r, axis=1), np.linalg.norm(s, axis=1)
        dot = np.sum(r * s, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            c = np.where((nr > 0) & (ns > 0), dot / (nr * ns), (nr == ns).astype(np.float64))
        cos.append(c)
    allc = np.concatenate(cos) if cos else np.ones(1)
    if not np.all(np.isfinite(allc)):
        return float("nan"), float("nan")
    return float(np.min(allc)), float(np.mean(allc))


def first_nonfinite(arrays: Mapping[str, np.ndarray], side: str) -> str | None:
    """Where the first NaN or infinity of `arrays` (by name, then C order) is,
    as "`side` out[3, 17] = nan", or None when every value is finite."""
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            idx = np.unravel_index(int(bad[0]), a.shape)
            where = ", ".join(str(int(i)) for i in idx)
            return f"{side} {name}[{where}] = {a[idx]}"
    return None


def numerics_ok(rel: float | None, max_abs: float | None, nonfinite: str | None,
                noise: float | None = None) -> bool:
    """Within tolerance: finite errors, relative Frobenius <= the tolerance
    (`tolerance(noise)`), and no non-finite output."""
    return (nonfinite is None and rel is not None and max_abs is not None
            and bool(np.isfinite(rel)) and bool(np.isfinite(max_abs))
            and rel <= tolerance(noise))


def tolerance(noise: float | None) -> float:
    """The relative Frobenius error a simulation may have against the fp8
    reference: REL_FRO_TOLERANCE, or √2 × the fp8 reference's own distance
    from the fp32 forward (`noise`) when that is larger.  Two fp8 forwards
    whose fp32 sums differ only in order (BLAS vs split-K partials) round a
    few values to neighbouring fp16 / fp8 codes, and downstream fp8 casts
    spread those flips until the two carry rounding errors of the same size,
    no longer the same errors: two forwards each `noise` from exact
    arithmetic, with independent errors, are √2 × `noise` apart.  (Deep
    towers get there: siglip-so400m-map at 2 layers is 4.6e-2 from its fp8
    reference with noise 4.4e-2, cosine to fp32 0.9989.)  A simulation within
    it agrees as well as fp8 arithmetic allows; a wrong kernel, layout or
    scale gives errors of order 1, far outside either."""
    if noise is None or not np.isfinite(noise):
        return REL_FRO_TOLERANCE
    return max(REL_FRO_TOLERANCE, NOISE_SPREAD * float(noise))


def summarize(graph: Graph, device: Device, package: Package, cycles: int,
              baseline_cycles: int, history: tuple[Any, ...], stats: Mapping[str, Any],
              plan_seconds: float, simulate_seconds: float,
              errors: tuple[float, float] | None, faults: int, nonfinite: str | None = None,
              casts: Mapping[str, Mapping[str, float]] | None = None,
              cosine: tuple[float, float] | None = None,
              noise: float | None = None) -> dict[str, Any]:
    """The summary dict (module docstring)."""
    rel, worst = errors if errors is not None else (None, None)
    cmin, cmean = cosine if cosine is not None else (None, None)
    checked = errors is not None or nonfinite is not None
    saturated = any(v.get("saturated", 0) > 0 for v in (casts or {}).values())
    return {
        "model": graph.name,
        "device": device.name,
        "layers": graph.attr_int("layers"),
        "precision": str(graph.attr("precision", "fp8")),
        "batch": graph.attr_int("batch"),
        "cycles": int(cycles),
        "baseline_cycles": int(baseline_cycles),
        "time_ms": cycles / device.clock_hz * 1e3,
        "roofline_fraction": roofline_fraction(graph, device, cycles),
        "max_abs_error": worst,
        "rel_fro_error": rel,
        # a saturating fp8 tensor fails the run even when its clipped values
        # still agree with the reference (docs/weights.md)
        "numerics_ok": (numerics_ok(rel, worst, nonfinite, noise) and not saturated)
        if checked else None,
        "fp8_noise": noise,
        "nonfinite": nonfinite,
        "cosine_fp32_min": cmin,
        "cosine_fp32_mean": cmean,
        "casts": {k: dict(v) for k, v in (casts or {}).items()},
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
    keys = ("tile", "code", "exchange-table", "support", "tensor")
    if not all(isinstance(p.get(k), int) for k in keys):
        return ""
    return (f" (tile {p['tile']}: code {p['code']:,}, exchange tables {p['exchange-table']:,}, "
            f"support {p['support']:,}, tensors {p['tensor']:,})")


def _breakdown_lines(s: Mapping[str, Any]) -> list[str]:
    """Cycles by step kind, the costliest ops, per-tile balance (when known)."""
    lines = []
    tot, total = dict(s.get("cycle_totals") or {}), max(int(s["cycles"]), 1)
    if tot:
        order = ("compute", "exchange", "sync", "loop")  # saved summaries sort their keys
        kinds = sorted(tot, key=lambda k: (order.index(k) if k in order else len(order), k))
        lines.append("cycles by kind   " + ", ".join(
            f"{k} {100 * int(tot[k]) / total:.1f}%" for k in kinds))
    ops = list(s.get("ops") or [])
    if ops:
        top = ", ".join(f"{o['op']} {100 * o['cycles'] / total:.1f}%" for o in ops[:4])
        lines.append(f"costliest ops    {top} (of {len(ops)})")
    tb = dict(s.get("tile_busy") or {})
    if tb.get("tiles"):
        lines.append(f"tile busy        min {tb['min']:,.0f} / mean {tb['mean']:,.0f} / max "
                     f"{tb['max']:,.0f} cycles over {tb['tiles']} tiles (imbalance "
                     f"{tb['imbalance']:.2f}x)")
    return lines


def format_summary(summary: Mapping[str, Any]) -> str:
    """Human-readable summary, one fact per line (optional keys that are
    missing show their SUMMARY_DEFAULTS)."""
    s = {**SUMMARY_DEFAULTS, **summary}
    base = s["baseline_cycles"]
    errs = s.get("numerics_note") or "not computed"
    if s.get("rel_fro_error") is not None:
        tol = tolerance(s.get("fp8_noise"))
        within = s["rel_fro_error"] <= tol
        verdict = ("ok" if s["numerics_ok"] else f"OUTSIDE tolerance {tol:.3g}" if not within
                   else "FAILED: fp8 saturation")
        if s.get("fp8_noise") is not None:
            verdict += f"; fp8 reference vs fp32 {s['fp8_noise']:.3e}"
        errs = (f"rel. Frobenius {s['rel_fro_error']:.3e}, max abs {s['max_abs_error']:.4g} "
                f"({verdict})")
    if s.get("cosine_fp32_min") is not None:
        errs += (f"; cosine to fp32 min {s['cosine_fp32_min']:.5f} / mean "
                 f"{s['cosine_fp32_mean']:.5f}")
    if s.get("nonfinite"):
        errs = f"FAILED: non-finite value, first at {s['nonfinite']}"
    casts = dict(s.get("casts") or {})
    sat = {k: v for k, v in casts.items() if v.get("saturated", 0) > 0}
    if sat:
        worst = max(sat, key=lambda k: sat[k]["saturated"])
        errs += (f"; {len(sat)} fp8 tensor(s) saturate (worst {worst}: "
                 f"{100 * sat[worst]['saturated']:.3g}% of values)")
    secs = dict(s.get("stage_seconds", {}))
    names = sorted(secs, key=lambda k: (STAGES.index(k) if k in STAGES else 99, k))
    stages = ", ".join(f"{k} {secs[k]:.2f}" for k in names)
    lines = [
        f"model {s['model']} ({s['layers']} layer{'s' if s['layers'] != 1 else ''}, batch "
        f"{s['batch']}{'' if s['precision'] == 'fp8' else ', ' + s['precision']}) on "
        f"{s['device']}",
        f"cycles           {s['cycles']:,} ({s['time_ms']:.4f} ms); baseline "
        + (f"{base:,}" if isinstance(base, int) else "?"),
        f"fp8 roofline     {100 * s['roofline_fraction']:.2f}%",
        f"numerics         {errs}",
        f"faults           {s['faults']}",
        f"peak tile bytes  {s['peak_tile_bytes']:,}{_peak_detail(s['peak_tile'])}",
        f"program          {s['steps']} steps, {s['vertices']} vertices, {s['transfers']} "
        f"transfers, patches {s['arithmetic_patches']} arithmetic / {s['table_patches']} table",
        *_breakdown_lines(s),
        f"proposals        {s['proposals_evaluated']} evaluated, {s['proposals_accepted']} "
        f"accepted (baseline: {s['baseline_policy']}, optimizer: {s['optimizer']}"
        + (f", pinned by {s['constraints']}" if s.get("constraints") else "") + ")",
        f"planning         {s['plan_seconds']:.2f} s ({stages})",
        f"simulation       {s['simulate_seconds']:.2f} s",
        f"package          {s['package_hash']}",
    ]
    return "\n".join(lines)


def check_run_dir(out: str | os.PathLike[str]) -> Path:
    """ConfigError unless `out` can become a run directory: absent (its
    parent an existing writable directory), an empty directory, or a run
    directory already (which a new run replaces whole)."""
    return check_output_dir(out, "--out", SUMMARY_FILE, "run")


def save_run(out: str | os.PathLike[str], package: Package, summary: Mapping[str, Any],
             plan: str | None = None, sim: Any = None) -> Path:
    """Write package/, summary.json, tiles.npz (per-tile arrays,
    `planner.breakdown.tile_arrays` of `sim`, a timing-only run made here when
    None) and (given `plan`, the final plan in the constraints grammar)
    plan.toml as run directory `out`, whole or not at all: all are written
    into a directory beside `out`, which then takes its place (an old run
    directory is replaced only by a complete new one)."""
    from planner.breakdown import tile_arrays
    from simulator.run import run

    root = check_run_dir(out)
    tiles = tile_arrays(package, sim if sim is not None else run(package, numerics=False))
    check_summary(summary, str(root / SUMMARY_FILE))  # only what `report` can read back
    if root.is_dir() and not any(root.iterdir()):
        root.rmdir()  # an empty directory the user made for the run
    with atomic_dir(root, SUMMARY_FILE, "run") as tmp:
        save_package(package, tmp / PACKAGE_DIR)
        write_file_atomic(tmp / SUMMARY_FILE,
                          lambda f: json.dump(dict(summary), f, indent=1, sort_keys=True))
        savez: Any = np.savez  # its stubs type the keyword arrays as its own flags
        write_file_atomic(tmp / TILES_FILE, lambda f: savez(f, **tiles), mode="wb")
        if plan is not None:
            write_file_atomic(tmp / PLAN_FILE, lambda f: f.write(plan))
    return root


def load_summary(run: str | os.PathLike[str]) -> dict[str, Any]:
    """The summary saved in run directory `run` (or a summary.json path)."""
    path = Path(run)
    if path.is_dir():
        path = path / SUMMARY_FILE
    if not path.exists():
        raise ConfigError(str(path), "run", "no such run summary")
    check_regular_file(path, "run", MAX_SUMMARY_BYTES)  # a FIFO would block the read
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(str(path), "run", "no such run summary") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(str(path), "run", f"not a JSON summary: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "run", "not a JSON object", type(data).__name__)
    check_summary(data, str(path))
    return data


def check_summary(data: Mapping[str, Any], source: str) -> None:
    """ConfigError naming `source` and the first field (dotted path) where
    `data` does not match SUMMARY_SCHEMA."""
    import jsonschema

    missing = [k for k in SUMMARY_KEYS if k not in data]
    if missing:
        raise ConfigError(source, missing[0], "missing from the run summary")
    validator = jsonschema.Draft202012Validator(SUMMARY_SCHEMA)
    error = jsonschema.exceptions.best_match(validator.iter_errors(dict(data)))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "summary"
        raise ConfigError(source, where, error.message.replace(repr(error.instance), "value")
                          if len(repr(error.instance)) > 60 else error.message)
