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
errors are one line too (exit 2); numbers are checked where they are parsed
(`count`, `finite`: a negative seed or a NaN tolerance never reaches the
library).  Paths the command will write (`--out`, `--trace`, `--plot`) are
checked before any work.  Ctrl-C prints one line and exits 130; a closed
pipe (`tileplan devices | head -1`) ends quietly.  Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilecommon.errors import (
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


def count(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= `low`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low} (got {value})")
        return value
    parse.__name__ = f"integer >= {low}"
    return parse


def finite(text: str) -> float:
    """argparse type: a finite number >= 0 (a tolerance)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got {text})")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse whose errors reach `main` as a ConfigError (one line, exit 2)
    instead of a usage screen."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        flag, sep, what = message.partition(": ")
        if flag.startswith("argument ") and sep:
            raise ConfigError(self.prog, flag.removeprefix("argument "), what)
        raise ConfigError(self.prog, "arguments", message)


def writable_file(path: str, flag: str, protect: Sequence[Path] = ()) -> None:
    """ConfigError unless `path` can be written as a file (tilecommon.files.
    check_output_file: checked before any work), and is none of, nor inside
    any directory of, `protect` (the run a report reads)."""
    from tilecommon.files import check_output_file

    target = check_output_file(path, flag)
    for p in protect:
        p = Path(os.path.abspath(p))
        if target == p or p in target.parents:
            raise ConfigError(path, flag, f"would overwrite the run's own {p.name}")


# argument groups shared by several subcommands
MODEL_ARGS = (
    arg("--layers", type=count(1), default=None, help="override the number of encoder layers"),
    arg("--batch", type=count(1), default=None, help="override the images per batch"),
    arg("--tokens", type=count(1), default=None,
        help="override the sequence length (a text model's tokens, a tower's patches)"),
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
    parser = _Parser(
        prog="tileplan",
        description="Plan, build and simulate transformer models (ViT towers, BERT encoders, "
                    "decoder-only LLMs) on IPU-class many-tile accelerators.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=_Parser)
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for a in cmd.args:
            p.add_argument(*a.flags, **dict(a.options))
        p.set_defaults(handler=cmd.handler)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so that every atomic
    write and every worker pool cleans up on the way out."""


def _native_reentry(frame: Any) -> bool:
    """Whether the innermost Python frame is Numba's, entered from native
    code (a jitted function boxing its result calls numba's unpickler): an
    exception raised there is not checked by the caller, which then crashes."""
    if frame is None or not frame.f_globals.get("__name__", "").startswith("numba."):
        return False
    caller = frame.f_back
    return caller is None or not caller.f_globals.get("__name__", "").startswith("numba.")


def _raise_for(exc: type[KeyboardInterrupt]) -> Any:
    """A signal handler raising `exc` in the main thread, or, while a jitted
    function has re-entered Python (`_native_reentry`), the same signal again
    a moment later, once it has returned."""
    import signal
    import threading

    def handler(signum: int, frame: Any) -> None:
        if _native_reentry(frame):
            threading.Timer(0.02, signal.raise_signal, (signum,)).start()
            return
        raise exc()
    return handler


_terminate = _raise_for(Terminated)
_interrupt = _raise_for(KeyboardInterrupt)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it).
    Configures the numeric runtime (tilecommon.runtime) before any jitted module
    is imported.  SIGTERM unwinds like Ctrl-C (exit 143 instead of 130); once
    the command has finished, both are ignored, so a signal as the process
    ends cannot turn a finished run into a traceback."""
    import signal
    import threading

    from tilecommon.runtime import configure

    configure()
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        previous = signal.signal(signal.SIGTERM, _terminate)
        previous_int = signal.signal(signal.SIGINT, _interrupt)
    try:
        args = build_parser().parse_args(argv)
        # overflow and invalid values are the commands' to report (non-finite
        # outputs name their first element, saturation its tensors), not as
        # numpy warning lines between the results
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return int(args.handler(args))
    except TileplanError as e:
        message = " ".join(str(e).split())  # one line, whatever the message holds
        print(f"tileplan: error: {message}", file=sys.stderr)
        return exit_status(e)
    except Terminated:
        print("tileplan: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("tileplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): say nothing, and let the interpreter's
        # final flush of stdout go nowhere instead of raising again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except RuntimeError as e:
        # a signal that lands while a module is imported can come back wrapped
        # ("Error calling __set_name__" while a dataclass is made): it is still
        # the signal
        interrupt = _interrupt_in(e)
        if interrupt is None:
            raise
        terminated = isinstance(interrupt, Terminated)
        print(f"tileplan: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def _interrupt_in(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM an exception was raised from, if any."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        if isinstance(x, KeyboardInterrupt):
            return x
        seen.add(id(x))
        x = x.__cause__ or x.__context__
    return None


def console() -> None:
    """The `tileplan` console script: main, then exit without letting a late
    Ctrl-C or SIGTERM interrupt the interpreter's shutdown."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)  # main keeps it; a signal after main returns
    try:                                       # lands here, not in the default action
        status = main()
    except Terminated:
        status = 143
    except KeyboardInterrupt:
        status = 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if status in (130, 143):
        # the signal may have cut a library's constructor short (llvmlite's
        # ObjectRef, while Numba loads a function): its __del__ then fails as
        # the interpreter shuts down, "Exception ignored ..." after our one line
        sys.unraisablehook = lambda _unraisable: None
    sys.stdout.flush()
    sys.exit(status)


