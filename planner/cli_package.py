"""The `tileplan` subcommands that read a saved package or a measurements
file: simulate, verify, crosscheck, calibrate and cost (registered with
planner.cli's `@command` when planner.cli is imported, after its own, so
`--help` lists them last, as before they moved here)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np

from planner.cli import (
    DEVICE_ARGS,
    JSON_ARG,
    _note_cold_cache,
    _print_json,
    arg,
    command,
    count,
    finite,
    writable_file,
)
from tilecommon.errors import ConfigError


@command("simulate", "run a saved package in the simulator (random params/inputs from --seed)",
         arg("package", help="package directory (package.json + arrays.npz)"),
         arg("--no-numerics", action="store_true", help="timing only (no values)"),
         arg("--engine", choices=("numba", "simpy"), default="numba",
             help="simulator engine: numba (default) or simpy (event-level twin, small "
                  "packages only)"),
         arg("--seed", type=count(0), default=0, help="seed of the random params and inputs"),
         arg("--trace", default=None, metavar="OUT.json|OUT.pftrace",
             help="write a timeline of the run: OUT.pftrace = every tile in Perfetto's "
                  "protobuf format; otherwise Chrome-trace JSON of --trace-tiles"),
         arg("--trace-tiles", default="", metavar="T,T,...",
             help="tiles whose compute busy spans the trace shows (at most 64)"),
         arg("--trace-unit", choices=("cycles", "us"), default="cycles",
             help="trace time unit: device cycles (default) or microseconds"),
         arg("--no-verify", action="store_true",
             help="skip the static verification before the run (the engine still reports "
                  "every fault it meets)"), JSON_ARG,
         arg("--quiet", action="store_true", help="no progress bar on stderr"))
def cmd_simulate(args: argparse.Namespace) -> int:
    from planner.progress import stage_progress
    from simulator import load_package, run, verify
    from simulator.hardware import seeded_values

    chip = bool(args.trace) and str(args.trace).endswith(".pftrace")
    if args.trace:
        writable_file(args.trace, "--trace")
    if chip and args.trace_tiles:
        raise ConfigError("tileplan simulate", "--trace-tiles", "a .pftrace trace holds every "
                          "tile; --trace-tiles selects tiles of a JSON trace", args.trace_tiles)
    pkg = load_package(args.package)
    dev = pkg.device
    stages = ("verify",) * (not args.no_verify) + ("simulate",) + ("trace",) * bool(args.trace)
    with stage_progress(args, stages) as stage:
        if not args.no_verify:
            stage("verify")
            verify(pkg)
        params, inputs = seeded_values(pkg, args.seed) if not args.no_numerics else ({}, {})
        tiles = _tile_list(args.trace_tiles)
        _note_cold_cache()
        stage("simulate")
        t0 = time.perf_counter()
        res = run(pkg, params=params, inputs=inputs, numerics=not args.no_numerics,
                  engine=args.engine)
        seconds = time.perf_counter() - t0
        if args.trace:
            from tilecommon.files import writing

            stage("trace")
            try:
                if chip:
                    from simulator.chiptrace import write_chip_trace

                    with writing(args.trace, "--trace"):
                        ct = write_chip_trace(pkg, res, args.trace)
                    said = (f"trace {ct.path}: {ct.tiles} tiles, {ct.packets:,} packets "
                            f"({ct.tile_slices:,} tile slices), {ct.bytes / 1e6:.1f} MB; "
                            f"timestamps in ns at {dev.clock_hz / 1e9:g} GHz")
                else:
                    from simulator.trace import save_trace, trace_events

                    trace = trace_events(pkg, res, tiles=tiles, unit=args.trace_unit)
                    with writing(args.trace, "--trace"):
                        saved = save_trace(trace, args.trace)
                    said = f"trace {saved}: {len(trace['traceEvents'])} events"
            except ValueError as e:  # too many/unknown tiles, a program too long to trace
                raise ConfigError(args.package, "trace", str(e)) from None
    if args.trace and not args.json:
        print(said)
    if args.json:
        _print_json({
            "package": pkg.name, "package_hash": pkg.content_hash(), "device": dev.name,
            "engine": args.engine, "steps": pkg.n_steps,
            "vertex_invocations": res.vertex_invocations, "cycles": res.cycles,
            "time_ms": res.cycles / dev.clock_hz * 1e3, "simulate_seconds": seconds,
            "outputs": {n: {"shape": list(o.shape),
                            "max_abs": float(np.nanmax(np.abs(o))) if o.size else 0.0}
                        for n, o in sorted(res.outputs.items())},
            "faults": res.n_faults, "fault_messages": [str(f) for f in res.faults[:10]]})
        return 1 if res.n_faults else 0
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
         arg("package", help="package directory (package.json + arrays.npz)"), JSON_ARG)
def cmd_verify(args: argparse.Namespace) -> int:
    from simulator import load_package, verify

    pkg = load_package(args.package)
    verify(pkg)
    if args.json:
        _print_json({"ok": True, "package": pkg.name, "package_hash": pkg.content_hash(),
                     "steps": pkg.n_steps, "vertices": pkg.n_vertices,
                     "transfers": pkg.n_transfers, "buffers": pkg.n_buffers,
                     "patches": pkg.n_patches})
        return 0
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
         arg("--cycle-tolerance", type=finite, default=None,
             help="exit 1 if |hw/sim cycles - 1| exceeds this"),
         arg("--rel-fro-tolerance", type=finite, default=None,
             help="exit 1 if an output's relative Frobenius error exceeds this"),
         arg("--max-abs-tolerance", type=finite, default=None,
             help="exit 1 if an output's max abs error exceeds this"),
         arg("--top", type=count(1), default=8, help="steps with the largest deviations to list"),
         JSON_ARG)
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
    bad = report.violations(args.cycle_tolerance, args.rel_fro_tolerance, args.max_abs_tolerance)
    if sim.n_faults:
        bad.append(f"simulation recorded {sim.n_faults} fault(s): {sim.faults[0]}")
    if args.json:
        import dataclasses

        _print_json({**dataclasses.asdict(report), "cycle_ratio": report.cycle_ratio,
                     "outputs_compared": numerics, "faults": sim.n_faults,
                     "outside_tolerance": bad})
        return 1 if bad else 0
    print(report.text())
    if hw.outputs and not numerics:
        print("outputs not compared: the result records no value_seed")
    for b in bad:
        print(f"outside tolerance: {b}")
    return 1 if bad else 0


@command("calibrate", "fit a device's cost constants to a file of kernel measurements",
         arg("measurements", help="measurements TOML ([[measurement]] entries, e.g. "
                                  "simulator/calibration/ipu21.toml)"),
         arg("--device", default="c600", help="device to start from (preset or TOML); c600"),
         arg("--out", default=None, metavar="DEVICE.toml",
             help="write the fitted device TOML here (atomically)"),
         arg("--name", default=None, help="name of the fitted device (default: --out's stem)"),
         arg("--plot", default=None, metavar="PNG", help="draw measured vs modelled cycles"),
         arg("--window-days", type=count(0), default=3,
             help="a kernel's current version: measurements within this many days of its "
                  "newest (default 3)"),
         arg("--json", action="store_true", help="print the result as one JSON object"))
def cmd_calibrate(args: argparse.Namespace) -> int:
    import dataclasses
    import datetime
    import json

    from simulator.calibrate import calibrate, device_toml, format_report, plot, report_json
    from simulator.device import load_device
    from simulator.measurements import read_file, source_statement
    from tilecommon.files import write_text_atomic, writing

    for flag, value in (("--out", args.out), ("--plot", args.plot)):
        if value is not None:
            writable_file(value, flag)
    start = load_device(args.device)
    entries = read_file(args.measurements)
    cal = calibrate(entries, start, window_days=args.window_days)
    name = args.name or (Path(args.out).stem if args.out else f"{start.name}-fit")
    cal.device = dataclasses.replace(cal.device, name=name)
    if args.out:
        header = [f"{name}: {start.name} with its cost constants fitted to "
                  f"{Path(args.measurements).name}",
                  f"by `tileplan calibrate {args.measurements} --device {args.device} "
                  f"--out {args.out}` on {datetime.date.today().isoformat()}",
                  "(simulator/calibrate.py).  Each constant says what it is and where its "
                  "value came from:", "fitted to n measurements, a fact read from a dataset "
                  "entry, or kept from the starting device.",
                  *source_statement(args.measurements), ""]
        from simulator.calibrate import KEPT_SOURCES

        notes = {c.name: c.how if c.how != "kept" else
                 f"kept from {start.name}" + (f"; published: {KEPT_SOURCES[c.name]}"
                                              if c.name in KEPT_SOURCES else "")
                 for c in cal.changes}
        notes.update({k: v for k, v in cal.facts.items() if k == "kernel_image_bytes"})
        with writing(args.out, "--out"):
            write_text_atomic(Path(args.out), device_toml(cal.device, header, notes))
    if args.plot:
        with writing(args.plot, "--plot"):
            plot(cal, args.plot)
    if args.json:
        print(json.dumps(report_json(cal), sort_keys=True))
        return 0
    print(format_report(cal, args.measurements))
    if args.out:
        print(f"wrote {args.out}")
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


@command("cost", "modelled cycles of one kernel call (arguments by name)",
         arg("kernel", help="kernel name, any case (MATMUL, reduce, GELU, ...)"),
         arg("args", nargs="*", metavar="NAME=VALUE",
             help="kernel arguments by name (contracts §2), e.g. M=184 K=288 N=48 "
                  "in_dtype=fp16 (R and C, as in measurement files, are M and N); dtypes "
                  "by name; what is not given gets the planner's default, printed"),
         *DEVICE_ARGS,
         arg("--json", action="store_true", help="print the result as one JSON object"))
def cmd_cost(args: argparse.Namespace) -> int:
    import json

    from simulator.cost import call_parts, checked_call, kernel_cycles
    from simulator.device import load_device

    named: dict[str, object] = {}
    for text in args.args:
        key, eq, value = text.partition("=")
        if not eq or not key:
            raise ConfigError("tileplan cost", text, "arguments are NAME=VALUE")
        if key in named:
            raise ConfigError("tileplan cost", key, "given twice")
        named[key] = _arg_value(key, value)
    device = load_device(args.device)
    try:
        kernel, given, defaults = checked_call(device, args.kernel, **named)
        call, work, conflict = call_parts(device, kernel, **given)
        cycles = kernel_cycles(device, kernel, **given)
    except ValueError as e:
        raise ConfigError("tileplan cost", "args", str(e)) from None
    if args.json:
        print(json.dumps({"kernel": kernel, "device": device.name, "cycles": cycles,
                          "call": call, "work": work, "conflict": conflict,
                          "args": dict(named), "defaults": defaults}, sort_keys=True))
        return 0
    shown = " ".join(f"{k}={v}" for k, v in named.items()) or "(defaults)"
    filled = (" [defaults: " + " ".join(f"{k}={v}" for k, v in defaults.items()) + "]"
              if defaults else "")
    print(f"{kernel} {shown}{filled} on {device.name}: {cycles:,} cycles "
          f"(call {call:,} + work {work:,}{', operands conflict' if conflict else ''})")
    return 0


def _arg_value(key: str, text: str) -> object:
    """A NAME=VALUE value: an int (decimal or 0x), a finite float for
    eps/scale, or a dtype name."""
    if key in ("eps", "scale"):
        try:
            value = float(text)
        except ValueError:
            raise ConfigError("tileplan cost", key, "must be a number", text) from None
        if not math.isfinite(value):
            raise ConfigError("tileplan cost", key, "must be finite", text)
        return value
    if text in ("fp8", "fp16", "fp32"):
        return text
    try:
        return int(text, 0)
    except ValueError:
        raise ConfigError("tileplan cost", key, "must be an integer or a dtype name",
                          text) from None
