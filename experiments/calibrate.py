"""Experiment: calibrate the device's step-level timing constants from measured cycles.

Question: given packages and their measured cycles (per step, or only the
total), which exchange and loop constants explain them?  Kernel calls are
calibrated one by one (`tileplan calibrate`, simulator/calibrate.py); what a
whole-program measurement adds is the exchange and the loop.  The constants
that enter the simulator's timing model (simulator/timing.py) linearly are
fitted by least squares on per-step features of each package:

| constant | feature of a step (summed over its executions) |
|---|---|
| compute_scale (nominal 1) | COMPUTE: max over tiles of the summed vertex cycles |
| exchange_fixed_cycles (sync + setup) | EXCHANGE: executions |
| exchange_cycles_per_byte (1 / bytes per cycle) | EXCHANGE: max over tiles of max(in, out) bytes |
| loop_overhead_cycles | REPEAT_END: executions (iterations) |

The features come from the simulator itself: one timing-only run on the
package's device with sync, setup, loop overhead, transfer controls and arrival
latency set to 0 and 1 byte/cycle exchange (its cycles per step are the work and byte
features; the Repeat patch cycles it still charges are a known offset), plus
step executions from the package arrays.  The model is linear while transfers
are payload-bound (a tile whose send or receive controls outlast its payload
breaks it) and up to the per-execution ceil of exchange cycles; the
residuals show how much that matters.  A second fit multiplies every measured
step by 1 + N(0, NOISE) (seed SEED) to show the sensitivity to measurement
noise.  `compute_scale` absorbs a uniform error of the kernels' cycle models
(on real hardware); it cannot be changed on a simulated device, so in the
synthetic demonstration its true value is 1.  One exchange bandwidth is
fitted (in = out, as on c600).

Without hardware the demonstration is SYNTHETIC and says so: the packages are
simulated on a device with PERTURBED constants (and no control cost, so the
model is linear), those cycles are the "measurements", and the fit must
recover the perturbed constants.  The seed's one hardware data point (988890
cycles for one siglip-so400m layer, built by another system's planner,
baseline only) is compared with our simulated one-layer baseline as a ratio
only — it is not fitted.

Real measurements: `--from RESULT_DIR... --packages PKG_DIR...` reads hardware
results saved with simulator.hardware (each matched to its package by content
hash) and fits per-step cycles when every result has them, totals otherwise
(totals need at least as many packages as identifiable constants).

Reproduce:  .venv/bin/python experiments/calibrate.py [--packages DIR...]
Writes artifacts/calibrate.txt (the tables) and artifacts/calibrate.png
(measured vs fitted step cycles).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.common import publish, setup
from kernels.abi import STEP_COMPUTE, STEP_EXCHANGE, STEP_REPEAT_END
from simulator import Package, load_package, run
from simulator.device import Device
from simulator.hardware import load_hardware_result
from simulator.trace import step_executions
from simulator.xschedule import rescheduled
from tilecommon.tables import table

DEVICE = "c600"
MODELS = (("vit-tiny", 2), ("siglip-so400m", 1))  # baseline packages of the demonstration
PARAMS = ("compute_scale", "exchange_fixed_cycles", "exchange_cycles_per_byte",
          "loop_overhead_cycles")
# the SYNTHETIC device: c600 with these constants changed (no control cost: linear)
PERTURBED = {"sync_cycles": 760, "exchange_setup_cycles": 40,
             "exchange_in_bytes_per_cycle": 3, "exchange_out_bytes_per_cycle": 3,
             "loop_overhead_cycles": 35, "send_cycles": 0, "receive_cycles": 0,
             "arrival_latency_cycles": 0, "arrival_latency_row_cycles": 0}
# the package's own device made linear in the constants: no control cost, no
# arrival latency (the scheduled window is then its payload cycles)
LINEAR = {"send_cycles": 0, "receive_cycles": 0, "arrival_latency_cycles": 0,
          "arrival_latency_row_cycles": 0}
# the feature run: every linear constant at 0 (bytes at 1 per cycle)
FEATURE_DEVICE = {"sync_cycles": 0, "exchange_setup_cycles": 0, "loop_overhead_cycles": 0,
                  "exchange_in_bytes_per_cycle": 1, "exchange_out_bytes_per_cycle": 1,
                  "send_cycles": 0, "receive_cycles": 0, "arrival_latency_cycles": 0,
                  "arrival_latency_row_cycles": 0}
NOISE = 0.01  # relative std of the multiplicative noise of the second, noisy fit
SEED = 0  # of that noise
SEED_HW_CYCLES = 988890  # seed: one siglip-so400m layer, another system's baseline package
SEED_HW_MS = 0.65926
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def constants(dev: Device) -> np.ndarray:
    """The device's values of PARAMS (float64 [4])."""
    c = dev.costs
    if c.exchange_in_bytes_per_cycle != c.exchange_out_bytes_per_cycle:
        raise ValueError(f"device {dev.name}: one exchange bandwidth is fitted, but in "
                         f"{c.exchange_in_bytes_per_cycle} != out "
                         f"{c.exchange_out_bytes_per_cycle} bytes/cycle")
    return np.array([1.0, dev.exchange_fixed_cycles, 1.0 / c.exchange_in_bytes_per_cycle,
                     c.loop_overhead_cycles])