JSON_ARG = arg("--json", action="store_true", help="print the result as one JSON object")


def _print_json(obj: Any) -> None:
    import json

    print(json.dumps(obj, sort_keys=True, default=str))


def _table(header: Sequence[str], rows: Sequence[Sequence[object]],
           left: Sequence[int] = (0,)) -> str:
    from tilecommon.tables import table

    return table(header, rows, left)


# ---------------------------------------------------------------- subcommands


@command("devices", "list the device presets, or show one device TOML",
         arg("path", nargs="?", help="a device TOML file (or preset name) to show in full"),
         arg("--json", action="store_true", help="print the device as one JSON object"))
def cmd_devices(args: argparse.Namespace) -> int:
    import json

    from simulator.device import Device, load_device, preset_names

    def row(d: Device) -> list[object]:
        return [d.name, d.tiles, f"{d.memory_size // 1024} KiB", f"{d.clock_hz / 1e9:.3g} GHz",
                f"{d.peak_fp8_flops / 1e12:.1f}"]

    header = ["device", "tiles", "memory/tile", "clock", "fp8 peak TFLOP/s"]
    if args.path is None:
        devs = [load_device(n) for n in preset_names()]
        if args.json:
            print(json.dumps([d.to_dict() for d in devs], sort_keys=True))
        else:
            print(_table(header, [row(d) for d in devs]))
        return 0
    from simulator.device import COST_DOCS

    dev = load_device(args.path)
    d = dev.to_dict()
    costs = d.pop("costs")
    images = costs.pop("kernel_image_bytes")
    if args.json:
        print(json.dumps(dev.to_dict(), sort_keys=True))
        return 0
    print(_table(header, [row(dev)]))
    print()
    print(_table(["field", "value"], [(k, hex(v) if k == "memory_base" else v)
                                      for k, v in d.items()]))
    print()
    print(_table(["cost constant", "value", "meaning"],
                 [(k, v, COST_DOCS[k]) for k, v in costs.items()]))
    print()
    print(_table(["kernel image", "bytes"], list(images.items())))
    return 0


@command("models", "list the model zoo, or show one model TOML",
         arg("path", nargs="?", help="a model TOML file (or zoo name) to show"), *MODEL_ARGS,
         arg("--parameters", action="store_true",
             help="list the model's parameters (the names and shapes a --weights file in our "
                  "naming holds)"),
         JSON_ARG)
