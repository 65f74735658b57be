"""Where the cycles go: a run's cycles per graph op, and its per-tile balance.

`op_breakdown` charges every step's measured cycles (summed over Repeat
iterations) to the graph ops the step serves, so the rows add up to the
run's total cycles exactly.  A step serves the ops of the phases merged
into it (its schedule labels); a merged step's cycles, vertices and bytes
are split evenly among them, the remainder to the first.  What a label
serves comes from the lowering, in program order:

- an op's compute step (and its expansion: `… reduce`, `… partial sums`,
  `… pack` / `… unpack`) serves the op — role compute, reduction or pack;
- the moves lowered for an op's inputs (`to …`), its parameters
  (`param …`) and absorbed casts, all emitted just before its compute step,
  serve that op — roles input, parameter, cast;
- the move of an op's result to its canonical layout (`canon …`, just
  after it) serves it — role canonical;
- the Repeat's own steps and anything unlabelled are `(control)`.

Each row splits the op's cycles into compute (compute steps), exchange
(exchange steps less their sync) and sync (`sync_cycles` per executed
exchange step); loop overhead is control's compute.  The attribution reads
the labels of the build; recording provenance in the package itself is the
next step (it would let `tileplan report` and the trace do this from a saved
package alone).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels.abi import STEP_COMPUTE, STEP_EXCHANGE, STEP_REPEAT_BEGIN, STEP_REPEAT_END
from planner.build.lowered import Lowered
from planner.build.schedule import Schedule
from simulator.package import Package

CONTROL = "(control)"
_ROLE_SUFFIXES = ((" partial sums", "reduction"), (" partials", "reduction"),
                  (" reduce", "reduction"), (" unpack", "pack"), (" pack", "pack"))


def label_owners(lowered: Lowered) -> dict[str, tuple[str, str, str]]:
    """Step label (without expansion suffixes) -> (op, family, role)."""
    out: dict[str, tuple[str, str, str]] = {}
    pending: list[tuple[str, str]] = []  # (label, role) waiting for the next compute op
    last: tuple[str, str] | None = None
    for st in lowered.steps:
        if st.kind == "compute":
            family = type(st.op).__name__ if st.op is not None else "op"
            out.setdefault(st.label, (st.label, family, "compute"))
            for lab, role in pending:
                out.setdefault(lab, (st.label, family, role))
            pending, last = [], (st.label, family)
        elif st.kind == "cast":
            pending.append((st.label, "cast"))
        elif st.kind == "redistribute" and st.label.startswith("canon ") and last is not None:
            out.setdefault(st.label, (last[0], last[1], "canonical"))
        elif st.kind == "redistribute":
            pending.append((st.label, "parameter" if st.label.startswith("param ")
                            else "input"))
        else:  # loop_begin / loop_end: the Repeat itself
            out.setdefault(st.label, (CONTROL, "control", "loop"))
    for lab, role in pending:  # moves after the last compute op (the outputs)
        out.setdefault(lab, (last[0], last[1], role) if last else (CONTROL, "control", role))
    return out


def _owner(label: str, owners: Mapping[str, tuple[str, str, str]]) -> tuple[str, str, str]:
    for suffix, role in _ROLE_SUFFIXES:
        if label.endswith(suffix) and label[: -len(suffix)] in owners:
            op, family, _ = owners[label[: -len(suffix)]]
            return op, family, role
    for key in (label, label.removeprefix("cast ")):
        if key in owners:
            return owners[key]
    return CONTROL, "control", "other"


def executions(pkg: Package) -> np.ndarray:
    """int64 [S]: how many times each step runs (the product of the trip
    counts of the loops around it)."""
    kind, trips = pkg["step_kind"], pkg["step_trips"]
    out = np.ones(pkg.n_steps, dtype=np.int64)
    mult = [1]
    for s in range(pkg.n_steps):
        k = int(kind[s])
        if k == STEP_REPEAT_BEGIN:
            out[s] = mult[-1]
            mult.append(mult[-1] * max(int(trips[s]), 1))
            continue
        out[s] = mult[-1]
        if k == STEP_REPEAT_END and len(mult) > 1:
            mult.pop()
    return out


def op_breakdown(lowered: Lowered, schedule: Schedule, pkg: Package,
                 cycles_per_step: np.ndarray) -> list[dict[str, Any]]:
    """One row per op that cost anything, most cycles first: `{op, family,
    cycles, compute, exchange, sync, vertices, bytes, roles}` (module
    docstring); the rows' cycles add up to `cycles_per_step.sum()`."""
    if len(schedule.steps) != pkg.n_steps:
        raise ValueError(f"schedule has {len(schedule.steps)} steps, package {pkg.n_steps}")
    owners = label_owners(lowered)
    runs = executions(pkg)
    sync = pkg.device.costs.sync_cycles
    kind = pkg["step_kind"]
    n_vtx = np.diff(pkg["step_vtx"])
    csum = np.concatenate([[0], np.cumsum(pkg["x_bytes"])])
    n_bytes = csum[pkg["step_xfer"][1:]] - csum[pkg["step_xfer"][:-1]]
    rows: dict[str, dict[str, Any]] = {}
    for s, st in enumerate(schedule.steps):
        c = int(cycles_per_step[s])
        labels = list(st.labels) or [CONTROL]
        k = int(kind[s])
        parts = {"compute": 0, "exchange": 0, "sync": 0}
        if k == STEP_EXCHANGE:
            parts["sync"] = min(c, int(runs[s]) * sync)
            parts["exchange"] = c - parts["sync"]
        else:  # compute, and a Repeat's overhead
            parts["compute"] = c
        vertices = int(n_vtx[s]) * int(runs[s]) if k == STEP_COMPUTE else 0
        moved = int(n_bytes[s]) * int(runs[s]) if k == STEP_EXCHANGE else 0
        n = len(labels)
        for i, lab in enumerate(labels):
            op, family, role = _owner(lab, owners) if lab != CONTROL else \
                (CONTROL, "control", "other")
            row = rows.setdefault(op, {"op": op, "family": family, "cycles": 0, "compute": 0,
                                       "exchange": 0, "sync": 0, "vertices": 0, "bytes": 0,
                                       "roles": {}})
            first = i == 0
            for name, v in (*parts.items(), ("vertices", vertices), ("bytes", moved)):
                share = v // n + (v % n if first else 0)
                row[name] += share
            share_c = c // n + (c % n if first else 0)
            row["cycles"] += share_c
            row["roles"][role] = row["roles"].get(role, 0) + share_c
    out = [r for r in rows.values() if r["cycles"] or r["vertices"] or r["bytes"]]
    out.sort(key=lambda r: (-r["cycles"], r["op"]))
    return out


