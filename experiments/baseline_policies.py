"""Which baseline policy builds, and what does each cost: `default` vs `capacity`.

For each case (model, layers, batch) of CASES and each policy of POLICIES this
plans the baseline only (`PipelineConfig(optimization_steps=0,
baseline=...)`: baseline policy → expand → schedule → allocate → link
→ verify → timing simulation) on DEVICE and reports:

- result: `ok`, or `FAIL` with the BuildFailure line (stage: tile: detail
  (need N bytes, have M)) printed under the table;
- cycles (simulated, timing only) and the fraction of the fp8 compute roofline
  (graph FLOPs / (tiles × 2 × fp8 MACs/cycle × cycles));
- peak tile bytes: max over tiles of code + exchange tables + support + tensor
  range;
- live tensor bytes: the sum over tiles of each tile's peak live tensor bytes
  (the allocator's `peak_live`) — the package's counterpart of the capacity
  policy's "total live tensor memory" score;
- plan s: wall seconds of `planner.plan` (policy, build, verify, simulation),
  after one untimed warm-up plan (WARMUP) so no row pays numba compilation.

The design note (seed 000) reported for its capacity baseline: "PE batch two
fits, but SigLIP encounters exchange storage/alignment limitations".  The
script prints what this run observed for those two cases beside that claim.

Planning is deterministic (no random draws), so there is no seed.

Usage: python experiments/baseline_policies.py [--small] [--out-dir DIR]
Writes DIR/baseline_policies.txt (the printed table) and DIR/baseline_policies.png
(cycles and peak tile bytes per case and policy).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.common import publish, setup
from kernels.exceptions import BuildFailure
from planner.build.stages import peak_tile_bytes
from planner.ir.models import load_model
from planner.pipeline import plan
from planner.report import roofline_fraction
from planner.search.incumbent import PipelineConfig
from simulator.device import load_device
from simulator.tables import markdown as markdown_table

DEVICE = "c600"
POLICIES = ("default", "capacity")
# (model, layers, batch)
CASES = (
    ("vit-tiny", 2, 1),
    ("siglip-so400m", 1, 1),
    ("siglip-so400m", 27, 1),
    ("pe-core-l14", 1, 1),
    ("pe-core-l14", 1, 2),
    ("pe-core-l14", 24, 1),
    ("pe-core-l14", 24, 2),
)
# the small variant (tests): one case that builds on c600 under both policies
SMALL_CASES = (("vit-tiny", 1, 1),)
WARMUP = ("vit-tiny", 1, 1)
OUT_DIR = Path("artifacts")
COMMAND = "python experiments/baseline_policies.py"
SEED_NOTE = "seed (design note 000), capacity policy: PE batch two fits, SigLIP hits " \
            "exchange storage/alignment limits"


@dataclass(frozen=True)
class Row:
    """One (case, policy) measurement; `failure` is the BuildFailure line
    (empty when the baseline built)."""

    model: str
    layers: int
    batch: int
    policy: str
    cycles: int = 0
    roofline: float = 0.0
    peak_bytes: int = 0
    live_bytes: int = 0
    seconds: float = 0.0
    failure: str = ""
    stage: str = ""
    tile: int = -1

    @property
    def ok(self) -> bool:
        return not self.failure


def measure(model: str, layers: int, batch: int, policy: str, device_name: str) -> Row:
    """Plan one case's baseline under `policy`; a BuildFailure becomes a row."""
    device = load_device(device_name)
    graph = load_model(model, layers=layers, batch=batch)
    cfg = PipelineConfig(optimization_steps=0, baseline=policy)
    t0 = time.perf_counter()
    try:
        res = plan(graph, device, cfg)
    except BuildFailure as e:
        return Row(model, layers, batch, policy, seconds=time.perf_counter() - t0,
                   failure=" ".join(str(e).split()), stage=e.stage, tile=e.tile)
    secs = time.perf_counter() - t0
    assert res.built is not None
    return Row(model, layers, batch, policy, cycles=res.cycles,
               roofline=roofline_fraction(graph, device, res.cycles),
               peak_bytes=peak_tile_bytes(res.package),
               live_bytes=int(res.built.allocation.peak_live.sum()), seconds=secs)


