"""Fitting a device's cost constants to published kernel measurements.

`calibrate(entries, device)` starts from `device` (default the `c600` preset)
and returns a `Calibration`: the fitted device, one row per measurement
(modelled cycles before and after, error), the skipped entries with reasons
(simulator.measurements), and where every changed constant came from.

Two kinds of constants:

- **Fitted**: each kernel family's free constants (`FREE`) are fitted by
  weighted least squares to that family's measurements, on relative errors,
  with a weak pull (`PRIOR_WEIGHT`) toward the starting device so that a
  direction the measurements do not determine keeps its starting value.  The
  cycle models are linear in their constants for a fixed path, so each round
  solves the linear problem whose columns are the exact unit responses of the
  jitted models; the result is rounded to integers and polished by an integer
  coordinate search on the true models.  A discrete constant (`DISCRETE`,
  e.g. the AMP's minimum rows) is chosen by trying each candidate.
- **Facts**: exchange, loop and footprint constants read from the dataset's
  fact entries by id (`FACTS`: the IPU21 target costs, the exchange-table
  encoding, the runtime state size, the linked executable size).

Held-out measurements: in every family with at least `HOLDOUT_MIN` usable
measurements, every `HOLDOUT_EVERY`-th by a hash of its id is not fitted and is
reported separately, to show how the formulas generalise.  A fitted
measurement more than `OUTLIER` off after the fit is dropped, reported, and
the family refitted (an earlier kernel version the file does not mark).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernels import dispatch
from kernels.registry import by_name
from kernels.tile import DESC_FIELDS, KERNEL_COSTS
from simulator.cost import call_args
from simulator.device import COST_DOCS, COST_FIELDS, KERNEL_NAMES, Costs, Device
from simulator.measurements import Entry, Measurement, Skipped, by_id, select
from tilecommon.files import write_file_atomic, write_text_atomic

FREE: dict[str, tuple[str, ...]] = {
    "MATMUL": ("mm_call", "mm_panel", "mm_row"),
    "REDUCE": ("reduce_call", "reduce_chunk", "reduce_partial"),
    "ADD": ("add_call", "add_slots", "add_row_slots"),
    "GELU": ("gelu_call", "gelu_block", "gelu_tail_block", "gelu_pair", "gelu_tail_setup"),
    "LAYERNORM": ("ln_call", "ln_row", "ln_chunk"),
    "SOFTMAX": ("softmax_row", "softmax_panel", "softmax_split_panel", "softmax_split_row"),
    "CAST": ("cast_call", "cast_slots", "cast_row"),
    "COPY": (),
}
DISCRETE: dict[str, tuple[str, tuple[int, ...]]] = {
    "MATMUL": ("mm_min_rows", tuple(range(1, 65))),
}
# where the values of constants no measurement determines come from: the
# published formulas (dataset fit entries) whose structure the models follow,
# or why a value was chosen (noted in a written device TOML)
KEPT_SOURCES: dict[str, str] = {
    "vector_bytes": "target-memcpy-bw: standard loads 8 bytes/cycle",
    "mm_k_grain_fp8": "fit-gemm-fp8: ceil(K/32) panels",
    "mm_k_grain_fp16": "fit-gemm-f16-interleaved: ceil(K/16) panels",
    "mm_n_grain": "fit-gemm-f16-interleaved: ceil(C/16) panels",
    "reduce_grain": "fit-reduce-add: ceil(elements/48) over 6 workers",
    "add_row": "fit-add-f16: (rows-1)*234",
    "gelu_block_elems": "fit-gelu-kernelcost-v2: ceil(n/96) over 6 workers",
    "gelu_row": "fit-biasgelu-primitive: +40 per row",
    "ln_stats": "fit-layernorm: ceil(w/48)*18",
    "softmax_call": "fit-softmax-whole: launch 216",
    "softmax_panel_keys": "fit-softmax-whole: 16-key panels",
    "softmax_split_call": "fit-softmax-whole: split 408",
    "softmax_split_rows": "fit-softmax-whole: ceil(rows/2)",
    "softmax_split_round": "fit-softmax-whole: ceil(rows/6)*126",
    "cast_grain": "cast-linear-8320-pipelined: the two-bundle loop, 96 elements a round",
    "cast_row": "fit-biasgelu-primitive: +40 per row, as the other row loops",
    "copy_row": "copy-strided-u64-longest: 2 bundles per word, a row setup of 2 slots",
    "transpose_call": "fit-transposed-unpack: 300",
    "transpose_rows": "fit-transposed-unpack: ceil(rows/12)",
    "transpose_group": "fit-transposed-unpack: 100 per row group",
    "transpose_pair": "fit-transposed-unpack: 90 per column pair",
    "loop_overhead_cycles": "not measured: the first model's value",
    "tiles_per_row": "no published tile-to-row map: an assumption (92 rows of 16 tiles), "
                     "which multicast-arrival-latency's +2 per row is applied to",
    "step_code_bytes": "a sync and a branch per compute step",
    "loop_code_bytes": "loop counter setup, branch and patch-helper call per Repeat",
}
# the families whose errors the calibration's quality bound is stated for
CHECKED = ("MATMUL", "REDUCE", "GELU", "LAYERNORM", "ADD", "SOFTMAX")
PRIOR_WEIGHT = 1e-6
HOLDOUT_MIN = 5
HOLDOUT_EVERY = 4
OUTLIER = 0.15
_LIMITS = {f: (lo, hi) for f, lo, hi, _ in KERNEL_COSTS}
_INDEX = {f: DESC_FIELDS.index(f) for f, *_ in KERNEL_COSTS}


@dataclass(frozen=True)
class Row:
    """One measurement against the model: `role` is "fit" or "holdout"."""

    m: Measurement
    role: str
    before: int
    after: int

    @property
    def error(self) -> float:
        """(modelled - measured) / measured after the fit."""
        return (self.after - self.m.cycles) / self.m.cycles

    @property
    def error_before(self) -> float:
        return (self.before - self.m.cycles) / self.m.cycles


@dataclass(frozen=True)
class Change:
    """A constant's value before and after, and why: "fitted (n measurements)",
    "fact: <entry id>", ..."""

    name: str
    before: int
    after: int
    how: str


@dataclass
class Calibration:
    device: Device
    rows: list[Row]
    skipped: list[Skipped]
    changes: list[Change]
    facts: dict[str, str] = field(default_factory=dict)  # constant -> entry ids
    # family -> (measurements fitted, constants free): fewer points than constants
    # leave the constants unidentified (the fit moves them only as far as the
    # points ask; the rest of their values is the start device's)
    unidentified: dict[str, tuple[int, int]] = field(default_factory=dict)

    def family_errors(self, role: str = "fit") -> dict[str, tuple[int, float, float]]:
        """family -> (count, median |error|, max |error|) of the rows in `role`."""
        out: dict[str, tuple[int, float, float]] = {}
        for fam in sorted({r.m.family for r in self.rows}):
            errs = [abs(r.error) for r in self.rows if r.m.family == fam and r.role == role]
            if errs:
                out[fam] = (len(errs), statistics.median(errs), max(errs))
        return out

    def checked_errors(self, role: str = "fit") -> tuple[int, float, float]:
        """(count, median, max) |error| over the CHECKED families."""
        errs = [abs(r.error) for r in self.rows if r.m.family in CHECKED and r.role == role]
        return (len(errs), statistics.median(errs) if errs else 0.0, max(errs, default=0.0))


class _Model:
    """The measurements of one family as argument vectors, evaluated under a
    descriptor with some constants replaced."""

    def __init__(self, ms: list[Measurement], device: Device) -> None:
        self.ms = ms
        self.kid = [by_name(m.kernel).id for m in ms]
        self.args = [call_args(device, m.kernel, **dict(m.args)) for m in ms]
        self.meas = np.array([m.cycles for m in ms], dtype=np.float64)
        self.desc = device.tile_desc().as_array()

    def cycles(self, values: dict[str, int]) -> np.ndarray:
        d = self.desc.copy()
        for f, v in values.items():
            d[_INDEX[f]] = v
        return np.array([dispatch.vertex_cycles(k, a, d) for k, a in zip(self.kid, self.args,
                                                                          strict=True)],
                        dtype=np.float64)


def _objective(model: _Model, theta: dict[str, int], start: dict[str, int]) -> float:
    r = (model.cycles(theta) - model.meas) / model.meas
    prior = sum(((theta[f] - start[f]) / max(abs(start[f]), 1)) ** 2 for f in theta)
    return float(r @ r + PRIOR_WEIGHT * prior)


def _clip(f: str, v: float) -> int:
    lo, hi = _LIMITS[f]
    return int(min(max(round(v), lo), hi))


def _fit_free(model: _Model, theta: dict[str, int], start: dict[str, int],
              free: tuple[str, ...]) -> dict[str, int]:
    """Least squares on the `free` constants from `theta` (module docstring)."""
    theta = dict(theta)
    if not free:
        return theta
    best = _objective(model, theta, start)
    for _ in range(4):  # re-linearise: a path may flip
        base = model.cycles(theta)
        cols = []
        for f in free:
            bumped = dict(theta)
            bumped[f] = theta[f] + 1
            cols.append(model.cycles(bumped) - base)
        a = np.array(cols).T / model.meas[:, None]
        b = (model.meas - base) / model.meas
        scale = np.array([max(abs(start[f]), 1) for f in free], dtype=np.float64)
        prior_a = np.diag(math.sqrt(PRIOR_WEIGHT) / scale)
        prior_b = np.array([(start[f] - theta[f]) for f in free]) * math.sqrt(PRIOR_WEIGHT) / scale
        delta, *_ = np.linalg.lstsq(np.vstack([a, prior_a]), np.concatenate([b, prior_b]),
                                    rcond=None)
        trial = dict(theta)
        for f, d in zip(free, delta, strict=True):
            trial[f] = _clip(f, theta[f] + d)
        obj = _objective(model, trial, start)
        if obj >= best - 1e-15:
            break
        theta, best = trial, obj
    return _polish(model, theta, start, free, best)


def _polish(model: _Model, theta: dict[str, int], start: dict[str, int], free: tuple[str, ...],
            best: float) -> dict[str, int]:
    """Integer coordinate search: steps of 1, 2, 4, ... up and down."""
    theta = dict(theta)
    for _ in range(200):
        improved = False
        for f in free:
            step = 1
            while step <= max(abs(theta[f]), 1):
                for sign in (1, -1):
                    trial = dict(theta)
                    trial[f] = _clip(f, theta[f] + sign * step)
                    if trial[f] == theta[f]:
                        continue
                    obj = _objective(model, trial, start)
                    if obj < best - 1e-15:
                        theta, best, improved = trial, obj, True
                step *= 2
        if not improved:
            break
    return theta


def _fit_family(fam: str, ms: list[Measurement], device: Device,
                start: dict[str, int]) -> dict[str, int]:
    model = _Model(ms, device)
    free = tuple(f for f in FREE.get(fam, ()) if f in start)
    theta = {f: start[f] for f in free}
    disc = DISCRETE.get(fam)
    if disc is None:
        return _fit_free(model, theta, start, free)
    name, choices = disc
    best: tuple[float, int, dict[str, int]] | None = None
    for c in choices:
        trial = {**theta, name: c}
        fitted = _fit_free(model, trial, {**start, name: c}, free)
        # the discrete choice is judged on the data; a tie keeps the start's value
        r = (model.cycles(fitted) - model.meas) / model.meas
        key = (round(float(r @ r), 12), abs(c - start[name]), fitted)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None
    return best[2]


def _holdout(ms: list[Measurement]) -> set[str]:
    if len(ms) < HOLDOUT_MIN:
        return set()
    ranked = sorted(ms, key=lambda m: hashlib.sha256(m.id.encode()).hexdigest())
    return {m.id for i, m in enumerate(ranked) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1}


# ------------------------------------------------------------------ facts

def _fact_controls(e: Entry) -> dict[str, int]:
    w = e.get("what", "")
    send = re.search(r"send control (\d+)", w)
    recv = re.search(r"receive control (\d+)", w)
    ptr = re.search(r"receive pointer (\d+)", w)
    out = {}
    if send:
        out["send_cycles"] = int(send.group(1))
    if recv:
        out["receive_cycles"] = int(recv.group(1)) + (int(ptr.group(1)) if ptr else 0)
    return out


def _fact_footprint(e: Entry) -> dict[str, int]:
    w = e.get("what", "")
    pats = {
        "xt_send_bytes": r"(\d+) B per send",
        "xt_send_long_bytes": r"per send \(\+(\d+)",
        "xt_long_bytes": r"payload > (\d+) words",
        "xt_receive_bytes": r"(\d+) B per receive",
        "xt_jump_bytes": r"\+(\d+) B when receive address discontinuous",
        "xt_phase_bytes": r"(\d+) B per tile/phase",
    }
    out = {}
    for k, pat in pats.items():
        found = re.search(pat, w)
        if found:
            out[k] = int(found.group(1)) * (4 if k == "xt_long_bytes" else 1)
    return out


def _fact_latency(e: Entry) -> dict[str, int]:
    """52 events to a receiver, "+2 events per physical row" (the note)."""
    out = _value("arrival_latency_cycles")(e)
    found = re.search(r"\+(\d+) events per physical row", str(e.get("note", "")))
    if found:
        out["arrival_latency_row_cycles"] = int(found.group(1))
    return out


def _value(key: str, words: int = 1) -> Callable[[Entry], dict[str, int]]:
    def read(e: Entry) -> dict[str, int]:
        v = e.get("cycles") if e.get("cycles") is not None else e.get("value")
        return {key: int(v) * words} if isinstance(v, (int, float)) else {}
    return read


def _values(*keys: str) -> Callable[[Entry], dict[str, int]]:
    def read(e: Entry) -> dict[str, int]:
        v = e.get("value")
        return {k: int(v) for k in keys} if isinstance(v, (int, float)) else {}
    return read


# entry id -> reader of the constants it states
FACTS: dict[str, Callable[[Entry], dict[str, int]]] = {
    "target-global-sync": _value("sync_cycles"),
    "target-exchange-bw": _values("exchange_in_bytes_per_cycle", "exchange_out_bytes_per_cycle"),
    "target-exchange-controls": _fact_controls,
    "send-max-words": _value("send_max_bytes", 4),
    "multicast-arrival-latency": _fact_latency,
    "fit-repeat-patch-per-word": _value("patch_word_cycles"),
    "target-local-copy-call": _value("copy_call"),
    "target-memcpy-bw": _value("copy_bytes_per_cycle"),
    "fit-footprint-model": _fact_footprint,
    "runtime-state-bytes": _value("support_bytes"),
}
# the exchange's cost beyond the scheduled transfers: median of these residuals
SETUP_FACTS = ("fit-sched-vs-measured-237", "fit-schedule-vs-measured-overhead",
               "exchange-residual-over-schedule")
EXEC_FACT, GEMM_CODE_FACT = "linked-exec-bytes-tile0", "gemm-code-bytes"
# the kernels of the published program whose linked executable EXEC_FACT
# measures (a SigLIP tower: the runtime is that executable minus their images;
# kernels added since, such as RMSNORM and ROPE, were not in it)
EXEC_KERNELS = ("MATMUL", "BATCH_MATMUL", "REDUCE", "ADD", "BIAS_ADD", "LAYERNORM", "GELU",
                "SOFTMAX", "CAST", "COPY", "TRANSPOSE")
# the generated program of a 27-layer siglip-so400m build, per tile (descriptors
# included), and the structure of tileplan's build of the same model that it is
# spread over: the median tile of the default 27-layer baseline on c600 makes
# PROGRAM_CALLS vertex calls in PROGRAM_STEPS compute steps of one Repeat body
# (experiments/fit_c600.py prints both beside the footprint)
PROGRAM_FACT = "generated-program-bytes-27l"
PROGRAM_CALLS, PROGRAM_STEPS = 27, 26


def _facts(entries: dict[str, Entry], costs: Costs, alignment: int,
           ) -> tuple[dict[str, int], dict[str, str], tuple[int, ...]]:
    """(constant -> value, constant -> source ids, kernel image bytes)."""
    values: dict[str, int] = {}
    source: dict[str, str] = {}
    for ident, read in FACTS.items():
        if ident in entries:
            for k, v in read(entries[ident]).items():
                values[k], source[k] = v, ident
    setup = [entries[i].get("cycles") for i in SETUP_FACTS if i in entries
             and isinstance(entries[i].get("cycles"), int)]
    if setup:
        values["exchange_setup_cycles"] = int(statistics.median(setup))
        source["exchange_setup_cycles"] = "median of " + ", ".join(
            i for i in SETUP_FACTS if i in entries)
    conflict = _conflict_fact(entries)
    if conflict is not None:
        values["conflict_percent"], source["conflict_percent"] = conflict
    program = entries[PROGRAM_FACT].get("value") if PROGRAM_FACT in entries else None
    if isinstance(program, int):
        rest = program - PROGRAM_STEPS * costs.step_code_bytes - costs.loop_code_bytes
        values["vertex_code_bytes"] = max(0, rest // PROGRAM_CALLS // 4 * 4)
        source["vertex_code_bytes"] = (f"{PROGRAM_FACT} over the {PROGRAM_CALLS} vertex calls "
                                       f"per tile of the same model's baseline")
    images = costs.images
    if EXEC_FACT in entries and GEMM_CODE_FACT in entries:
        total = entries[EXEC_FACT].get("value")
        gemm = sum(int(x.replace(",", "")) for x in re.findall(
            r"([\d,]+) bytes of", entries[GEMM_CODE_FACT].get("what", "")))
        mm = KERNEL_NAMES.index("MATMUL"), KERNEL_NAMES.index("BATCH_MATMUL")
        if isinstance(total, int) and gemm > 0 and images[mm[0]] + images[mm[1]] > 0:
            s = gemm / (images[mm[0]] + images[mm[1]])
            images = tuple(int(round(b * s / alignment)) * alignment for b in images)
            linked = sum(images[KERNEL_NAMES.index(k)] for k in EXEC_KERNELS)
            values["runtime_bytes"] = max(0, (total - linked) // alignment * alignment)
            source["runtime_bytes"] = f"{EXEC_FACT} minus the kernel images"
            source["kernel_image_bytes"] = (f"first-model image sizes scaled so the GEMM pair "
                                            f"holds the {gemm} bytes of {GEMM_CODE_FACT}")
    return values, source, images


def _conflict_fact(entries: dict[str, Entry]) -> tuple[int, str] | None:
    """Slowdown of the same GEMM with standard instead of interleaved weight
    memory (two entries of one geometry), as the conflict percentage."""
    pairs: dict[tuple, dict[str, Entry]] = {}
    for e in entries.values():
        if e.kind != "kernel" or not str(e.get("op", "")).startswith("gemm"):
            continue
        w = e.get("what", "").lower()
        kind = "std" if "standard" in w else "int" if "interleaved" in w else None
        if kind and isinstance(e.get("cycles"), int):
            pairs.setdefault((e.get("op"), e.get("R"), e.get("K"), e.get("C")), {})[kind] = e
    for key in sorted(pairs, key=str):
        p = pairs[key]
        if "std" in p and "int" in p:
            pct = round(100 * p["std"].get("cycles") / p["int"].get("cycles"))
            return pct, f"{p['std'].id} / {p['int'].id}"
    return None


# ------------------------------------------------------------------ driver

def calibrate(entries: list[Entry], device: Device, window_days: int = 3) -> Calibration:
    """Fit `device`'s cost constants to `entries` (module docstring)."""
    ms, skipped = select(entries, device.amp_macs_fp16, device.amp_macs_fp8, window_days)
    ident = by_id(entries)
    facts, fact_src, images = _facts(ident, device.costs, device.alignment)
    start = dict(zip(COST_FIELDS, device.costs.values, strict=True))
    base = _with_costs(device, {**start, **facts}, images)
    fitted: dict[str, int] = {}
    counts: dict[str, int] = {}
    roles: dict[str, str] = {}
    unidentified: dict[str, tuple[int, int]] = {}
    for fam in sorted({m.family for m in ms}):
        fam_ms = [m for m in ms if m.family == fam]
        held = _holdout(fam_ms)
        fit_ms = [m for m in fam_ms if m.id not in held]
        theta = _fit_family(fam, fit_ms, base, start)
        while True:  # drop the worst outlier, refit
            model = _Model(fit_ms, _with_costs(base, {**start, **facts, **theta},
                                                               images))
            err = np.abs(model.cycles({}) - model.meas) / model.meas
            worst = int(np.argmax(err)) if len(err) else -1
            if worst < 0 or err[worst] <= OUTLIER or len(fit_ms) <= len(theta):
                break
            bad = fit_ms.pop(worst)
            sign = model.cycles({})[worst] - model.meas[worst]
            skipped.append(Skipped(bad.id, bad.op, (
                f"inconsistent with the other {fam} measurements "
                f"({100 * sign / bad.cycles:+.1f}% after fitting them): an earlier version "
                f"or a case the model does not cover")))
            theta = _fit_family(fam, fit_ms, base, start)
        fitted.update(theta)
        free = [f for f in FREE.get(fam, ()) if f in start]
        if len(fit_ms) < len(free):
            unidentified[fam] = (len(fit_ms), len(free))
        for m in fam_ms:
            if m in fit_ms:
                roles[m.id] = "fit"
            elif m.id in held:
                roles[m.id] = "holdout"
        for f in theta:
            counts[f] = len(fit_ms)
    after = _with_costs(device, {**start, **facts, **fitted}, images)
    before_model = {fam: _Model([m for m in ms if m.family == fam], device)
                    for fam in {m.family for m in ms}}
    after_model = {fam: _Model([m for m in ms if m.family == fam], after)
                   for fam in {m.family for m in ms}}
    rows = []
    for fam in sorted(before_model):
        b, a = before_model[fam].cycles({}), after_model[fam].cycles({})
        for i, m in enumerate(before_model[fam].ms):
            if m.id in roles:
                rows.append(Row(m, roles[m.id], int(b[i]), int(a[i])))
    changes = []
    new = dict(zip(COST_FIELDS, after.costs.values, strict=True))
    fam_of = {f: fam for fam, fs in FREE.items() for f in fs}
    for f in COST_FIELDS:
        if f in fitted and fam_of.get(f) in unidentified:
            n, k = unidentified[fam_of[f]]
            how = f"fitted ({counts[f]} measurements for {k} constants: unidentified)"
        elif f in fitted:
            how = f"fitted ({counts[f]} measurements)"
        elif f in facts:
            how = f"fact: {fact_src[f]}"
        else:
            how = "kept"
        changes.append(Change(f, start[f], new[f], how))
    if images != device.costs.images:
        fact_src.setdefault("kernel_image_bytes", "scaled")
    return Calibration(after, rows, sorted(skipped, key=lambda s: s.id), changes, fact_src,
                       unidentified)