def cmd_models(args: argparse.Namespace) -> int:
    from planner.ir.graph import graph_flops, model_parameter_count
    from planner.ir.models import load_model, zoo_names

    if args.parameters:
        if args.path is None:
            raise ConfigError("--parameters", "--parameters", "lists one model's parameters: "
                              "give its name or TOML")
        g = load_model(args.path, layers=args.layers, batch=args.batch, tokens=args.tokens)
        prows = [[p, "x".join(str(d) for d in g.tensor(p).shape), g.tensor(p).dtype,
                  f"{int(np.prod(g.tensor(p).shape)):,}"] for p in sorted(g.parameters)]
        if args.json:
            _print_json([{"name": r[0], "shape": list(g.tensor(r[0]).shape), "dtype": r[2]}
                         for r in prows])
            return 0
        print(_table(["parameter", "shape", "dtype", "values"], prows, left=(0, 1, 2)))
        print(f"{len(prows)} parameters of {g.name} ({g.attr_int('layers')} layer(s); "
              "per-layer ones are layers.<name>, stacked [L, ...])")
        return 0
    names = zoo_names() if args.path is None else [args.path]
    rows = []
    for name in names:
        g = load_model(name, layers=args.layers, batch=args.batch, tokens=args.tokens)
        a = dict(g.attrs)
        batch = g.attr_int("batch")
        kind = ("vit" if "patch" in a else "decoder" if a.get("attention") == "causal"
                else "encoder")
        rows.append([g.name, kind, a["hidden"], a["heads"], a["mlp"], a.get("patch", "-"),
                     a["tokens"], a["layers"], batch, f"{model_parameter_count(g):,}",
                     f"{graph_flops(g) / batch / 1e9:.2f}"])
    header = ["model", "kind", "hidden", "heads", "mlp", "patch", "tokens", "layers", "batch",
              "parameters", "GFLOP/sample"]
    if args.json:
        keys = [h.lower().replace("/", "_per_") for h in header]
        _print_json([{**dict(zip(keys, r, strict=True)),
                      "patch": r[5] if r[5] != "-" else None,
                      "parameters": int(str(r[9]).replace(",", "")),
                      "gflop_per_sample": float(str(r[10]))} for r in rows])
        return 0
    print(_table(header, rows))
    return 0


@command("reference", "run the numpy reference forward of a model and print statistics",
         arg("model", help="zoo name, model TOML or Hugging Face config.json (or its "
                                 "directory)"), *MODEL_ARGS,
         arg("--seed", type=count(0), default=0,
             help="parameter seed (inputs use seed+1); default 0"),
         arg("--precision", choices=("fp8", "fp16", "fp32"), default="fp8",
             help="fp8: the deployable graph; fp16: every operand fp16; fp32: every "
                  "tensor fp32"), JSON_ARG)
def cmd_reference(args: argparse.Namespace) -> int:
    from planner.ir.models import load_model
    from planner.ir.reference import init_inputs, init_params, reference

    t0 = time.perf_counter()
    g = load_model(args.model, layers=args.layers, batch=args.batch, tokens=args.tokens,
                   precision=args.precision)
    params = init_params(g, seed=args.seed)
    inputs = init_inputs(g, seed=args.seed + 1)
    t1 = time.perf_counter()
    outputs = reference(g, params, inputs)
    t2 = time.perf_counter()
    a = dict(g.attrs)
    if args.json:
        stats = {name: {"shape": list(y.shape), "mean": float(np.mean(y, dtype=np.float64)),
                        "std": float(np.std(y, dtype=np.float64)), "min": float(np.min(y)),
                        "max": float(np.max(y)), "nan": int(np.isnan(y).sum())}
                 for name, y in outputs.items()}
        _print_json({"model": g.name, "layers": a["layers"], "batch": a["batch"],
                     "precision": args.precision, "seed": args.seed, "outputs": stats,
                     "setup_seconds": t1 - t0, "forward_seconds": t2 - t1})
        return 0
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


@command("inspect", "the graph a model source imports to: fields, inputs and outputs, ops by "
                    "kind, parameters",
         arg("model", help="zoo name, model TOML or Hugging Face config.json (or its "
                           "directory)"), *MODEL_ARGS,
         arg("--precision", choices=("fp8", "fp16"), default="fp8",
             help="the graph's precision policy (as run and plan)"),
         arg("--ops", action="store_true", help="also list every op with its operands"),
         JSON_ARG)
