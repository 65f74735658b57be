"""How do the baseline's cycles, roofline fraction, peak tile bytes and planning
time scale with layers, batch and device size?

Three sweeps, baseline only (`PipelineConfig(optimization_steps=0)`, default
policy), each point planned → built → verified → simulated timing-only:

- layers: LAYERS_MODEL at LAYERS on DEVICE_TILES tiles.  The encoder layers are
  one Repeat whose body is planned once, so planning time should be nearly
  flat in layers while cycles grow about linearly;
- batch: each model of BATCH_MODELS (model, layers) at batch 1, 2, 4, ... up to
  BATCH_MAX, stopping after the first batch that does not fit (its
  BuildFailure is the row);
- device: DEVICE_MODELS on user device TOMLs written to a temporary directory,
  the c600 tile (BASE_DEVICE) with TILES tiles.

Columns: result (`ok`, or `FAIL <stage>` with the whole BuildFailure line
printed under the table), cycles, fp8 roofline fraction (graph FLOPs /
(tiles × 2 × fp8 MACs/cycle × cycles)), peak tile bytes (max over tiles of
code + exchange tables + support + tensor range), plan s (wall seconds of
`planner.plan`, after one untimed warm-up plan so no row pays numba
compilation).  A point shared by two sweeps (same model, layers, batch,
tiles) is planned once and shown in both.

Planning is deterministic (no random draws), so there is no seed.

Usage: python experiments/scaling.py [--small] [--out-dir DIR]
Writes DIR/scaling.txt (the printed table) and DIR/scaling.png (log-scale
plots of each measure per sweep).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.common import publish
from experiments.common import setup as configure_runtime
from kernels.exceptions import BuildFailure
from planner.build.stages import peak_tile_bytes
from planner.ir.models import load_model
from planner.pipeline import plan
from planner.report import roofline_fraction
from planner.search.incumbent import PipelineConfig
from simulator.device import Device, load_device
from simulator.tables import markdown


@dataclass(frozen=True)
class Setup:
    """What one run sweeps (the full and the small variant differ only here)."""

    layers_model: str
    layers: tuple[int, ...]
    batch_models: tuple[tuple[str, int], ...]
    batch_max: int
    device_models: tuple[tuple[str, int], ...]
    tiles: tuple[int, ...]
    device_tiles: int  # tiles of the device the layers and batch sweeps run on
    warmup: tuple[str, int] = ("vit-tiny", 1)


BASE_DEVICE = "c600"
FULL = Setup(
    layers_model="siglip-so400m", layers=(1, 2, 4, 8, 27),
    batch_models=(("vit-tiny", 2), ("pe-core-l14", 24)), batch_max=16,
    device_models=(("siglip-so400m", 1), ("siglip-so400m", 27)), tiles=(368, 736, 1472),
    device_tiles=1472,
)
# the small variant (tests): vit-tiny on 32-tile devices, two points a sweep; one tile
# does not hold its parameters (an instant expand failure)
SMALL = Setup(
    layers_model="vit-tiny", layers=(1, 2),
    batch_models=(("vit-tiny", 1),), batch_max=2,
    device_models=(("vit-tiny", 1),), tiles=(1, 32),
    device_tiles=32,
)
OUT_DIR = Path("artifacts")
COMMAND = "python experiments/scaling.py"


@dataclass(frozen=True)
class Point:
    """One planned point; `failure` is the BuildFailure line ('' if it built)."""

    model: str
    layers: int
    batch: int
    tiles: int
    cycles: int = 0
    roofline: float = 0.0
    peak_bytes: int = 0
    seconds: float = 0.0
    failure: str = ""
    stage: str = ""
    tile: int = -1

    @property
    def ok(self) -> bool:
        return not self.failure


def device_toml(tiles: int, directory: Path) -> Path:
    """Write BASE_DEVICE's tile with `tiles` tiles as a user device TOML (a
    device that inherits everything else from the preset)."""
    path = directory / f"{BASE_DEVICE}-{tiles}.toml"
    path.write_text(f'name = "{BASE_DEVICE}-{tiles}"\nbase = "{BASE_DEVICE}"\n'
                    f"tiles = {tiles}\n")
    return path


class Planner:
    """Plans points on the temp-dir devices, each (model, layers, batch, tiles) once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.devices: dict[int, Device] = {}
        self.points: dict[tuple[str, int, int, int], Point] = {}

    def device(self, tiles: int) -> Device:
        if tiles not in self.devices:
            self.devices[tiles] = load_device(device_toml(tiles, self.directory))
        return self.devices[tiles]

    def point(self, model: str, layers: int, batch: int, tiles: int) -> Point:
        key = (model, layers, batch, tiles)
        if key not in self.points:
            self.points[key] = self._measure(*key)
            print(f"  {key}: {self.points[key].failure or 'ok'}", file=sys.stderr, flush=True)
        return self.points[key]

    def _measure(self, model: str, layers: int, batch: int, tiles: int) -> Point:
        device = self.device(tiles)
        graph = load_model(model, layers=layers, batch=batch)
        t0 = time.perf_counter()
        try:
            res = plan(graph, device, PipelineConfig(optimization_steps=0))
        except BuildFailure as e:
            return Point(model, layers, batch, tiles, seconds=time.perf_counter() - t0,
                         failure=" ".join(str(e).split()), stage=e.stage, tile=e.tile)
        secs = time.perf_counter() - t0
        return Point(model, layers, batch, tiles, cycles=res.cycles,
                     roofline=roofline_fraction(graph, device, res.cycles),
                     peak_bytes=peak_tile_bytes(res.package), seconds=secs)