def on_device(pkg: Package, **changes: int) -> Package:
    """`pkg` with some device cost constants changed (same program, its
    exchange scheduled afresh for the changed fabric)."""
    return rescheduled(pkg, device=pkg.device.with_costs(**changes))


def features(pkg: Package) -> tuple[np.ndarray, np.ndarray]:
    """(float64 [S, 4] per-step features of PARAMS, float64 [S] the known
    offset: the Repeat patch cycles at REPEAT_END steps) (module docstring)."""
    a = pkg.arrays
    work = run(on_device(pkg, **FEATURE_DEVICE), numerics=False).cycles_per_step
    execs = step_executions(pkg)
    kind = a["step_kind"]
    f = np.zeros((pkg.n_steps, len(PARAMS)))
    offset = np.zeros(pkg.n_steps)
    for s in range(pkg.n_steps):
        k = int(kind[s])
        if k == STEP_COMPUTE:
            f[s, 0] = work[s]
        elif k == STEP_EXCHANGE:
            f[s, 1], f[s, 2] = execs[s], work[s]
        elif k == STEP_REPEAT_END:
            f[s, 3] = execs[s]
            offset[s] = work[s]
    return f, offset


@dataclass(frozen=True)
class Fit:
    values: np.ndarray  # float64 [4]; nan where not identifiable
    identified: np.ndarray  # bool [4]
    residuals: np.ndarray  # measured - fitted, per row (cycles)
    measured: np.ndarray
    fitted: np.ndarray
    rank: int


def fit(rows: np.ndarray, y: np.ndarray) -> Fit:
    """Least squares `rows @ values ≈ y` with columns scaled to unit norm;
    all-zero columns are not identifiable (nan)."""
    norms = np.sqrt((rows * rows).sum(axis=0))
    ok = norms > 0
    x = rows[:, ok] / norms[ok]
    sol, _, rank, _ = np.linalg.lstsq(x, y.astype(np.float64), rcond=None)
    values = np.full(len(PARAMS), np.nan)
    values[ok] = sol / norms[ok]
    fitted = rows[:, ok] @ values[ok]
    return Fit(values, ok, y - fitted, y.astype(np.float64), fitted, int(rank))


def _fmt(v: float) -> str:
    return "n/a" if not np.isfinite(v) else f"{v:.4g}"


def build_packages(device: str = DEVICE) -> list[Package]:
    """Baseline packages of MODELS (planner, `--optimization-steps 0`)."""
    import planner
    from simulator import load_device

    dev = load_device(device)
    out = []
    for model, layers in MODELS:
        g = planner.load_model(model, layers=layers)
        out.append(planner.plan(g, dev, planner.PipelineConfig(optimization_steps=0)).package)
    return out


def _describe(pkg: Package) -> str:
    m = pkg.meta
    return f"{m.get('model', pkg.name)} {m.get('layers', '?')}L ({pkg.content_hash()[:8]})"


def synthetic(packages: Sequence[Package]) -> tuple[str, Fit, list[int]]:
    """Fit per-step cycles simulated on the PERTURBED device; returns the report
    text, the fit and each package's nominal simulated cycles."""
    feats, ys, nominal, model_err = [], [], [], []
    truth = None
    for pkg in packages:
        linear = on_device(pkg, **LINEAR)
        f, offset = features(linear)
        feats.append(f)
        perturbed = on_device(pkg, **PERTURBED)
        truth = constants(perturbed.device)
        ys.append(run(perturbed, numerics=False).cycles_per_step - offset)
        nom = run(linear, numerics=False)
        nominal.append(run(pkg, numerics=False).cycles)
        model_err.append(float(np.abs(f @ constants(pkg.device) + offset
                                      - nom.cycles_per_step).max()))
    rows, y = np.concatenate(feats), np.concatenate(ys)
    keep = rows.any(axis=1)
    res = fit(rows[keep], y[keep])
    noise = np.random.default_rng(SEED).normal(1.0, NOISE, size=int(keep.sum()))
    noisy = fit(rows[keep], y[keep] * noise)
    assert truth is not None

    def rel(v: float, t: float) -> str:
        return "n/a" if not np.isfinite(v) else f"{(v - t) / t:+.2e}"

    rows_ = [[p, _fmt(t), _fmt(v), rel(v, t), _fmt(w), rel(w, t)]
             for p, t, v, w in zip(PARAMS, truth, res.values, noisy.values, strict=True)]
    lines = ["SYNTHETIC calibration: 'measurements' are simulations on a perturbed device "
             f"({', '.join(f'{k}={v}' for k, v in PERTURBED.items())}), not hardware.",
             "packages: " + "; ".join(f"{_describe(p)} {p.n_steps} steps" for p in packages),
             f"rows (steps with features): {int(keep.sum())}, rank {res.rank}", "",
             table(["constant", "true (perturbed)", "fitted", "rel. error",
                     f"fitted, {NOISE:.0%} noise", "rel. error"], rows_), "",
             _residual_lines(res),
             "linear model at the nominal device, max |features @ constants - simulated| "
             f"per step: {max(model_err):.0f} cycles"]
    return "\n".join(lines), res, nominal