def _with_costs(device: Device, values: dict[str, int], images: tuple[int, ...]) -> Device:
    """`device` with its cost constants replaced by `values` and `images`."""
    costs = Costs(tuple(int(values[f]) for f in COST_FIELDS), tuple(images))
    return dataclasses.replace(device, costs=costs)


# ------------------------------------------------------------------ output

def device_toml(device: Device, header: list[str], notes: dict[str, str] | None = None) -> str:
    """The TOML text of `device` (a full device, no `base`), `header` as
    comment lines, each cost constant with its meaning (and `notes[name]`)."""
    notes = notes or {}
    lines = [f"# {h}" if h else "#" for h in header]
    d = device.to_dict()
    lines.append(f'name = "{device.name}"')
    for k in ("tiles", "clock_hz", "memory_base", "memory_size", "element_bytes", "alignment",
              "workers", "amp_macs_fp8", "amp_macs_fp16"):
        v = d[k]
        lines.append(f"{k} = {hex(v) if k == 'memory_base' else repr(v)}")
    lines.append("")
    lines.append("[costs]")
    for f in COST_FIELDS:
        note = notes.get(f)
        lines.append(f"# {COST_DOCS[f]}" + (f" [{note}]" if note else ""))
        lines.append(f"{f} = {d['costs'][f]}")
    lines.append("")
    lines.append("[costs.kernel_image_bytes]")
    if notes.get("kernel_image_bytes"):
        lines.append(f"# {notes['kernel_image_bytes']}")
    for k in KERNEL_NAMES:
        lines.append(f"{k} = {d['costs']['kernel_image_bytes'][k]}")
    return "\n".join(lines) + "\n"