def _secs(s: float) -> str:
    """Wall seconds: one decimal, two below a second (small-variant plans)."""
    return f"{s:.1f}" if s >= 1 else f"{s:.2f}"


HEADER = ("model", "layers", "batch", "policy", "result", "cycles", "fp8 roofline",
          "peak tile bytes", "live tensor bytes", "plan s")


def cells(r: Row) -> tuple[str, ...]:
    head = (r.model, str(r.layers), str(r.batch), r.policy)
    if not r.ok:
        return (*head, f"FAIL {r.stage}", "-", "-", "-", "-", _secs(r.seconds))
    return (*head, "ok", f"{r.cycles:,}", f"{100 * r.roofline:.2f}%", f"{r.peak_bytes:,}",
            f"{r.live_bytes:,}", _secs(r.seconds))


def markdown(rows: Sequence[Row]) -> str:
    """The table as markdown (what docs/results.md shows)."""
    return markdown_table(HEADER, [cells(r) for r in rows])


def _observed(rows: Sequence[Row], model: str, batch: int) -> str:
    hits = [r for r in rows if r.model == model and r.batch == batch and r.policy == "capacity"]
    if not hits:
        return f"{model} batch {batch}: not run"
    return "; ".join(f"{r.model} {r.layers}L b{r.batch} " + ("fits" if r.ok else
                     f"fails in {r.stage} (tile {r.tile})") for r in hits)


def report(rows: Sequence[Row], device_name: str) -> str:
    """Title, markdown table, failure lines, seed comparison, reproduce line."""
    lines = [f"baseline policies on {device_name} (optimization_steps=0)", "", markdown(rows)]
    fails = [r for r in rows if not r.ok]
    if fails:
        lines.append("")
        lines += [f"- {r.model} {r.layers}L b{r.batch} {r.policy}: {r.failure}" for r in fails]
    lines += ["", SEED_NOTE,
              "observed, capacity policy: " + _observed(rows, "pe-core-l14", 2) + "; "
              + _observed(rows, "siglip-so400m", 1),
              f"reproduce: {COMMAND}"]
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path) -> None:
    """Grouped bars per case: cycles (log) and peak tile bytes, one bar per policy
    (absent bar = build failure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r.model, r.layers, r.batch) for r in rows))
    labels = [f"{m}\n{n}L b{b}" for m, n, b in cases]
    by = {(r.model, r.layers, r.batch, r.policy): r for r in rows}
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(max(8.0, 2.2 * len(cases)), 4))
    width = 0.8 / len(POLICIES)
    for k, pol in enumerate(POLICIES):
        xs = [i + (k - (len(POLICIES) - 1) / 2) * width for i in range(len(cases))]
        got = [by.get((*c, pol)) for c in cases]
        ax0.bar(xs, [r.cycles if r and r.ok else 0 for r in got], width, label=pol)
        ax1.bar(xs, [r.peak_bytes if r and r.ok else 0 for r in got], width, label=pol)
    for ax in (ax0, ax1):
        ax.set_xticks(range(len(cases)), labels, fontsize=7)
        ax.legend()
    ax0.set_yscale("log")
    ax0.set_ylabel("cycles (timing simulation)")
    ax1.set_ylabel("peak tile bytes")
    ax1.axhline(load_device(DEVICE).memory_size, color="grey", lw=0.8, ls="--")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="run SMALL_CASES only")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    setup()
    cases = SMALL_CASES if args.small else CASES
    measure(*WARMUP, "default", DEVICE)  # numba compiles (or loads its cache), untimed
    rows = []
    for m, n, b in cases:
        for pol in POLICIES:
            rows.append(measure(m, n, b, pol, DEVICE))
            print(f"  {m} {n}L b{b} {pol}: {rows[-1].failure or 'ok'}", file=sys.stderr,
                  flush=True)
    text = report(rows, DEVICE)
    print(text)
    publish("baseline_policies", "Baseline policies: default vs capacity", text, args.out_dir,
            markdown=True)
    plot(rows, args.out_dir / "baseline_policies.png")
    return text


if __name__ == "__main__":
    main()
