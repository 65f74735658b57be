"""How well do the catalogue's per-recipe estimates predict the simulated
cycles of the same op in a built package?

For each case (model, layers) on DEVICE this builds the default baseline
(`baseline_plan` → `build` → timing simulation), maps the simulated cycles
of every step back to ops (`profile.step_profile`: through the package's
provenance, an op's own steps, the conversions lowered for it and the move
of its result to canonical) and sets them
beside the catalogue estimate of the recipe the op runs (`Recipe.cycles` ×
Repeat trips: kernel cycle models + sync + bytes / bandwidth per exchange
phase).  Printed per op: recipe, estimate, measured, measured/estimate; then
per op kind: Σ measured / Σ estimate (all steps, and own steps against the
compute part of the estimate) and the spread of the per-op ratios.  A ratio
far from 1, or a wide spread within a kind, is what makes an estimated gain
unreliable for ordering the optimizer's proposals.

Then the proposals themselves (TAU_CASE, siglip-so400m-map 1 layer; with
--small vit-tiny 1 layer): the default pipeline (`planner.plan`, TAU_STEPS
proposals) is run and every evaluated proposal's estimated gain is set
beside its simulated gain (the cycles of the incumbent it was proposed
around minus its own; a proposal that did not build has none and is left
out).  Kendall's tau-b between the two (scipy.stats.kendalltau; ties count
as neither concordant nor discordant) says how well the estimates rank the
proposals the way the simulator does (the target is >= 0.8).

Planning is deterministic, so no seed is involved.

Usage: python experiments/estimate_accuracy.py [--small] [--out-dir DIR]
Prints the table, writes DIR/estimate_accuracy.txt (experiments.common) and a
log-log scatter (estimate vs measured, per kind) beside it as .png.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from experiments.common import ARTIFACTS, publish, setup
from planner.ir.graph import op_sites
from planner.ir.models import load_model
from planner.lowering.lower import lower
from planner.search.incumbent import evaluate
from planner.search.policies import baseline_plan
from planner.search.profile import step_profile
from simulator.device import Device, load_device
from simulator.run import run
from tilecommon.tables import table

DEVICE = "c600"
CASES = (("vit-tiny", 2), ("siglip-so400m", 1), ("pe-core-l14", 1))
SMALL_CASES = (("vit-tiny", 1),)
TAU_CASE, SMALL_TAU_CASE = ("siglip-so400m-map", 1), ("vit-tiny", 1)
TAU_STEPS = 8


@dataclass(frozen=True)
class OpRow:
    """One op of one case.  Cycles summed over Repeat trips."""

    model: str
    op: str
    kind: str
    recipe: str
    estimate: int  # trips × Recipe.cycles
    compute_estimate: int  # trips × Recipe.compute_cycles
    measured: int  # Profile.ops: own steps + conversions + move to canonical
    own: int  # the op's own steps only

    @property
    def ratio(self) -> float:
        return self.measured / self.estimate if self.estimate > 0 else math.inf


def case_rows(model: str, layers: int, device: Device) -> tuple[list[OpRow], int, int]:
    """Per-op rows of one case, the simulated total and the attributed total."""
    g = load_model(model, layers=layers)
    plan = baseline_plan(g, device)
    inc = evaluate(g, device, plan)
    sim = run(inc.built.package, numerics=False)
    prof = step_profile(inc.built, sim.cycles_per_step)
    lowered = lower(g, device, plan)
    costs = prof.ops
    trips = {s.name: s.trips for s in op_sites(g)}
    rows = []
    for st in lowered.steps:
        if st.kind != "compute" or st.recipe is None or st.op is None:
            continue
        n = trips.get(st.label, 1)
        rows.append(OpRow(model, st.label, st.op.kind, st.recipe.key, n * st.recipe.cycles,
                          n * st.recipe.compute_cycles, costs.get(st.label, 0),
                          prof.moves.get(st.label, 0)))
    return rows, inc.cycles, sum(r.measured for r in rows)


@dataclass(frozen=True)
class ProposalRow:
    """One evaluated proposal: estimated and simulated gain (cycles; None
    when it did not build)."""

    kind: str
    description: str
    estimated: int
    simulated: int | None
    accepted: bool


def proposal_rows(model: str, layers: int, device: Device,
                  steps: int = TAU_STEPS) -> list[ProposalRow]:
    """The proposals the default pipeline evaluates, in order (module docstring)."""
    from planner import PipelineConfig, plan

    res = plan(load_model(model, layers=layers), device,
               PipelineConfig(optimization_steps=steps))
    inc = res.baseline_cycles
    rows = []
    for r in res.history:
        rows.append(ProposalRow(r.kind, r.description, r.estimated_gain,
                                inc - r.cycles if r.cycles is not None else None, r.accepted))
        if r.accepted and r.cycles is not None:
            inc = r.cycles
    return rows


def kendall_tau(rows: list[ProposalRow]) -> float:
    """Kendall's tau-b between estimated and simulated gains of the built
    proposals (nan with fewer than two)."""
    from scipy.stats import kendalltau

    built = [r for r in rows if r.simulated is not None]
    if len(built) < 2:
        return math.nan
    return float(kendalltau([r.estimated for r in built],
                            [r.simulated for r in built]).statistic)


def kind_summary(rows: list[OpRow]) -> list[tuple[str, ...]]:
    """Per op kind: ops, Σ estimate, Σ measured, ratio, own/compute ratio,
    min and max per-op ratio."""
    out = []
    for kind in sorted({r.kind for r in rows}):
        rs = [r for r in rows if r.kind == kind]
        est, meas = sum(r.estimate for r in rs), sum(r.measured for r in rs)
        cest, own = sum(r.compute_estimate for r in rs), sum(r.own for r in rs)
        ratios = [r.ratio for r in rs if r.estimate > 0]
        out.append((kind, str(len(rs)), f"{est:,}", f"{meas:,}",
                    f"{meas / est:.2f}" if est else "-",
                    f"{own / cest:.2f}" if cest else "-",
                    f"{min(ratios):.2f}" if ratios else "-",
                    f"{max(ratios):.2f}" if ratios else "-"))
    return out


def plot(rows: list[OpRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for kind in sorted({r.kind for r in rows}):
        rs = [r for r in rows if r.kind == kind and r.estimate > 0 and r.measured > 0]
        ax.scatter([r.estimate for r in rs], [r.measured for r in rs], label=kind, s=14)
    lo = max(1, min(min(r.estimate, r.measured) for r in rows if r.measured > 0))
    hi = max(max(r.estimate, r.measured) for r in rows)
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("catalogue estimate (cycles)")
    ax.set_ylabel("simulated cycles attributed to the op")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="run SMALL_CASES only")
    ap.add_argument("--out-dir", type=Path, default=ARTIFACTS)
    args = ap.parse_args(argv)
    setup()
    device = load_device(DEVICE)
    parts = []
    every: list[OpRow] = []
    for model, layers in SMALL_CASES if args.small else CASES:
        rows, total, attributed = case_rows(model, layers, device)
        every += rows
        body = [(r.op, r.kind, r.recipe, f"{r.estimate:,}", f"{r.measured:,}",
                 f"{r.ratio:.2f}") for r in rows]
        parts.append(f"{model}, {layers} layer(s): {total:,} simulated cycles, "
                     f"{attributed:,} attributed to ops\n"
                     + table(("op", "kind", "recipe", "estimate", "measured", "ratio"), body))
        parts.append(table(("kind", "ops", "estimate", "measured", "ratio", "own/compute",
                            "min", "max"), kind_summary(rows)))
    parts.append("all cases\n" + table(("kind", "ops", "estimate", "measured", "ratio",
                                        "own/compute", "min", "max"), kind_summary(every)))
    model, layers = SMALL_TAU_CASE if args.small else TAU_CASE
    props = proposal_rows(model, layers, device)
    n_built = sum(r.simulated is not None for r in props)
    body2 = [(r.kind, r.description, f"{r.estimated:,}",
              f"{r.simulated:,}" if r.simulated is not None else "not built",
              "yes" if r.accepted else "no") for r in props]
    parts.append(f"proposals evaluated on {model}, {layers} layer(s) (default baseline, "
                 f"{TAU_STEPS} steps): estimated against simulated gain\n"
                 + table(("kind", "proposal", "estimated", "simulated", "accepted"), body2)
                 + f"\nKendall tau-b (estimated vs simulated gain, {n_built} built "
                 f"proposals): {kendall_tau(props):.2f}  (target >= 0.8)")
    text = f"catalogue estimate vs simulated cycles on {DEVICE} (default baseline)\n\n" \
        + "\n\n".join(parts)
    print(text)
    publish("estimate_accuracy", "Catalogue estimates against simulated cycles", text,
            args.out_dir)
    plot(every, args.out_dir / "estimate_accuracy.png")
    return text


if __name__ == "__main__":
    main()