def write_device(path: str | Path, text: str) -> None:
    """Write a device TOML atomically (temp file, then os.replace)."""
    write_text_atomic(Path(path), text)


def report_json(cal: Calibration) -> dict[str, Any]:
    """The calibration as plain data (the `--json` output)."""
    n, med, mx = cal.checked_errors("fit")
    hn, hmed, hmx = cal.checked_errors("holdout")
    return {
        "device": cal.device.name,
        "rows": [{"id": r.m.id, "op": r.m.op, "kernel": r.m.kernel, "geometry": r.m.geometry,
                  "role": r.role, "measured": r.m.cycles, "before": r.before, "after": r.after,
                  "error": r.error, "derived": r.m.derived} for r in cal.rows],
        "families": {f: {"n": c, "median_abs_error": md, "max_abs_error": x}
                     for f, (c, md, x) in cal.family_errors("fit").items()},
        "holdout": {f: {"n": c, "median_abs_error": md, "max_abs_error": x}
                    for f, (c, md, x) in cal.family_errors("holdout").items()},
        "checked": {"n": n, "median_abs_error": med, "max_abs_error": mx,
                    "holdout_n": hn, "holdout_median_abs_error": hmed,
                    "holdout_max_abs_error": hmx},
        "constants": [{"name": c.name, "before": c.before, "after": c.after, "how": c.how}
                      for c in cal.changes if c.before != c.after or c.how != "kept"],
        "skipped": [{"id": s.id, "op": s.op, "reason": s.reason} for s in cal.skipped],
        "date": datetime.date.today().isoformat(),
    }


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def format_report(cal: Calibration, source: str) -> str:
    """The text `tileplan calibrate` prints: one row per measurement, the
    per-family errors, the constants that changed and why, the skipped entries."""
    from tilecommon.tables import table

    lines = [f"calibration of {cal.device.name} on {source}: {len(cal.rows)} measurements "
             f"({sum(r.role == 'fit' for r in cal.rows)} fitted, "
             f"{sum(r.role == 'holdout' for r in cal.rows)} held out), "
             f"{len(cal.skipped)} kernel entries skipped", ""]
    rows = [[r.m.id, r.m.op, r.m.geometry + (" (derived)" if r.m.derived else ""), r.role,
             f"{r.m.cycles:,}", f"{r.before:,}", f"{r.after:,}", _pct(r.error_before),
             _pct(r.error)] for r in cal.rows]
    lines.append(table(["id", "op", "geometry", "role", "measured", "before", "after",
                        "error before", "error after"], rows))
    lines.append("")
    fam_rows = []
    fit, held = cal.family_errors("fit"), cal.family_errors("holdout")
    for fam in sorted(set(fit) | set(held)):
        f = fit.get(fam, (0, 0.0, 0.0))
        h = held.get(fam)
        fam_rows.append([fam, f[0], f"{100 * f[1]:.2f}%", f"{100 * f[2]:.2f}%",
                         h[0] if h else 0, f"{100 * h[1]:.2f}%" if h else "-",
                         f"{100 * h[2]:.2f}%" if h else "-",
                         "yes" if fam in CHECKED else "no"])
    lines.append(table(["family", "fitted", "median |error|", "max |error|", "held out",
                        "median |error|", "max |error|", "checked"], fam_rows))
    n, med, mx = cal.checked_errors("fit")
    hn, hmed, hmx = cal.checked_errors("holdout")
    lines.append(f"checked families ({', '.join(CHECKED)}): fitted {n}, median |error| "
                 f"{100 * med:.2f}%, max {100 * mx:.2f}%; held out {hn}, median "
                 f"{100 * hmed:.2f}%, max {100 * hmx:.2f}%")
    for fam, (pts, k) in sorted(cal.unidentified.items()):
        lines.append(f"{fam}: {pts} measurement(s) for {k} constants "
                     f"({', '.join(FREE[fam])}): unidentified — the fit moves them only as "
                     f"far as these points ask, the rest is the start device's")
    lines.append("")
    const = [[c.name, c.before, c.after, c.how] for c in cal.changes
             if c.before != c.after or c.how != "kept"]
    lines.append(table(["constant", "before", "after", "from"], const))
    if "kernel_image_bytes" in cal.facts:
        lines.append(f"kernel_image_bytes: {cal.facts['kernel_image_bytes']}")
    lines.append("")
    lines.append(table(["skipped entry", "op", "why"],
                       [[s.id, s.op, s.reason] for s in cal.skipped]))
    return "\n".join(lines)


