"""Recorded hardware results, the runner protocol, and the simulator cross-check.

No accelerator exists on the development machine: this module defines what a
hardware run hands back and how it is compared with the simulator; it ships no
runner.  Results made in tests or experiments from simulations carry
`meta["synthetic"] = True` and every rendering says SYNTHETIC.

**Format** (version 1).  A result is a directory holding `hwresult.json` and
`arrays.npz`, written atomically (temporary directory + `os.replace`):

- `hwresult.json`: `version`, `package_hash` (the `Package.content_hash()` that
  was run), `device` (the device name the package was built for), `total_cycles`
  (int >= 0: device cycles of one execution of the program), `value_seed`
  (int or null: the params and inputs were `seeded_values(package, seed)`;
  null when the values are unknown, which disables the numerics comparison),
  `outputs` (list of `{name, shape}` of the arrays stored), `has_step_cycles`,
  `has_tile_cycles` (bools), `meta` (free JSON: date, runner, notes, ...).
- `arrays.npz`: `step_cycles` int64 [S] (cycles per package step summed over
  Repeat iterations, as `SimResult.cycles_per_step`; a profiler's per-step
  numbers need not sum to `total_cycles`, e.g. a trimmed span), `tile_cycles`
  int64 [tiles] (busy cycles per tile, as `SimResult.tile_busy`) and
  `out:<name>` float32 logical output arrays.

`load_hardware_result(path, package)` and `save_hardware_result(result, path,
package)` raise `HardwareResultInvalid` (a ConfigError: exit status 2) naming the
file and field for a wrong version, a missing or mistyped field, an unreadable
npz, or — when a package is given — a package hash, device name, step count,
tile count, output name or output shape that disagrees with the package.

**Runner protocol.**  A hardware runner is any object with a `name` and
`run(package, params, inputs) -> HardwareResult`: it loads the package (the
manifest's I/O blocks say where each input/parameter block goes; the program
arrays are the code), runs it once, and returns the measured cycles and the
output tensors read back through the same I/O map, with `package_hash =
package.content_hash()` and `device = package.device.name`.

**Cross-check.**  `crosscheck(package, sim, hw)` compares a simulation of the
same package with the result: total cycle ratio (hardware / simulated), the
steps with the largest absolute deviation (with the step's kind and a label
built from its contents), per-tile busy cycles, and per output max |hw - sim|
and relative Frobenius ‖hw - sim‖ / ‖sim‖.  `CrosscheckReport.text()` renders
one screen; `violations(...)` lists the tolerances a report breaks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kernels.abi import (
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_KIND_NAMES,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
)
from kernels.registry import KERNELS
from simulator.package import Package
from simulator.run import SimResult
from tilecommon.errors import HardwareResultInvalid
from tilecommon.files import atomic_dir, read_npz

VERSION = 1
RESULT_FILE = "hwresult.json"
ARRAYS_FILE = "arrays.npz"
MEMORY = "<hardware result>"  # source name of a result not read from a file
MAX_CYCLES = (1 << 63) - 1
_FIELDS = ("version", "package_hash", "device", "total_cycles", "value_seed", "outputs",
           "has_step_cycles", "has_tile_cycles", "meta")


@dataclass(frozen=True, eq=False)
class HardwareResult:
    """One hardware execution of a package (module docstring for the fields).

    Cycles are device cycles; `outputs` maps output name -> float32 array of
    the logical shape.  Construction checks types and raises
    HardwareResultInvalid naming the field (source `MEMORY`)."""

    package_hash: str
    device: str
    total_cycles: int
    step_cycles: np.ndarray | None = None
    tile_cycles: np.ndarray | None = None
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    value_seed: int | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    version: int = VERSION

    def __post_init__(self) -> None:
        _check_fields(self, MEMORY)

    @property
    def synthetic(self) -> bool:
        """True when the result was made from a simulation, not measured."""
        return bool(self.meta.get("synthetic", False))


class Runner(Protocol):
    """What a hardware runner implements (module docstring)."""

    name: str

    def run(self, package: Package, params: Mapping[str, np.ndarray],
            inputs: Mapping[str, np.ndarray]) -> HardwareResult: ...


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_fields(r: HardwareResult, src: str) -> None:
    if r.version != VERSION:
        raise HardwareResultInvalid(src, "version", f"expected {VERSION}", r.version)
    if not isinstance(r.package_hash, str) or len(r.package_hash) != 64:
        raise HardwareResultInvalid(src, "package_hash", "must be a sha256 hex string",
                                    r.package_hash)
    if not isinstance(r.device, str) or not r.device:
        raise HardwareResultInvalid(src, "device", "must be a non-empty string", r.device)
    if not _is_int(r.total_cycles) or not 0 <= r.total_cycles <= MAX_CYCLES:
        raise HardwareResultInvalid(src, "total_cycles", f"must be an int in [0, {MAX_CYCLES}] "
                                    "(int64 cycles)", r.total_cycles)
    if r.value_seed is not None and (not _is_int(r.value_seed) or r.value_seed < 0):
        raise HardwareResultInvalid(src, "value_seed", "must be an int >= 0 or null",
                                    r.value_seed)
    for name in ("step_cycles", "tile_cycles"):
        a = getattr(r, name)
        if a is None:
            continue
        if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != np.int64:
            raise HardwareResultInvalid(src, name, "must be a 1-D int64 array",
                                        getattr(a, "dtype", type(a).__name__))
        if a.size and int(a.min()) < 0:
            raise HardwareResultInvalid(src, name, "cycles must be >= 0", int(a.min()))
    for name, out in r.outputs.items():
        if not isinstance(out, np.ndarray) or out.dtype != np.float32:
            raise HardwareResultInvalid(src, f"outputs.{name}", "must be a float32 array",
                                        getattr(out, "dtype", type(out).__name__))
    try:
        json.dumps(dict(r.meta), sort_keys=True)
    except (TypeError, ValueError) as e:
        raise HardwareResultInvalid(src, "meta", f"not JSON-serialisable: {e}") from None


def check_against(r: HardwareResult, package: Package, source: str = MEMORY) -> None:
    """Raise HardwareResultInvalid (naming `source` and the field) unless `r`
    was recorded from `package`: same content hash and device name, step_cycles
    of length S, tile_cycles of length tiles, outputs that are package outputs
    of the package's shape."""
    if r.package_hash != package.content_hash():
        raise HardwareResultInvalid(source, "package_hash",
                                    f"package {package.name!r} has hash "
                                    f"{package.content_hash()}", r.package_hash)
    if r.device != package.device.name:
        raise HardwareResultInvalid(source, "device",
                                    f"package is for {package.device.name!r}", r.device)
    if r.step_cycles is not None and r.step_cycles.shape[0] != package.n_steps:
        raise HardwareResultInvalid(source, "step_cycles",
                                    f"package has {package.n_steps} steps",
                                    int(r.step_cycles.shape[0]))
    if r.tile_cycles is not None and r.tile_cycles.shape[0] != package.tiles:
        raise HardwareResultInvalid(source, "tile_cycles", f"device has {package.tiles} tiles",
                                    int(r.tile_cycles.shape[0]))
    shapes = {t.name: t.shape for t in package.io if t.role == "output"}
    for name in sorted(r.outputs):
        if name not in shapes:
            raise HardwareResultInvalid(source, f"outputs.{name}",
                                        f"not a package output; outputs are {sorted(shapes)}")
        if tuple(r.outputs[name].shape) != shapes[name]:
            raise HardwareResultInvalid(source, f"outputs.{name}",
                                        f"package shape is {list(shapes[name])}",
                                        list(r.outputs[name].shape))