def _residual_lines(res: Fit) -> str:
    r = res.residuals
    rel = np.abs(r) / np.maximum(res.measured, 1.0)
    return (f"residuals (measured - fitted, cycles): max |r| {np.abs(r).max():.1f}, rms "
            f"{np.sqrt((r * r).mean()):.1f}, max |r|/measured {rel.max():.2e}; total measured "
            f"{res.measured.sum():.0f} vs fitted {res.fitted.sum():.0f}")


def seed_comparison(packages: Sequence[Package], nominal: Sequence[int]) -> str:
    for pkg, cycles in zip(packages, nominal, strict=True):
        if pkg.meta.get("model") == "siglip-so400m" and pkg.meta.get("layers") == 1:
            ms = cycles / pkg.device.clock_hz * 1e3
            return (f"seed hardware point (not fitted: another system's planner and package): "
                    f"one siglip-so400m layer {SEED_HW_CYCLES} cycles = {SEED_HW_MS} ms; our "
                    f"simulated one-layer baseline {cycles} cycles = {ms:.5f} ms; "
                    f"seed hw / our sim = {SEED_HW_CYCLES / cycles:.3f}")
    return "seed hardware point: no siglip-so400m 1-layer package in this run"


def measured(result_dirs: Sequence[str], packages: Sequence[Package]) -> tuple[str, Fit]:
    """Fit hardware results (saved with simulator.hardware) of `packages`."""
    by_hash = {p.content_hash(): p for p in packages}
    pairs = []
    for d in result_dirs:
        r = load_hardware_result(d)
        if r.package_hash not in by_hash:
            raise ValueError(f"{d}: package {r.package_hash[:12]} not among --packages")
        pairs.append((by_hash[r.package_hash], r))
    per_step = all(r.step_cycles is not None for _, r in pairs)
    rows, ys = [], []
    for pkg, r in pairs:
        f, offset = features(pkg)
        if per_step:
            assert r.step_cycles is not None
            rows.append(f)
            ys.append(r.step_cycles.astype(np.float64) - offset)
        else:
            rows.append(f.sum(axis=0, keepdims=True))
            ys.append(np.array([float(r.total_cycles) - offset.sum()]))
    x, y = np.concatenate(rows), np.concatenate(ys)
    keep = x.any(axis=1)
    res = fit(x[keep], y[keep])
    nominal = constants(pairs[0][0].device)
    kind = "SYNTHETIC results" if any(r.synthetic for _, r in pairs) else "hardware results"
    rows_ = [[p, _fmt(n), _fmt(v)] for p, n, v in zip(PARAMS, nominal, res.values, strict=True)]
    text = "\n".join([f"calibration from {len(pairs)} {kind} "
                      f"({'per-step' if per_step else 'total'} cycles), rank {res.rank}",
                      table(["constant", "device", "fitted"], rows_), _residual_lines(res)])
    return text, res


def plot(res: Fit, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    m = np.maximum(res.measured, 1.0)
    ax.loglog(m, np.maximum(res.fitted, 1.0), ".", ms=3)
    ax.plot([m.min(), m.max()], [m.min(), m.max()], "k-", lw=0.5)
    ax.set_xlabel("measured step cycles")
    ax.set_ylabel("fitted step cycles")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(packages: Sequence[Package] | None = None, out_dir: Path = ARTIFACTS,
         result_dirs: Sequence[str] = ()) -> str:
    """Run the calibration; returns the text written to out_dir/calibrate.txt."""
    setup()
    pkgs = list(packages) if packages is not None else build_packages()
    if result_dirs:
        text, res = measured(result_dirs, pkgs)
        title = "calibration from saved results"
    else:
        text, res, nominal = synthetic(pkgs)
        text += "\n" + seed_comparison(pkgs, nominal)
        title = "SYNTHETIC: perturbed-device simulations, per step"
    print(text)
    publish("calibrate", "Step-level calibration (" + title + ")", text, out_dir)
    plot(res, out_dir / "calibrate.png", title)
    return text


def _cli(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--packages", nargs="+", default=None,
                   help="saved package directories (default: build the MODELS baselines)")
    p.add_argument("--from", dest="results", nargs="+", default=(),
                   help="hardware result directories (simulator.hardware) to fit instead")
    p.add_argument("--out", default=str(ARTIFACTS), help="artifacts directory")
    args = p.parse_args(argv)
    pkgs = [load_package(d) for d in args.packages] if args.packages else None
    if args.results and pkgs is None:
        p.error("--from needs --packages (the packages the results were run from)")
    main(pkgs, Path(args.out), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