def plot(cal: Calibration, path: str | Path) -> Path:
    """Measured against modelled cycles (log-log, one colour per family):
    after the fit as dots, before as faint crosses; written atomically."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    fams = sorted({r.m.family for r in cal.rows})
    colours = plt.get_cmap("tab10")
    lo = min(min(r.m.cycles, r.after, r.before) for r in cal.rows)
    hi = max(max(r.m.cycles, r.after, r.before) for r in cal.rows)
    for i, fam in enumerate(fams):
        rs = [r for r in cal.rows if r.m.family == fam]
        c = colours(i % 10)
        ax.scatter([r.m.cycles for r in rs], [r.before for r in rs], marker="x", s=18,
                   color=c, alpha=0.35)
        ax.scatter([r.m.cycles for r in rs if r.role == "fit"],
                   [r.after for r in rs if r.role == "fit"], s=22, color=c, label=fam)
        ax.scatter([r.m.cycles for r in rs if r.role == "holdout"],
                   [r.after for r in rs if r.role == "holdout"], s=40, facecolors="none",
                   edgecolors=c)
    ax.plot([lo * 0.8, hi * 1.25], [lo * 0.8, hi * 1.25], color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured cycles (IPU21)")
    ax.set_ylabel(f"modelled cycles ({cal.device.name})")
    ax.set_title("kernel calls: after the fit (dots; rings held out), before (x)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    target = Path(path)
    write_file_atomic(target, lambda f: f.write(buf.getvalue()), mode="wb")
    return target