def sweep(setup: Setup, pl: Planner) -> list[tuple[str, Point]]:
    """(sweep name, point) rows in table order."""
    rows = [("layers", pl.point(setup.layers_model, n, 1, setup.device_tiles))
            for n in setup.layers]
    for model, layers in setup.batch_models:
        b = 1
        while b <= setup.batch_max:
            p = pl.point(model, layers, b, setup.device_tiles)
            rows.append(("batch", p))
            if not p.ok:
                break
            b *= 2
    rows += [("device", pl.point(model, layers, 1, t))
             for model, layers in setup.device_models for t in setup.tiles]
    return rows


def _secs(s: float) -> str:
    """Wall seconds: one decimal, two below a second (small-variant plans)."""
    return f"{s:.1f}" if s >= 1 else f"{s:.2f}"


HEADER = ("sweep", "model", "layers", "batch", "tiles", "result", "cycles", "fp8 roofline",
          "peak tile bytes", "plan s")


def cells(name: str, p: Point) -> tuple[str, ...]:
    head = (name, p.model, str(p.layers), str(p.batch), str(p.tiles))
    if not p.ok:
        return (*head, f"FAIL {p.stage}", "-", "-", "-", _secs(p.seconds))
    return (*head, "ok", f"{p.cycles:,}", f"{100 * p.roofline:.2f}%", f"{p.peak_bytes:,}",
            _secs(p.seconds))


def report(rows: Sequence[tuple[str, Point]]) -> str:
    """Title, markdown table, the failure lines and the reproduce line."""
    lines = [f"baseline scaling, {BASE_DEVICE} tile (optimization_steps=0)", "",
             markdown(HEADER, [cells(n, p) for n, p in rows])]
    fails = list(dict.fromkeys(p for _, p in rows if not p.ok))
    if fails:
        lines.append("")
        lines += [f"- {p.model} {p.layers}L b{p.batch} {p.tiles} tiles: {p.failure}"
                  for p in fails]
    lines += ["", f"reproduce: {COMMAND}"]
    return "\n".join(lines)


def plot(rows: Sequence[tuple[str, Point]], path: Path) -> None:
    """One column per sweep (x: layers, batch, tiles; log-log), one row per
    measure; each model is a line; failed points are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = (("layers", "layers", lambda p: p.layers), ("batch", "batch", lambda p: p.batch),
              ("device", "tiles", lambda p: p.tiles))
    measures = (("cycles", lambda p: p.cycles), ("fp8 roofline %", lambda p: 100 * p.roofline),
                ("peak tile bytes", lambda p: p.peak_bytes), ("plan s", lambda p: p.seconds))
    fig, axes = plt.subplots(len(measures), len(sweeps), figsize=(12, 11), squeeze=False)
    for j, (name, xlabel, xof) in enumerate(sweeps):
        pts = [p for n, p in rows if n == name and p.ok]
        series = dict.fromkeys((p.model, p.layers if name != "layers" else 0) for p in pts)
        for i, (ylabel, yof) in enumerate(measures):
            ax = axes[i][j]
            for model, layers in series:
                sel = [p for p in pts if p.model == model
                       and (name == "layers" or p.layers == layers)]
                label = model if name == "layers" else f"{model} {layers}L"
                ax.plot([xof(p) for p in sel], [yof(p) for p in sel], "o-", label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            if i == 0 and series:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="run the SMALL setup")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    configure_runtime()
    setup = SMALL if args.small else FULL
    with tempfile.TemporaryDirectory(prefix="tileplan-scaling-") as tmp:
        pl = Planner(Path(tmp))
        pl._measure(*setup.warmup, 1, setup.device_tiles)  # numba compiles once, untimed
        rows = sweep(setup, pl)
    text = report(rows)
    print(text)
    publish("scaling", "Scaling with layers, batch and tiles", text, args.out_dir,
            markdown=True)
    plot(rows, args.out_dir / "scaling.png")
    return text


if __name__ == "__main__":
    main()