def cmd_inspect(args: argparse.Namespace) -> int:
    from planner.ir.graph import Repeat, model_parameter_count
    from planner.ir.models import load_model

    g = load_model(args.model, layers=args.layers, batch=args.batch, tokens=args.tokens,
                   precision=args.precision)
    kinds: dict[str, list[int]] = {}  # kind -> [top-level ops, ops per layer]
    listed = []
    trips = 1
    for op in g.ops:
        if isinstance(op, Repeat):
            trips = op.trips
            for inner in op.body.ops:
                kinds.setdefault(inner.kind, [0, 0])[1] += 1
                listed.append((f"{op.name}/{inner.name}", inner, op.body))
            continue
        kinds.setdefault(op.kind, [0, 0])[0] += 1
        listed.append((op.name, op, g))
    by_dtype: dict[str, list[int]] = {}
    for p in g.parameters:
        t = g.tensor(p)
        n = by_dtype.setdefault(t.dtype, [0, 0])
        n[0] += t.size
        n[1] += t.size * {"fp8": 1, "fp16": 2, "fp32": 4}.get(t.dtype, 4)
    io = [(t.name, t.kind, list(t.shape), t.dtype) for t in g.tensors
          if t.kind == "input" or t.name in g.outputs]

    def operands(op: Any, graph: Any) -> str:
        shape = lambda n: "x".join(map(str, graph.tensor(n).shape))  # noqa: E731
        return (", ".join(f"{n} {shape(n)}" for n in op.inputs) + " -> "
                + ", ".join(f"{n} {shape(n)}" for n in op.outputs))

    doc: dict[str, Any] = {
        "model": g.name, "fields": {k: v for k, v in g.attrs},
        "io": [{"name": n, "kind": k, "shape": s, "dtype": d} for n, k, s, d in io],
        "ops": {k: {"top": v[0], "per_layer": v[1], "total": v[0] + v[1] * trips}
                for k, v in sorted(kinds.items())},
        "layers": trips, "parameters": model_parameter_count(g),
        "device_parameters": {d: {"values": v[0], "bytes": v[1]}
                              for d, v in sorted(by_dtype.items())},
        "host_parameters": g.attr_int("host_parameters") if g.attr("host_parameters") else 0}
    if str(args.model).endswith(".onnx"):  # which nodes each recognised part came from
        from planner.ir.onnx_import import onnx_model

        imported = onnx_model(args.model)
        doc["onnx"] = {"op_types": imported.op_types, "provenance": imported.provenance}
    if args.ops:
        doc["op_list"] = [{"name": n, "kind": op.kind, "operands": operands(op, graph)}
                          for n, op, graph in listed]
    if args.json:
        _print_json(doc)
        return 0
    print(f"model {g.name}: " + ", ".join(f"{k} {v}" for k, v in g.attrs
                                           if k not in ("model", "host_parameters")))
    print(_table(["tensor", "kind", "shape", "dtype"],
                 [[n, k, "x".join(map(str, s)), d] for n, k, s, d in io], left=(0, 1, 2, 3)))
    print(_table(["op kind", "outside layers", "per layer", f"total ({trips} layers)"],
                 [[k, v["top"], v["per_layer"], v["total"]] for k, v in doc["ops"].items()],
                 left=(0,)))
    dev = ", ".join(f"{d} {v[0]:,} values ({v[1]:,} bytes)" for d, v in sorted(by_dtype.items()))
    print(f"parameters {doc['parameters']:,} (on the device: {dev}; on the host: "
          f"{doc['host_parameters']:,})")
    if "onnx" in doc:
        prov = doc["onnx"]["provenance"]
        print(f"from {sum(doc['onnx']['op_types'].values())} ONNX nodes "
              f"({', '.join(f'{k} {v}' for k, v in doc['onnx']['op_types'].items())}); "
              "the hidden path's, by part:")
        print(_table(["part", "nodes", "first node"],
                     [[role, len(nodes), nodes[0]] for role, nodes in prov.items()],
                     left=(0, 2)))
    if args.ops:
        print(_table(["op", "kind", "operands"],
                     [[r["name"], r["kind"], r["operands"]] for r in doc["op_list"]],
                     left=(0, 1, 2)))
    return 0