def tile_balance(tile_busy: np.ndarray) -> dict[str, float]:
    """Per-tile compute busy cycles over the tiles that compute: min, mean,
    max and the imbalance factor max / mean (1 = every tile equally busy)."""
    busy = tile_busy[tile_busy > 0].astype(np.float64)
    if busy.size == 0:
        return {"min": 0.0, "mean": 0.0, "max": 0.0, "imbalance": 1.0, "tiles": 0}
    mean = float(busy.mean())
    return {"min": float(busy.min()), "mean": mean, "max": float(busy.max()),
            "imbalance": float(busy.max()) / mean, "tiles": int(busy.size)}


def step_kind_totals(pkg: Package, cycles_per_step: np.ndarray) -> dict[str, int]:
    """Total compute, exchange, sync and loop cycles of a run."""
    kind = pkg["step_kind"]
    runs = executions(pkg)
    ex = kind == STEP_EXCHANGE
    sync = np.minimum(cycles_per_step, runs * pkg.device.costs.sync_cycles) * ex
    return {"compute": int(cycles_per_step[kind == STEP_COMPUTE].sum()),
            "exchange": int((cycles_per_step * ex).sum() - sync.sum()),
            "sync": int(sync.sum()),
            "loop": int(cycles_per_step[kind == STEP_REPEAT_END].sum())}
