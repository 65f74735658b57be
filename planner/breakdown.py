"""Where the cycles go: a run's cycles per graph op, and its per-tile balance.

`op_breakdown` charges every step's measured cycles (summed over Repeat
iterations) to the graph ops the step serves, as the package's provenance
records them (planner.lowering.provenance: op, family and role of each phase
merged into the step), so the rows add up to the run's total cycles
exactly: a merged step's cycles, vertices and bytes are split evenly among
its phases, the remainder to the first.  It needs only a package and a
simulation of it, so it works on a saved run too.

Each row splits the op's cycles into compute (compute steps), exchange
(exchange steps less their sync) and sync (`sync_cycles` per executed
exchange step); a Repeat's overhead is `(control)`'s compute.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.abi import STEP_COMPUTE, STEP_EXCHANGE, STEP_REPEAT_BEGIN, STEP_REPEAT_END
from planner.lowering.provenance import CONTROL
from simulator.package import Package


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


def op_breakdown(pkg: Package, cycles_per_step: np.ndarray) -> list[dict[str, Any]]:
    """One row per op that cost anything, most cycles first: `{op, family,
    cycles, compute, exchange, sync, vertices, bytes, roles}` (module
    docstring), from the package's provenance; the rows' cycles add up to
    `cycles_per_step.sum()`."""
    prov = pkg.provenance or tuple(((CONTROL, "control", "other"),) for _ in
                                   range(pkg.n_steps))
    runs = executions(pkg)
    sync = pkg.device.costs.sync_cycles
    kind = pkg["step_kind"]
    n_vtx = np.diff(pkg["step_vtx"])
    csum = np.concatenate([[0], np.cumsum(pkg["x_bytes"])])
    n_bytes = csum[pkg["step_xfer"][1:]] - csum[pkg["step_xfer"][:-1]]
    rows: dict[str, dict[str, Any]] = {}
    for s, served in enumerate(prov):
        c = int(cycles_per_step[s])
        k = int(kind[s])
        parts = {"compute": 0, "exchange": 0, "sync": 0}
        if k == STEP_EXCHANGE:
            parts["sync"] = min(c, int(runs[s]) * sync)
            parts["exchange"] = c - parts["sync"]
        else:  # compute, and a Repeat's overhead
            parts["compute"] = c
        vertices = int(n_vtx[s]) * int(runs[s]) if k == STEP_COMPUTE else 0
        moved = int(n_bytes[s]) * int(runs[s]) if k == STEP_EXCHANGE else 0
        n = len(served)
        for i, (op, family, role) in enumerate(served):
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


TILE_ARRAYS = ("busy_cycles", "bytes_in", "bytes_out", "send_busy_cycles",
               "receive_busy_cycles", "code_bytes",
               "exchange_table_bytes",
               "support_bytes", "tensor_range_bytes", "peak_parameter_bytes",
               "peak_activation_bytes", "peak_scratch_bytes", "peak_landing_bytes",
               "peak_tensor_bytes")


def tile_arrays(pkg: Package, sim: Any) -> dict[str, np.ndarray]:
    """int64 [tiles] per name of TILE_ARRAYS (a run's tiles.npz): compute busy
    cycles, exchange bytes in / out and the exchange cycles its send lane and
    its receive port are booked of simulation `sim`; the fixed regions
    (code, exchange tables, support) and the tensor range the allocator gave
    each tile; the peak over steps of live tensor bytes of each buffer kind,
    and of all tensor kinds together (the peaks of the kinds may fall at
    different steps, so they need not add up to it)."""
    from kernels.abi import BUF_ACTIVATION, BUF_LANDING, BUF_PARAMETER, BUF_SCRATCH

    a = pkg.arrays
    n, steps = pkg.tiles, max(pkg.n_steps, 1)
    tile = a["buf_tile"]
    ok = (tile >= 0) & (tile < n)

    def peak(kinds: tuple[int, ...]) -> np.ndarray:
        on = np.flatnonzero(ok & np.isin(a["buf_kind"], kinds))
        delta = np.zeros((n, steps + 1), dtype=np.int64)
        lo = np.clip(a["buf_first"][on], 0, steps)
        hi = np.clip(a["buf_last"][on] + 1, 0, steps)
        np.add.at(delta, (tile[on], lo), a["buf_bytes"][on])
        np.add.at(delta, (tile[on], hi), -a["buf_bytes"][on])
        return np.cumsum(delta, axis=1)[:, :steps].max(axis=1)

    kinds = (BUF_PARAMETER, BUF_ACTIVATION, BUF_SCRATCH, BUF_LANDING)
    out = {"busy_cycles": sim.tile_busy, "bytes_in": sim.tile_bytes_in,
           "bytes_out": sim.tile_bytes_out, "send_busy_cycles": sim.tile_send_busy,
           "receive_busy_cycles": sim.tile_receive_busy,
           "code_bytes": a["fp_code"],
           "exchange_table_bytes": a["fp_xtable"], "support_bytes": a["fp_support"],
           "tensor_range_bytes": a["fp_tensor"],
           **{f"peak_{name}_bytes": peak((k,)) for name, k in zip(
               ("parameter", "activation", "scratch", "landing"), kinds, strict=True)},
           "peak_tensor_bytes": peak(kinds)}
    return {k: np.asarray(out[k], dtype=np.int64) for k in TILE_ARRAYS}


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