# ---------------------------------------------------------------- plan / run / report
# (planner back end: planner.pipeline and planner.report do the work)

PLAN_ARGS = (
    arg("model", nargs="?", default="vit-tiny",
        help="zoo name, model TOML or Hugging Face config.json / its directory (vit-tiny)"),
    *DEVICE_ARGS,
    *MODEL_ARGS,
    arg("--precision", choices=("fp8", "fp16"), default="fp8",
        help="fp8: the measured policy (fp8 projections and MLP, fp16 activations and QK; "
             "default); fp16: every operand fp16"),
    arg("--optimization-steps", type=count(0), default=8,
        help="proposals the optimizer may evaluate (0 = baseline only); default 8"),
    arg("--operator-candidate-limit", type=count(1), default=8,
        help="catalogue shortlist length per op; default 8"),
    arg("--baseline", default="default", metavar="NAME",
        help="baseline policy: default, element, capacity or a registered one "
             "(tileplan extensions)"),
    arg("--optimizer", default="local", metavar="NAME",
        help="optimizer: local (default), none or a registered one"),
    arg("--proposals", default="", metavar="KIND,...",
        help="proposal kinds the optimizer may use (default: the built-in kinds)"),
    arg("--jobs", type=count(1), default=1,
        help="processes for speculative builds; default 1 (on 2 cores a plan whose "
             "proposals are mostly accepted gains nothing: docs/results.md, bench_optimizer)"),
    arg("--out", default=None, help="save the package and summary.json to this directory"),
    arg("--json", action="store_true", help="print the summary as one JSON object"),
    arg("--quiet", action="store_true", help="no progress bar on stderr"),
    arg("--report", default=None, metavar="OUT.html",
        help="also write the run's HTML profile (tileplan report --html)"),
    arg("--weights", default=None, metavar="FILE",
        help=".npz or .safetensors parameters, our names or Hugging Face / big_vision "
             "SigLIP names (docs/weights.md); default: the seeded init"),
    arg("--scales", choices=("fixed", "data"), default=None,
        help="fp8 scales: the model's fixed ones, or chosen from the weights and a "
             "calibration forward; default data with --weights, fixed without"),
    arg("--constraints", default=None, metavar="FILE.toml",
        help="pin decisions of the plan (recipes, casts, boundaries, fusion, shifts, "
             "packing; docs/constraints.md); a saved plan (--save-plan) replays whole"),
    arg("--save-plan", default=None, metavar="FILE.toml",
        help="write every decision of the final plan in the constraints grammar"),
)


def _note_cold_cache() -> None:
    """One stderr line when Numba has no cached code for these sources yet
    (`tilecommon.runtime.RUNTIME.cold`): the first plan or simulation then
    spends minutes compiling, which would otherwise look like a hang."""
    from tilecommon.runtime import RUNTIME

    if RUNTIME.cold:
        from tilecommon.runtime import COMPILE_NOTE

        print("tileplan: " + COMPILE_NOTE.format(dir=RUNTIME.cache_dir), file=sys.stderr)
        RUNTIME.cold = False  # compiled by the time this process asks again