# ---- files ---------------------------------------------------------------------


def save_hardware_result(r: HardwareResult, path: str | os.PathLike[str],
                         package: Package | None = None) -> Path:
    """Write `r` as directory `path` (hwresult.json + arrays.npz), atomically;
    checked against `package` first when given.  An existing result directory
    at `path` is replaced; any other existing path is refused."""
    target = Path(path)
    if package is not None:
        check_against(r, package, str(target))
    with atomic_dir(target, RESULT_FILE, "hardware result") as tmp:
        doc = {
            "version": r.version, "package_hash": r.package_hash, "device": r.device,
            "total_cycles": int(r.total_cycles),
            "value_seed": None if r.value_seed is None else int(r.value_seed),
            "outputs": [{"name": n, "shape": list(r.outputs[n].shape)}
                        for n in sorted(r.outputs)],
            "has_step_cycles": r.step_cycles is not None,
            "has_tile_cycles": r.tile_cycles is not None, "meta": dict(r.meta),
        }
        (tmp / RESULT_FILE).write_text(json.dumps(doc, sort_keys=True, indent=1))
        arrays: dict[str, np.ndarray] = {f"out:{n}": r.outputs[n] for n in sorted(r.outputs)}
        if r.step_cycles is not None:
            arrays["step_cycles"] = r.step_cycles
        if r.tile_cycles is not None:
            arrays["tile_cycles"] = r.tile_cycles
        with open(tmp / ARRAYS_FILE, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
    return target


def load_hardware_result(path: str | os.PathLike[str],
                         package: Package | None = None) -> HardwareResult:
    """Read a result directory written by `save_hardware_result` (module
    docstring); checked against `package` when given."""
    root = Path(path)
    jpath, apath = root / RESULT_FILE, root / ARRAYS_FILE
    for p in (jpath, apath):
        if not p.is_file():
            raise HardwareResultInvalid(str(p), "file", "missing")
    try:
        doc = json.loads(jpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HardwareResultInvalid(str(jpath), "json", f"not valid JSON: {e}") from None
    src = str(jpath)
    if not isinstance(doc, dict):
        raise HardwareResultInvalid(src, "json", "must hold a JSON object")
    if doc.get("version") != VERSION:
        raise HardwareResultInvalid(src, "version", f"expected {VERSION}", doc.get("version"))
    for key in _FIELDS:
        if key not in doc:
            raise HardwareResultInvalid(src, key, "missing")
    for key in sorted(doc):
        if key not in _FIELDS:
            raise HardwareResultInvalid(src, key, f"unknown field; expected {list(_FIELDS)}")
    if not isinstance(doc["meta"], dict):
        raise HardwareResultInvalid(src, "meta", "must be an object", doc["meta"])
    if not isinstance(doc["outputs"], list):
        raise HardwareResultInvalid(src, "outputs", "must be a list", doc["outputs"])
    arrays = read_npz(apath, lambda why: HardwareResultInvalid(
        str(apath), "npz", f"unreadable or truncated: {why}"))
    wanted = {f"out:{o['name']}" if isinstance(o, dict) and "name" in o else "" for o in
              doc["outputs"]}
    if "" in wanted:
        raise HardwareResultInvalid(src, "outputs", "entries must be {name, shape} objects")
    for key, flag in (("step_cycles", "has_step_cycles"), ("tile_cycles", "has_tile_cycles")):
        if not isinstance(doc[flag], bool):
            raise HardwareResultInvalid(src, flag, "must be true or false", doc[flag])
        if doc[flag]:
            wanted.add(key)
    if set(arrays) != wanted:
        raise HardwareResultInvalid(str(apath), "arrays",
                                    f"expected {sorted(wanted)}, found {sorted(arrays)}")
    outputs: dict[str, np.ndarray] = {}
    for o in doc["outputs"]:
        a = arrays[f"out:{o['name']}"]
        if list(a.shape) != o.get("shape"):
            raise HardwareResultInvalid(str(apath), f"outputs.{o['name']}",
                                        f"array shape {list(a.shape)} differs from the "
                                        f"recorded shape", o.get("shape"))
        outputs[o["name"]] = a
    try:
        r = HardwareResult(
            package_hash=doc["package_hash"], device=doc["device"],
            total_cycles=doc["total_cycles"], step_cycles=arrays.get("step_cycles"),
            tile_cycles=arrays.get("tile_cycles"), outputs=outputs,
            value_seed=doc["value_seed"], meta=doc["meta"], version=doc["version"])
    except HardwareResultInvalid as e:
        raise HardwareResultInvalid(src, e.field, e.message, e.value) from None
    if package is not None:
        check_against(r, package, src)
    return r


def seeded_values(package: Package, seed: int) -> tuple[dict[str, np.ndarray],
                                                        dict[str, np.ndarray]]:
    """(params, inputs): standard-normal float32 values × 2**scale_exp per io
    tensor, drawn in manifest order from `numpy.random.default_rng(seed)` —
    what `tileplan simulate --seed` feeds and what `value_seed` refers to."""
    values: dict[str, dict[str, np.ndarray]] = {"parameter": {}, "input": {}}
    rng = np.random.default_rng(seed)
    for t in package.io:
        if t.role in values:
            scale = np.float32(2.0 ** t.scale_exp)
            values[t.role][t.name] = rng.standard_normal(t.shape).astype(np.float32) * scale
    return values["parameter"], values["input"]


# ---- cross-check -------------------------------------------------------------------


def step_loops(package: Package) -> np.ndarray:
    """int64 [S]: the REPEAT_BEGIN step of the innermost loop holding each step
    (-1 outside loops; a BEGIN/END pair belongs to the loop around it)."""
    kind, match = package["step_kind"], package["step_match"]
    out = np.full(package.n_steps, -1, dtype=np.int64)
    stack: list[int] = []
    for s in range(package.n_steps):
        k = int(kind[s])
        if k == STEP_REPEAT_BEGIN:
            out[s] = stack[-1] if stack else -1
            stack.append(s)
            continue
        if k == STEP_REPEAT_END and stack and int(match[s]) == stack[-1]:
            stack.pop()
        out[s] = stack[-1] if stack else -1
    return out


def step_label(package: Package, s: int) -> str:
    """A label of step s from its contents: kind, then the kernels and tiles of
    a COMPUTE step or the transfers and bytes of an EXCHANGE step."""
    a = package.arrays
    kind = int(a["step_kind"][s])
    name = STEP_KIND_NAMES[kind]
    if kind == STEP_COMPUTE:
        i0, i1 = int(a["step_vtx"][s]), int(a["step_vtx"][s + 1])
        ids, counts = np.unique(a["v_kernel"][i0:i1], return_counts=True)
        ks = ", ".join(f"{int(c)}x{KERNELS[int(k)].name if int(k) in KERNELS else k}"
                       for k, c in zip(ids.tolist(), counts.tolist(), strict=True))
        return f"{name} {ks} on {np.unique(a['v_tile'][i0:i1]).size} tiles"
    if kind == STEP_EXCHANGE:
        i0, i1 = int(a["step_xfer"][s]), int(a["step_xfer"][s + 1])
        return f"{name} {i1 - i0} transfers, {int(a['x_bytes'][i0:i1].sum())} bytes"
    if kind == STEP_REPEAT_BEGIN:
        return f"{name} x{int(a['step_trips'][s])}"
    return f"{name} (loop overhead)"


def step_ops(package: Package, s: int) -> str:
    """The graph ops step s serves and their roles, from the package's
    provenance ("encoder/mm_q compute", "encoder/mm_q input + encoder/mm_k
    input"), or "step s" without provenance (a hand-built package)."""
    if not package.provenance:
        return f"step {s}"
    parts = list(dict.fromkeys(f"{op} {role}" for op, _, role in package.provenance[s]))
    return " + ".join(parts[:3]) + (f" (+{len(parts) - 3})" if len(parts) > 3 else "")


@dataclass(frozen=True)
class StepRow:
    step: int
    label: str  # step_label: what the step holds
    loop: int  # REPEAT_BEGIN step of the innermost enclosing loop, -1 outside
    sim_cycles: int
    hw_cycles: int
    ops: str = ""  # step_ops: the graph ops it serves

    @property
    def diff(self) -> int:
        return self.hw_cycles - self.sim_cycles


@dataclass(frozen=True)
class OutputRow:
    name: str
    max_abs: float  # max |hw - sim|; nan when a value is not finite
    rel_fro: float  # ‖hw - sim‖ / ‖sim‖ (float64)
    nonfinite: int  # elements that are NaN/inf in either array


@dataclass(frozen=True)
class CrosscheckReport:
    """Simulation vs hardware result of one package (module docstring)."""

    package: str
    package_hash: str
    device: str
    clock_hz: float
    synthetic: bool
    sim_cycles: int
    hw_cycles: int
    steps: tuple[StepRow, ...]  # largest |diff| first (at most `top`); () without step data
    steps_compared: int  # steps with hardware numbers (0 without step data)
    hw_step_sum: int  # sum of the hardware step cycles (0 without step data)
    step_max_rel: float  # max |diff| / max(sim, 1) over all steps (0 without step data)
    tile_max_rel: float | None  # same over tiles' busy cycles; None without tile data
    outputs: tuple[OutputRow, ...]
    meta: tuple[tuple[str, str], ...]

    @property
    def cycle_ratio(self) -> float:
        """hardware / simulated total cycles."""
        return self.hw_cycles / self.sim_cycles if self.sim_cycles else float("inf")

    def violations(self, cycle_tolerance: float | None = None,
                   rel_fro_tolerance: float | None = None,
                   max_abs_tolerance: float | None = None) -> list[str]:
        """One message per broken tolerance: |ratio - 1| > cycle_tolerance,
        an output's rel_fro or max_abs above its tolerance (or not finite);
        non-finite output values are a mismatch under any tolerance."""
        bad = [f"output {o.name}: {o.nonfinite} non-finite value(s)" for o in self.outputs
               if o.nonfinite]
        if cycle_tolerance is not None and abs(self.cycle_ratio - 1.0) > cycle_tolerance:
            bad.append(f"cycle ratio {self.cycle_ratio:.4f} outside 1 ± {cycle_tolerance:g}")
        for o in self.outputs:
            if rel_fro_tolerance is not None and not o.rel_fro <= rel_fro_tolerance:
                bad.append(f"output {o.name}: rel. Frobenius {o.rel_fro:.3g} > "
                           f"{rel_fro_tolerance:g}")
            if max_abs_tolerance is not None and not o.max_abs <= max_abs_tolerance:
                bad.append(f"output {o.name}: max abs {o.max_abs:.3g} > {max_abs_tolerance:g}")
        return bad

    def text(self) -> str:
        """One screen: totals, the largest step deviations, tiles, outputs."""
        ms = 1e3 / self.clock_hz
        kind = "SYNTHETIC result (made from a simulation, not measured)" if self.synthetic \
            else "hardware result"
        lines = [f"crosscheck {self.package} ({self.package_hash[:12]}) on {self.device}: {kind}"]
        lines += [f"  {k}: {v}" for k, v in self.meta]
        lines.append(f"cycles  sim {self.sim_cycles} ({self.sim_cycles * ms:.4f} ms)  "
                     f"hw {self.hw_cycles} ({self.hw_cycles * ms:.4f} ms)  "
                     f"hw/sim {self.cycle_ratio:.4f}")
        if self.steps_compared:
            lines.append(f"steps   {self.steps_compared} compared, hw step sum "
                         f"{self.hw_step_sum}, max |hw-sim|/sim {self.step_max_rel:.3g}; "
                         f"largest deviations:")
            lines.append(f"  {'step':>5} {'sim':>10} {'hw':>10} {'hw-sim':>9}  ops: contents")
            for r in self.steps:
                loop = f" [loop@{r.loop}]" if r.loop >= 0 else ""
                lines.append(f"  {r.step:>5} {r.sim_cycles:>10} {r.hw_cycles:>10} "
                             f"{r.diff:>+9}  {r.ops}: {r.label}{loop}")
        else:
            lines.append("steps   no per-step hardware cycles")
        if self.tile_max_rel is not None:
            lines.append(f"tiles   max |hw-sim|/sim busy cycles {self.tile_max_rel:.3g}")
        for o in self.outputs:
            lines.append(f"output  {o.name}: max abs {o.max_abs:.6g}  rel. Frobenius "
                         f"{o.rel_fro:.4g}  non-finite {o.nonfinite}")
        if not self.outputs:
            lines.append("output  none compared")
        return "\n".join(lines)


def _max_rel(sim: np.ndarray, hw: np.ndarray) -> float:
    if not sim.size:
        return 0.0
    d = np.abs(hw.astype(np.float64) - sim) / np.maximum(sim.astype(np.float64), 1.0)
    return float(d.max())


def compare_output(name: str, sim: np.ndarray, hw: np.ndarray) -> OutputRow:
    """max |hw - sim|, ‖hw - sim‖/‖sim‖ and non-finite count of one output."""
    s, h = sim.astype(np.float64), hw.astype(np.float64)
    bad = int((~np.isfinite(s) | ~np.isfinite(h)).sum())
    with np.errstate(all="ignore"):  # inf - inf is reported as a count, not a warning
        d = h - s
        den = float(np.sqrt(np.sum(s * s)))
        num = float(np.sqrt(np.sum(d * d)))
        max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    return OutputRow(name, max_abs, num / den if den > 0 else num, bad)


def crosscheck(package: Package, sim: SimResult, hw: HardwareResult,
               top: int = 8) -> CrosscheckReport:
    """Compare simulation `sim` of `package` with hardware result `hw` (checked
    against the package first: HardwareResultInvalid).  Outputs are compared
    when both sides have them; `top` bounds the listed step deviations."""
    check_against(hw, package)
    sc = sim.cycles_per_step
    rows: tuple[StepRow, ...] = ()
    compared = hw_sum = 0
    step_rel = 0.0
    if hw.step_cycles is not None:
        loops = step_loops(package)
        d = np.abs(hw.step_cycles - sc)
        order = np.lexsort((np.arange(d.size), -d))[:top]  # largest first, then by step
        rows = tuple(StepRow(int(s), step_label(package, int(s)), int(loops[s]), int(sc[s]),
                             int(hw.step_cycles[s]), step_ops(package, int(s)))
                     for s in order.tolist())
        compared, hw_sum = int(d.size), int(hw.step_cycles.sum())
        step_rel = _max_rel(sc, hw.step_cycles)
    tile_rel = None if hw.tile_cycles is None else _max_rel(sim.tile_busy, hw.tile_cycles)
    outs = tuple(compare_output(n, sim.outputs[n], hw.outputs[n])
                 for n in sorted(hw.outputs) if n in sim.outputs)
    meta = tuple((str(k), str(hw.meta[k])) for k in sorted(hw.meta) if k != "synthetic")
    return CrosscheckReport(package.name, package.content_hash(), package.device.name,
                            package.device.clock_hz, hw.synthetic, sim.cycles,
                            int(hw.total_cycles), rows, compared, hw_sum, step_rel, tile_rel,
                            outs, meta)
