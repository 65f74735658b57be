"""The `tileplan` command line (console script and `python -m planner`).

Adding a subcommand = one handler function decorated with `@command`:

    @command("simulate", "run a package in the simulator",
             arg("package", help="package directory"), *DEVICE_ARGS)
    def cmd_simulate(args: argparse.Namespace) -> int:
        ...
        return 0            # the exit status

Handlers stay thin (parse → call the library → print).  Errors are handled in
one place, `main`: a `TileplanError` prints one line `tileplan: error: <msg>`
to stderr and exits with `exit_status(error)` — 2 for ConfigError,
Unsupported and GraphError (bad input), 3 for BuildFailure, 1 for
PackageInvalid, SimulationFault and any other TileplanError.  Argument
errors are argparse's (exit 2).  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.exceptions import (
    BuildFailure,
    ConfigError,
    GraphError,
    TileplanError,
    Unsupported,
)

Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Arg:
    """The arguments of one `ArgumentParser.add_argument` call."""

    flags: tuple[str, ...]
    options: tuple[tuple[str, Any], ...]


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, tuple(options.items()))


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    args: tuple[Arg, ...]
    handler: Handler


COMMANDS: list[Command] = []  # in definition order: the order `--help` lists them


def command(name: str, help: str, *args: Arg) -> Callable[[Handler], Handler]:
    """Register `handler` as subcommand `name` with the given arguments."""

    def register(handler: Handler) -> Handler:
        if any(c.name == name for c in COMMANDS):
            raise ValueError(f"subcommand {name!r} registered twice")
        COMMANDS.append(Command(name, help, tuple(args), handler))
        return handler

    return register


# argument groups shared by several subcommands
MODEL_ARGS = (
    arg("--layers", type=int, default=None, help="override the number of encoder layers"),
    arg("--batch", type=int, default=None, help="override the images per batch"),
)
DEVICE_ARGS = (arg("--device", default="c600", help="device preset name or TOML path"),)


def exit_status(error: TileplanError) -> int:
    """Exit status for a domain error (module docstring)."""
    if isinstance(error, (ConfigError, Unsupported, GraphError)):
        return 2
    if isinstance(error, BuildFailure):
        return 3
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tileplan",
        description="Plan, build and simulate ViT models on IPU-class many-tile accelerators.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for a in cmd.args:
            p.add_argument(*a.flags, **dict(a.options))
        p.set_defaults(handler=cmd.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except TileplanError as e:
        message = " ".join(str(e).split())  # one line, whatever the message holds
        print(f"tileplan: error: {message}", file=sys.stderr)
        return exit_status(e)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Plain fixed-width table: first column left-aligned, the rest right."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:],
                                                                      strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------- subcommands


@command("devices", "list the device presets, or show one device TOML",
         arg("path", nargs="?", help="a device TOML file (or preset name) to show in full"))
def cmd_devices(args: argparse.Namespace) -> int:
    from simulator.device import Device, load_device, preset_names

    def row(d: Device) -> list[object]:
        return [d.name, d.tiles, f"{d.memory_size // 1024} KiB", f"{d.clock_hz / 1e9:.3g} GHz",
                f"{d.peak_fp8_flops / 1e12:.1f}"]

    header = ["device", "tiles", "memory/tile", "clock", "fp8 peak TFLOP/s"]
    if args.path is None:
        print(_table(header, [row(load_device(n)) for n in preset_names()]))
        return 0
    dev = load_device(args.path)
    print(_table(header, [row(dev)]))
    print()
    fields = sorted(dev.to_dict().items())
    print(_table(["field", "value"], [(k, hex(v) if k == "memory_base" else v) for k, v in fields]))
    return 0


@command("models", "list the model zoo, or show one model TOML",
         arg("path", nargs="?", help="a model TOML file (or zoo name) to show"), *MODEL_ARGS)
def cmd_models(args: argparse.Namespace) -> int:
    from planner.graph import graph_flops, parameter_count
    from planner.models import load_model, zoo_names

    names = zoo_names() if args.path is None else [args.path]
    rows = []
    for name in names:
        g = load_model(name, layers=args.layers, batch=args.batch)
        a = dict(g.attrs)
        batch = g.attr_int("batch")
        rows.append([g.name, a["hidden"], a["heads"], a["mlp"], a["patch"], a["tokens"],
                     a["layers"], batch, f"{parameter_count(g):,}",
                     f"{graph_flops(g) / batch / 1e9:.2f}"])
    print(_table(["model", "hidden", "heads", "mlp", "patch", "tokens", "layers", "batch",
                  "parameters", "GFLOP/image"], rows))
    return 0


@command("reference", "run the numpy reference forward of a model and print statistics",
         arg("model", help="zoo name or model TOML path"), *MODEL_ARGS,
         arg("--seed", type=int, default=0,
             help="parameter seed (inputs use seed+1); default 0"),
         arg("--precision", choices=("fp8", "fp32"), default="fp8",
             help="fp8: the deployable graph; fp32: every tensor fp32"))
def cmd_reference(args: argparse.Namespace) -> int:
    from planner.models import load_model
    from planner.reference import init_inputs, init_params, reference

    t0 = time.perf_counter()
    g = load_model(args.model, layers=args.layers, batch=args.batch, precision=args.precision)
    params = init_params(g, seed=args.seed)
    inputs = init_inputs(g, seed=args.seed + 1)
    t1 = time.perf_counter()
    outputs = reference(g, params, inputs)
    t2 = time.perf_counter()
    a = dict(g.attrs)
    print(f"model {g.name}: layers {a['layers']}, batch {a['batch']}, precision "
          f"{args.precision}, seed {args.seed}")
    rows = []
    for name, y in outputs.items():
        y64 = y.astype(np.float64)
        rows.append([name, "x".join(map(str, y.shape)), f"{y64.mean():.6g}", f"{y64.std():.6g}",
                     f"{y64.min():.6g}", f"{y64.max():.6g}", int(np.isnan(y).sum())])
    print(_table(["output", "shape", "mean", "std", "min", "max", "nan"], rows))
    print(f"time: setup (graph + init) {t1 - t0:.2f} s, forward {t2 - t1:.2f} s")
    return 0


# ---------------------------------------------------------------- plan / run / report
# (planner back end: planner.pipeline and planner.report do the work)

PLAN_ARGS = (
    arg("model", nargs="?", default="vit-tiny", help="zoo name or model TOML path (vit-tiny)"),
    *DEVICE_ARGS,
    *MODEL_ARGS,
    arg("--optimization-steps", type=int, default=8,
        help="proposals the optimizer may evaluate (0 = baseline only); default 8"),
    arg("--operator-candidate-limit", type=int, default=8,
        help="catalogue shortlist length per op; default 8"),
    arg("--capacity-baseline", action="store_true",
        help="start from the capacity baseline policy instead of the default"),
    arg("--jobs", type=int, default=1, help="parallel speculative builds; default 1"),
    arg("--out", default=None, help="save the package and summary.json to this directory"),
    arg("--json", action="store_true", help="print the summary as one JSON object"),
)


def _note_cold_cache() -> None:
    """One stderr line when Numba has no cached code for these sources yet
    (`kernels.jit.COLD_CACHE`): the first plan or simulation then spends
    about a minute compiling, which would otherwise look like a hang."""
    import numba

    from kernels import jit

    if jit.COLD_CACHE:
        cache_dir = numba.config.CACHE_DIR  # type: ignore[attr-defined]
        print("tileplan: first run of this code: Numba compiles the kernel, simulator and "
              f"planner loops into {cache_dir} (about a minute on 2 cores; later runs "
              "load them)", file=sys.stderr)
        jit.COLD_CACHE = False  # compiled by the time this process asks again


def _plan_run(args: argparse.Namespace, numerics: bool) -> int:
    import json

    from planner.models import load_model
    from planner.optimize import LocalOptimizer, format_optimizer
    from planner.pipeline import PipelineConfig, run_model
    from planner.report import format_summary, save_run
    from simulator.device import load_device

    device = load_device(args.device)
    graph = load_model(args.model, layers=args.layers, batch=args.batch)
    cfg = PipelineConfig(optimization_steps=args.optimization_steps,
                         operator_candidate_limit=args.operator_candidate_limit,
                         capacity_baseline=args.capacity_baseline, jobs=args.jobs)
    _note_cold_cache()
    outcome = run_model(graph, device, cfg, numerics=numerics, optimizer=LocalOptimizer())
    if args.out:
        save_run(args.out, outcome.result.package, outcome.summary)
    if args.json:
        print(json.dumps(outcome.summary, sort_keys=True))
        return outcome.status
    for record in outcome.result.history:
        print(record.line())
    print(format_summary(outcome.summary))
    print(format_optimizer(outcome.summary))
    return outcome.status


@command("run", "plan, build, verify and simulate a model; compare with the reference",
         *PLAN_ARGS, arg("--no-numerics", action="store_true",
                         help="simulate timing only (no values, no reference comparison)"))
def cmd_run(args: argparse.Namespace) -> int:
    return _plan_run(args, numerics=not args.no_numerics)


@command("plan", "plan, build and verify a model (timing simulation only)", *PLAN_ARGS)
def cmd_plan(args: argparse.Namespace) -> int:
    return _plan_run(args, numerics=False)


@command("report", "print the summary of a saved run",
         arg("run", help="run directory written by --out (or its summary.json)"),
         arg("--json", action="store_true", help="print the summary as one JSON object"))
def cmd_report(args: argparse.Namespace) -> int:
    import json

    from planner.report import format_summary, load_summary

    summary = load_summary(args.run)
    print(json.dumps(summary, sort_keys=True) if args.json else format_summary(summary))
    return 0


@command("simulate", "run a saved package in the simulator (random params/inputs from --seed)",
         arg("package", help="package directory (package.json + arrays.npz)"),
         arg("--no-numerics", action="store_true", help="timing only (no values)"),
         arg("--engine", choices=("numba", "simpy"), default="numba",
             help="simulator engine: numba (default) or simpy (event-level twin, small "
                  "packages only)"),
         arg("--seed", type=int, default=0, help="seed of the random params and inputs"),
         arg("--trace", default=None, metavar="OUT.json",
             help="write a Chrome-trace / Perfetto JSON timeline of the run"),
         arg("--trace-tiles", default="", metavar="T,T,...",
             help="tiles whose compute busy spans the trace shows (at most 64)"),
         arg("--trace-unit", choices=("cycles", "us"), default="cycles",
             help="trace time unit: device cycles (default) or microseconds"))
def cmd_simulate(args: argparse.Namespace) -> int:
    from simulator import load_package, run
    from simulator.hardware import seeded_values

    pkg = load_package(args.package)
    params, inputs = seeded_values(pkg, args.seed) if not args.no_numerics else ({}, {})
    tiles = _tile_list(args.trace_tiles)
    _note_cold_cache()
    t0 = time.perf_counter()
    res = run(pkg, params=params, inputs=inputs, numerics=not args.no_numerics,
              engine=args.engine)
    seconds = time.perf_counter() - t0
    if args.trace:
        from simulator.trace import save_trace, trace_events

        try:
            trace = trace_events(pkg, res, tiles=tiles, unit=args.trace_unit)
        except ValueError as e:  # too many/unknown tiles, a program too long to trace
            raise ConfigError(args.package, "trace", str(e)) from None
        print(f"trace {save_trace(trace, args.trace)}: {len(trace['traceEvents'])} events")
    dev = pkg.device
    print(f"package {pkg.name} ({pkg.content_hash()[:12]}) on {dev.name}: "
          f"{pkg.n_steps} steps, {res.vertex_invocations} vertex invocations")
    print(f"cycles {res.cycles}  time {res.cycles / dev.clock_hz * 1e3:.4f} ms at "
          f"{dev.clock_hz / 1e9:g} GHz  (simulated in {seconds:.2f} s)")
    for name in sorted(res.outputs):
        out = res.outputs[name]
        print(f"output {name} {list(out.shape)}: max |value| {float(np.nanmax(np.abs(out))):.4g}")
    print(f"faults {res.n_faults}")
    for f in res.faults[:10]:
        print(f"  {f}")
    return 1 if res.n_faults else 0


@command("verify", "statically verify a saved package (exit 1 and one line if invalid)",
         arg("package", help="package directory (package.json + arrays.npz)"))
def cmd_verify(args: argparse.Namespace) -> int:
    from simulator import load_package, verify

    pkg = load_package(args.package)
    verify(pkg)
    print(f"ok: package {pkg.name} ({pkg.content_hash()[:12]}): {pkg.n_steps} steps, "
          f"{pkg.n_vertices} vertices, {pkg.n_transfers} transfers, {pkg.n_buffers} buffers, "
          f"{pkg.n_patches} patches")
    return 0


def _tile_list(text: str) -> list[int]:
    """`--trace-tiles 0,5,9` as ints; ConfigError naming the flag otherwise."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError("--trace-tiles", "trace-tiles", "comma-separated tile numbers",
                          text) from None