def _plan_run(args: argparse.Namespace, numerics: bool, no_numerics_why: str = "") -> int:
    import json

    from planner.ir.models import load_model
    from planner.pipeline import RUN_STAGES, check_names, model_values, run_model
    from planner.progress import proposal_progress, stage_progress
    from planner.report import check_run_dir, format_summary, save_run
    from planner.search.incumbent import PipelineConfig
    from planner.search.optimize import format_optimizer
    from simulator.device import load_device

    if args.out:
        check_run_dir(args.out)  # a bad path fails before the planning, not after
    if args.report:
        writable_file(args.report, "--report")
    if args.save_plan:
        writable_file(args.save_plan, "--save-plan")
    constraints = None
    if args.constraints:
        from planner.decide.constraints import load_constraints

        constraints = load_constraints(args.constraints)
    device = load_device(args.device)
    graph = load_model(args.model, layers=args.layers, batch=args.batch, tokens=args.tokens,
                       precision=args.precision)
    weights = args.weights
    inputs, also = None, None
    if str(args.model).endswith(".onnx"):
        from planner.ir.onnx_import import onnx_model
        from planner.ir.onnx_reference import ort_check, ort_inputs, our_outputs

        weights = weights or args.model  # an ONNX model brings its initializers
        if numerics:  # onnxruntime runs the file on the same tokens: its own answer
            inputs, feed = ort_inputs(onnx_model(args.model), graph, seed=1)
            also = ort_check(args.model, feed, our_outputs(onnx_model(args.model), graph))
    graph, raw = model_values(graph, weights, args.scales, inputs=inputs)
    kinds = tuple(k.strip() for k in args.proposals.split(",") if k.strip())
    cfg = PipelineConfig(optimization_steps=args.optimization_steps,
                         operator_candidate_limit=args.operator_candidate_limit,
                         baseline=args.baseline, optimizer=args.optimizer, proposals=kinds,
                         jobs=args.jobs, constraints=constraints)
    check_names(cfg)  # an unknown name fails before any work
    _note_cold_cache()
    try:
        stages = RUN_STAGES if numerics else RUN_STAGES[:1]
        with (stage_progress(args, stages) as on_stage,
              proposal_progress(args, cfg.optimization_steps) as on_record):
            outcome = run_model(graph, device, cfg, numerics=numerics, on_record=on_record,
                                on_stage=on_stage, params=raw, inputs=inputs, also=also)
        if not numerics:
            outcome.summary["numerics_note"] = f"not computed ({no_numerics_why})"
        if args.constraints:
            outcome.summary["constraints"] = str(args.constraints)
    except BuildFailure as e:
        if args.report:  # the report of the failing stage, then the usual one line
            from planner.html_report import render_failure
            from tilecommon.files import write_text_atomic, writing

            with writing(args.report, "--report"):
                write_text_atomic(args.report, render_failure(
                    e, f"tileplan: {graph.name} on {device.name}", device.memory_size))
        raise
    from planner.decide.constraints import plan_toml

    if args.out:
        from tilecommon.files import writing

        with writing(args.out, "--out"):
            save_run(args.out, outcome.result.package, outcome.summary,
                     plan_toml(outcome.result.plan, _plan_header(graph, device, outcome)))
    if args.report:
        _write_html(args.report, outcome.result.package, outcome.summary, None)
    if args.save_plan:
        from tilecommon.files import write_text_atomic, writing

        with writing(args.save_plan, "--save-plan"):
            write_text_atomic(args.save_plan, plan_toml(outcome.result.plan,
                                                        _plan_header(graph, device, outcome)))
    if args.json:
        print(json.dumps(outcome.summary, sort_keys=True))
        return outcome.status
    print(format_summary(outcome.summary))
    print(format_optimizer(outcome.summary))
    return outcome.status


def _plan_header(graph: Any, device: Any, outcome: Any) -> tuple[str, ...]:
    """The comment lines a saved plan starts with."""
    return (f"tileplan plan of {graph.name} ({graph.attr_int('layers')} layer(s), batch "
            f"{graph.attr_int('batch')}) on {device.name}: {outcome.result.cycles:,} cycles",
            f"package {outcome.result.package.content_hash()}",
            "replay: tileplan run MODEL --constraints THIS.toml --optimization-steps 0")


@command("run", "plan, build, verify and simulate a model; compare with the reference",
         *PLAN_ARGS, arg("--no-numerics", action="store_true",
                         help="simulate timing only (no values, no reference comparison)"))
def cmd_run(args: argparse.Namespace) -> int:
    return _plan_run(args, numerics=not args.no_numerics, no_numerics_why="--no-numerics")


