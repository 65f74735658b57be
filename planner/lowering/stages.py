"""Build: Graph + Device + Plan → a verified `simulator.Package`.

Stages, in order (each raises `BuildFailure(stage, ...)` when it cannot
succeed; STAGES names them): lower (the graph, checked by its verifier on
entry, under the plan's selections, with explicit conversions:
planner.lowering.lower) → expand (per-tile vertices and transfers: a symbolic
`Program`) → schedule → allocate (after `link.reserve` has sized code,
exchange-table and support bytes) → link → verify (simulator.verify checks
the package on exit).  A package that `simulator.verify` rejects is a
builder bug; it is reported as `BuildFailure("verify", -1, 0, 0, <reason>)` so
that callers (the optimizer) treat it like any failed build.

`Built.timings` holds wall seconds per stage, in stage order; they are for
reports only and never enter the package (whose hash depends on the inputs
alone).  `Built.stats` holds counts (steps, vertices, transfers, buffers,
patches by mode, merged phases, peak tile bytes and the fullest tile's
footprint by region).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from planner.decide.plan import Plan
from planner.ir.graph import Graph, verify_graph
from planner.lowering.allocate import Allocation, allocate
from planner.lowering.expand import expand_lowered, gc_paused
from planner.lowering.link import link, reserve
from planner.lowering.lower import lower
from planner.lowering.program import Program
from planner.lowering.provenance import label_owners
from planner.lowering.schedule import Schedule, schedule
from planner.lowering.state import BuildState
from simulator.device import Device
from simulator.package import Package
from simulator.run import release
from simulator.verify import verify
from tilecommon.errors import BuildFailure, PackageInvalid

STAGES = ("lower", "expand", "schedule", "allocate", "link", "verify")


@dataclass(frozen=True)
class Built:
    """A complete build: the package, its schedule and allocation, counts
    and stage timings (the optimizer keeps an incumbent's as `kept`)."""

    package: Package
    schedule: Schedule
    allocation: Allocation
    stats: dict[str, Any]
    timings: tuple[tuple[str, float], ...]

    @property
    def seconds(self) -> float:
        return sum(t for _, t in self.timings)

    def kept(self) -> Built:
        """This build as the optimizer keeps an incumbent: the schedule's
        outline only (`Schedule.outline`; the package holds every row), so
        the incumbent does not hold a second copy of a build's rows while
        the next trial builds (27-layer siglip-so400m-map, 8 steps: peak
        RSS 2.49 -> 2.32 GB at batch 1, 2.76 -> 2.56 GB at batch 2), and
        without the engine's program of the package (simulator.run.release:
        the incumbent's cycles are known; a later run rebuilds it)."""
        release(self.package)
        return replace(self, schedule=self.schedule.outline())


def peak_tile_bytes(pkg: Package) -> int:
    """Max over tiles of code + exchange-table + support + tensor-range bytes."""
    a = pkg.arrays
    total = a["fp_code"] + a["fp_xtable"] + a["fp_support"] + a["fp_tensor"]
    return int(total.max()) if total.size else 0


def peak_tile_profile(pkg: Package) -> dict[str, int]:
    """The fullest tile and its footprint by region (bytes)."""
    a = pkg.arrays
    total = a["fp_code"] + a["fp_xtable"] + a["fp_support"] + a["fp_tensor"]
    t = int(np.argmax(total)) if total.size else 0
    return {"tile": t, "code": int(a["fp_code"][t]), "exchange-table": int(a["fp_xtable"][t]),
            "support": int(a["fp_support"][t]), "tensor": int(a["fp_tensor"][t])}


def plan_digest(plan: Plan) -> str:
    """Stable sha256 of a plan (repr of its sorted tuples; never `hash()`)."""
    return hashlib.sha256(repr(plan).encode()).hexdigest()


def graph_meta(graph: Graph, plan: Plan) -> dict[str, Any]:
    """Manifest meta of a model build: model facts and the plan."""
    return {
        "model": graph.name,
        "layers": graph.attr_int("layers"),
        "batch": graph.attr_int("batch"),
        "plan": plan.describe(),
        "plan_sha256": plan_digest(plan),
    }


def build_program(
    program: Program,
    device: Device,
    name: str,
    meta: dict[str, Any],
    reduction_overlap: bool = False,
    timings: list[tuple[str, float]] | None = None,
    sched: Schedule | None = None,
    state: BuildState | None = None,
    owners: Mapping[str, tuple[str, str, str]] | None = None,
    check: bool = True,
) -> Built:
    """schedule → allocate → link → verify of an already expanded Program.
    `sched`: a schedule of this very program with this `reduction_overlap`
    (the optimizer's schedule cache) instead of scheduling again; `state`: the
    build state whose phase and buffer memos to use; `check` False leaves
    the verify stage to the caller (`verified`), which must run it before
    the build is used for anything but a timing simulation."""
    clock = list(timings or [])
    t = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal t
        now = time.perf_counter()
        clock.append((stage, now - t))
        t = now

    if sched is None:
        sched = schedule(program, reduction_overlap=reduction_overlap,
                         memo=state.phases if state else None)
    lap("schedule")
    res = reserve(program, sched, device, state.bufs if state else None)
    alloc = allocate(program, sched, device, res.overheads, cols=res.bufs)
    lap("allocate")
    pkg, lstats = link(program, sched, alloc, res, device, name, meta, owners)
    lap("link")
    if check:
        verified(pkg)
        lap("verify")
    stats = {
        "steps": pkg.n_steps,
        "vertices": pkg.n_vertices,
        "transfers": pkg.n_transfers,
        "buffers": pkg.n_buffers,
        "program_buffers": len(program.bufs),
        "merged_phases": sched.merged,
        "delayed_reductions": sched.delayed,
        "arithmetic_patches": lstats.arithmetic_patches,
        "table_patches": lstats.table_patches,
        "table_entries": lstats.table_entries,
        "peak_tile_bytes": peak_tile_bytes(pkg),
        "peak_tile": peak_tile_profile(pkg),
        "peak_live_tensor_bytes": int(np.max(alloc.peak_live)) if alloc.peak_live.size else 0,
        "allocate_fallback_tiles": alloc.fallback_tiles,
        "element_conflicts": alloc.element_conflicts,
    }
    return Built(pkg, sched, alloc, stats, tuple(clock))


def verified(pkg: Package) -> Package:
    """The verify stage: `pkg`, or BuildFailure("verify") naming what
    simulator.verify rejected (a builder bug)."""
    try:
        verify(pkg)
    except PackageInvalid as e:
        raise BuildFailure("verify", -1, 0, 0, f"package rejected by the verifier: {e}") from e
    return pkg


def expand_stage(graph: Graph, device: Device, plan: Plan, state: BuildState | None,
                 clock: list[tuple[str, float]]) -> Program:
    """lower → expand of `plan` (the first two stages), their seconds appended
    to `clock`; with a `state`, the expansion resumes from a recent one."""
    t0 = time.perf_counter()
    verify_graph(graph)
    lw = lower(graph, device, plan, state)
    t1 = time.perf_counter()
    program = (expand_lowered(lw, device) if state is None
               else state.prefixes.expand(lw, device).program)
    clock += [("lower", t1 - t0), ("expand", time.perf_counter() - t1)]
    return program


def plan_owners(graph: Graph, device: Device, plan: Plan, state: BuildState | None
                ) -> dict[str, tuple[str, str, str]]:
    """What each step label of `plan`'s build serves (planner.lowering.provenance);
    the lowering comes from `state`'s cache when it has one."""
    return label_owners(lower(graph, device, plan, state))


def build(graph: Graph, device: Device, plan: Plan, state: BuildState | None = None,
          check: bool = True) -> Built:
    """The whole build of `graph` on `device` under `plan`: the named stages
    of STAGES in order (module docstring); every choice comes from `plan`
    (`check` False: all but verify, which the caller runs: `build_program`).
    `state` is the build state whose caches it goes through (None: a fresh
    one): a recent lowering is reused, an expansion resumes from the longest
    common lowered-step prefix of a recent one (or is reused whole when the
    plan differs only in reduction overlap), and a schedule of the very
    same program is reused.  Raises BuildFailure."""
    state = state if state is not None else BuildState()
    with gc_paused():  # ~10⁶ acyclic objects: collections would cost as much as the build
        clock: list[tuple[str, float]] = []
        ekey = (graph, device, replace(plan, reduction_overlap=False))
        program = state.expansions.get(ekey)
        if program is None:
            program = expand_stage(graph, device, plan, state, clock)
            state.expansions.put(ekey, program)
        skey = (ekey, plan.reduction_overlap)
        sched = state.schedules.get(skey)
        built = build_program(program, device, graph.name, graph_meta(graph, plan),
                              reduction_overlap=plan.reduction_overlap, timings=clock,
                              sched=sched, state=state,
                              owners=plan_owners(graph, device, plan, state), check=check)
        if sched is None:
            state.schedules.put(skey, built.schedule)
        return built