@command("crosscheck", "compare a recorded hardware result with a simulation of its package",
         arg("package", help="package directory the hardware ran"),
         arg("result", help="hardware result directory (simulator.hardware format)"),
         arg("--cycle-tolerance", type=float, default=None,
             help="exit 1 if |hw/sim cycles - 1| exceeds this"),
         arg("--rel-fro-tolerance", type=float, default=None,
             help="exit 1 if an output's relative Frobenius error exceeds this"),
         arg("--max-abs-tolerance", type=float, default=None,
             help="exit 1 if an output's max abs error exceeds this"),
         arg("--top", type=int, default=8, help="steps with the largest deviations to list"))
def cmd_crosscheck(args: argparse.Namespace) -> int:
    from simulator import load_package, run
    from simulator.hardware import crosscheck, load_hardware_result, seeded_values

    pkg = load_package(args.package)
    hw = load_hardware_result(args.result, pkg)
    seed = hw.value_seed
    numerics = bool(hw.outputs) and seed is not None
    params, inputs = seeded_values(pkg, seed) if seed is not None and numerics else ({}, {})
    sim = run(pkg, params=params, inputs=inputs, numerics=numerics)
    report = crosscheck(pkg, sim, hw, top=args.top)
    print(report.text())
    if hw.outputs and not numerics:
        print("outputs not compared: the result records no value_seed")
    bad = report.violations(args.cycle_tolerance, args.rel_fro_tolerance, args.max_abs_tolerance)
    if sim.n_faults:
        bad.append(f"simulation recorded {sim.n_faults} fault(s): {sim.faults[0]}")
    for b in bad:
        print(f"outside tolerance: {b}")
    return 1 if bad else 0