@command("plan", "plan, build and verify a model (timing simulation only)", *PLAN_ARGS)
def cmd_plan(args: argparse.Namespace) -> int:
    return _plan_run(args, numerics=False,
                     no_numerics_why="plan simulates timing; tileplan run checks values")


@command("candidates", "list the recipes the catalogue offers each op, with estimates",
         arg("model", help="zoo name, model TOML or Hugging Face config.json (or its "
                                 "directory)"), *DEVICE_ARGS, *MODEL_ARGS,
         arg("--op", default="*", metavar="GLOB",
             help="ops (or fused groups) to list, by qualified name or glob; default all"),
         arg("--baseline", default="default", metavar="NAME",
             help="the baseline policy whose choices are marked; default default"),
         arg("--limit", type=count(1), default=8, help="recipes per op; default 8"),
         JSON_ARG)
def cmd_candidates(args: argparse.Namespace) -> int:
    from planner.decide.constraints import candidates
    from planner.ir.models import load_model
    from planner.search.context import PlanningContext
    from planner.search.policies import baseline_plan
    from simulator.device import load_device

    device = load_device(args.device)
    graph = load_model(args.model, layers=args.layers, batch=args.batch, tokens=args.tokens)
    ctx = PlanningContext()
    chosen = baseline_plan(graph, device, args.limit, args.baseline, ctx)
    rows = candidates(graph, device, chosen, args.op, args.limit, ctx.catalogue)
    if args.json:
        _print_json([c.as_dict() for c in rows])
        return 0
    print(_table(["op", "kind", "recipe", "estimate", "compute", "exchange", "bytes/tile",
                  "homes/tile", args.baseline],
                 [[c.op, c.kind, c.recipe, f"{c.cycles:,}", f"{c.compute_cycles:,}",
                   f"{c.exchange_cycles:,}", f"{c.mem_bytes:,}", f"{c.home_bytes:,}",
                   "*" if c.chosen else ""] for c in rows], left=(0, 1, 2)))
    print(f"{len({c.op for c in rows})} op(s); * = the {args.baseline} baseline's choice "
          f"(estimates in cycles under its {chosen.packing} packing); pin one with "
          "[recipes] in a --constraints file (docs/constraints.md)")
    return 0


@command("extensions", "list the baseline policies, optimizers and proposal kinds by name",
         JSON_ARG)
def cmd_extensions(args: argparse.Namespace) -> int:
    from planner.pipeline import extension_rows

    if args.json:
        _print_json([dict(zip(("kind", "name", "from", "what"), r, strict=True))
                     for r in extension_rows()])
        return 0
    print(_table(["kind", "name", "from", "what"], extension_rows(), left=(0, 1, 2, 3)))
    return 0


@command("sweep", "run a grid of plans (models x devices x policies x ...) on processes or Dask",
         arg("sweep", help="sweep TOML: [sweep] axes as lists, optional [[case]] and [plot]"),
         arg("--executor", choices=("local", "dask"), default="local",
             help="local: a process pool (default); dask: dask.distributed (a LocalCluster, "
                  "or the cluster at --scheduler)"),
         arg("--scheduler", default=None, metavar="ADDRESS",
             help="with --executor dask: join the running cluster at tcp://HOST:PORT"),
         arg("--workers", type=count(1), default=2,
             help="processes (local) or LocalCluster workers (dask); default 2"),
         arg("--out", default=None, metavar="DIR",
             help="results directory; default artifacts/sweeps/<sweep name>"),
         arg("--resume", action="store_true",
             help="finish the sweep in --out: skip the cases already finished there"),
         arg("--json", action="store_true", help="print the rows as one JSON object"))
def cmd_sweep(args: argparse.Namespace) -> int:
    import json

    from planner.sweep import load_sweep, run_sweep, table_rows

    sweep = load_sweep(args.sweep)
    out = args.out or os.path.join("artifacts", "sweeps", sweep.name)
    _note_cold_cache()
    res = run_sweep(sweep, out, executor=args.executor, workers=args.workers,
                    scheduler=args.scheduler, resume=args.resume, progress=not args.json,
                    make_parents=args.out is None)
    if args.json:
        print(json.dumps({"sweep": sweep.name, "out": out, "rows": res.rows}, sort_keys=True))
        return 1 if res.failures else 0
    header, cells = table_rows(sweep, res.rows)
    print(_table(header, cells, left=tuple(range(len(header) - len(sweep.metrics)))))
    counts = {s: sum(r["status"] == s for r in res.rows) for s in ("ok", "build-failure", "error")}
    where = args.scheduler or f"{args.executor} x{args.workers}"
    print(f"sweep {sweep.name}: {len(res.rows)} cases ({res.ran} run now, "
          f"{len(res.rows) - res.ran} finished before) in {res.seconds:.1f} s on {where}: "
          + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"; results in {out}")
    for r in res.rows:
        if r["status"] == "error":
            print(f"  error in case {r['key']}: {r.get('error')}", file=sys.stderr)
    return 1 if res.failures else 0


@command("report", "print the summary of a saved run, or write its HTML profile",
         arg("run", help="run directory written by --out (or its summary.json)"),
         arg("--json", action="store_true", help="print the summary as one JSON object"),
         arg("--html", default=None, metavar="OUT.html",
             help="write a self-contained HTML profile (per-op table, timeline, per-tile "
                  "heat maps, memory map, optimizer history)"),
         arg("--tile", type=count(0), default=None,
             help="with --html: the tile of the memory map (default: the fullest)"))
def cmd_report(args: argparse.Namespace) -> int:
    import json

    from planner.report import PACKAGE_DIR, format_summary, load_summary

    if args.tile is not None and not args.html:
        raise ConfigError("--tile", "--tile", "chooses the memory map's tile of --html; "
                          "give --html OUT.html too")
    root = Path(args.run)
    root = root.parent if root.is_file() else root
    if args.html:  # never over the run it reads
        writable_file(args.html, "--html", protect=(root,))
    summary = load_summary(args.run)
    if args.html:
        from simulator import load_package

        pkg = load_package(root / PACKAGE_DIR)
        _write_html(args.html, pkg, summary, args.tile)
        if not args.json:
            print(f"report {args.html}")
    print(json.dumps(summary, sort_keys=True) if args.json else format_summary(summary))
    return 0


def _write_html(path: str, pkg: Any, summary: Any, tile: int | None) -> None:
    from planner.html_report import write_report
    from tilecommon.files import writing

    try:
        with writing(path, "--html"):
            write_report(path, pkg, summary, tile)
    except ValueError as e:  # a tile outside the device
        raise ConfigError(path, "--tile", str(e)) from None


@command("diff", "compare two runs: cycles by kind and op, peak memory, plan decisions",
         arg("a", help="a run directory (--out), its summary.json, or SWEEP_DIR@KEY"),
         arg("b", help="the run to compare with it (same forms)"),
         arg("--html", default=None, metavar="OUT.html", help="also write the diff as a page"),
         arg("--top", type=count(1), default=12, help="ops listed (all with --json/--html)"),
         JSON_ARG)
def cmd_diff(args: argparse.Namespace) -> int:
    from planner.diff import diff_html, diff_json, diff_runs, format_diff, load_side

    if args.html:
        writable_file(args.html, "--html", protect=tuple(
            Path(s.split("@", 1)[0]) for s in (args.a, args.b)))
    d = diff_runs(load_side(args.a), load_side(args.b))
    if args.html:
        from tilecommon.files import write_text_atomic, writing

        with writing(args.html, "--html"):
            write_text_atomic(args.html, diff_html(d))
    if args.json:
        _print_json(diff_json(d))
        return 0
    print(format_diff(d, args.top))
    return 0


# the package and measurement commands, registered after the ones above
from planner import cli_package as _package_commands  # noqa: E402,F401

if __name__ == "__main__":  # python -m planner.cli: the same as the tileplan script
    # (through the module planner.cli, where planner.cli_package registers its commands)
    from planner.cli import console as _console

    _console()
