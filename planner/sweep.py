"""Sweeps: a grid of independent `tileplan run`s, on local processes or Dask.

A sweep TOML names axes under `[sweep]` — the `tileplan run` options with
underscores, each a list — and optionally explicit cases:

    [sweep]
    name = "devices"                      # default: the file's stem
    model = ["vit-tiny"]                  # zoo names or TOML paths
    device = ["c600", "tiny"]             # presets or TOML paths
    layers = [1, 2]
    metrics = ["cycles", "baseline_cycles", "plan_seconds"]   # table columns

    [[case]]                              # more cases, each a table of axis values
    model = "vit-micro"
    device = "tiny"

    [plot]                                # optional: DIR/<metric>-vs-<axis>.png
    metric = "cycles"
    axis = "layers"

Axes: model, device, layers, batch, optimization_steps, baseline, optimizer,
seed, numerics, constraints (a constraints file, docs/constraints.md; paths
relative to the sweep file); an axis not given takes `tileplan run`'s default
(layers and batch: the model's own; no constraints).  Any device field is an axis too, named
`device.<field>` (`device.tiles`, `device.memory_size`, a cost constant such
as `device.sync_cycles`): the case's device is its `device` with those fields
changed, so a sweep can explore a chip that does not exist.  Cases are the
cross product of the axes, then the `[[case]]` list (its missing axes from
the first value of each axis).  Paths are relative to the sweep file.

Everything is checked before anything runs or is written (`check_sweep`):
every model and device loads, every baseline and optimizer is registered,
every metric is a key of the run summary, the plot's metric is a number and
its axis an axis; a bad value ends the sweep with a ConfigError naming the
file and the field, and no output directory.

`run_sweep` hands the picklable `run_case` to a `concurrent.futures.Executor`:
a `ProcessPoolExecutor` (executor "local") or a `dask.distributed` client's
executor ("dask": a `LocalCluster` started in the process, or the cluster at
`scheduler`).  Each finished case is one row of DIR/results.jsonl, rewritten
whole and atomically: the case's axis values, `key` (a hash of them),
`status` = ok / build-failure / error, and the keys of `tileplan run --json`
(package_hash, cycles, ...), or stage, tile, need and have, or the error.
`resume` skips cases whose key already has an ok or build-failure row; the
rows already there are checked line by line (a row edited by hand into
another shape is refused with its line number), and rows of cases this sweep
does not have (another sweep's) are refused rather than dropped.  A sweep
holds DIR/.lock while it runs (a second sweep into the same DIR is refused),
stops its workers on Ctrl-C or SIGTERM, and creates DIR only once its
executor is up.  At the end DIR/results.csv holds the table and the plot is
drawn.  A build-failure row carries `hint`, what to try.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilecommon.config import check_regular_file, is_path
from tilecommon.errors import BuildFailure, ConfigError, TileplanError
from tilecommon.files import check_output_dir, write_text_atomic

# axis -> (type, default); None = the model's own (layers, batch)
AXES: dict[str, tuple[type, Any]] = {
    "model": (str, "vit-tiny"), "device": (str, "c600"), "layers": (int, None),
    "batch": (int, None), "optimization_steps": (int, 8), "baseline": (str, "default"),
    "optimizer": (str, "local"), "seed": (int, 0), "numerics": (bool, True),
    "constraints": (str, None),  # a constraints file (docs/constraints.md); None: no pins
}
# the smallest value of each integer axis
AXIS_MIN = {"layers": 1, "batch": 1, "optimization_steps": 0, "seed": 0}
DEVICE_AXIS = "device."  # prefix of the device-field axes
DEFAULT_METRICS = ("cycles", "baseline_cycles", "plan_seconds")
# what a row adds to the run summary's keys (planner.report.SUMMARY_SCHEMA)
ROW_METRICS = ("improvement", "speculative_builds", "speculative_discarded", "case_seconds")
RESULTS_FILE = "results.jsonl"
TABLE_FILE = "results.csv"
FINISHED = ("ok", "build-failure")
STATUSES = (*FINISHED, "error")
FIT_HINT = ("does not fit: try baseline = \"capacity\", fewer layers or a smaller batch, or "
            "a device with more memory (device.memory_size) or tiles (device.tiles)")
LOCK_FILE = ".lock"
IDENTITY_FILE = "sweep.json"
EXECUTORS = ("local", "dask")


@dataclass(frozen=True)
class Sweep:
    name: str
    source: str
    cases: tuple[dict[str, Any], ...]
    metrics: tuple[str, ...]
    plot: tuple[str, str] | None  # (metric, axis)

    def axes(self) -> list[str]:
        """Every axis of its cases: AXES, then the device-field axes."""
        extra = sorted({a for c in self.cases for a in c if a not in AXES})
        return [*AXES, *extra]

    def varying(self) -> list[str]:
        """The axes whose value differs between cases."""
        return [a for a in self.axes() if len({json.dumps(c.get(a)) for c in self.cases}) > 1]


def case_key(case: Mapping[str, Any]) -> str:
    """A hash of a case's axis values (what --resume matches)."""
    text = json.dumps({a: case[a] for a in sorted(case) if (a in AXES
                       or a.startswith(DEVICE_AXIS)) and not (a == "constraints"
                                                            and case[a] is None)},
                      sort_keys=True)  # sweeps without pins keep the keys they had
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def device_fields() -> tuple[str, ...]:
    """The device fields a `device.<field>` axis may name."""
    from simulator.device import _LIMITS, COST_FIELDS

    return tuple(sorted(_LIMITS)) + COST_FIELDS


# ---- the sweep file -------------------------------------------------------------------------


def _axis_name(source: str, field: str, axis: str) -> str:
    """`axis` if it is one (an AXES name or `device.<field>`), else ConfigError."""
    if axis in AXES or (axis.startswith(DEVICE_AXIS)
                        and axis[len(DEVICE_AXIS):] in device_fields()):
        return axis
    raise ConfigError(source, field, f"unknown axis (axes: {', '.join(AXES)}, or "
                      f"device.<field> for a device field: {', '.join(device_fields()[:6])}, "
                      f"...)")


def _axis_value(source: str, field: str, axis: str, value: Any) -> Any:
    """`value` checked against the type of `axis`."""
    if axis.startswith(DEVICE_AXIS):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, field, "must be a number", value)
        return value
    typ = AXES[axis][0]
    low = AXIS_MIN.get(axis, 0)
    ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
    if not ok or (typ is int and value < low) or (typ is str and not value):
        what = {str: "a non-empty string", int: f"an integer >= {low}",
                bool: "true or false"}[typ]
        raise ConfigError(source, field, f"must be {what}", value)
    return value


def _resolve(value: Any, field: str, here: Path) -> Any:
    """A model or device path is taken relative to the sweep file."""
    if field in ("model", "device", "constraints") and is_path(value) and \
            not Path(value).is_absolute():
        return str((here / value).resolve())
    return value


def parse_sweep(data: Any, source: str, here: Path) -> Sweep:
    """Validate a sweep table; ConfigError names `source` and the field."""
    if not isinstance(data, dict):
        raise ConfigError(source, "sweep", "must be a table", type(data).__name__)
    unknown = sorted(set(data) - {"sweep", "case", "plot"})
    if unknown:
        raise ConfigError(source, unknown[0], "unknown table (known: sweep, case, plot)")
    table = data.get("sweep", {})
    if not isinstance(table, dict):
        raise ConfigError(source, "sweep", "must be a table", table)
    table = dict(table)
    name = table.pop("name", Path(source).stem)
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(source, "sweep.name", "must be a non-empty name without '/'", name)
    metrics = table.pop("metrics", list(DEFAULT_METRICS))
    if not isinstance(metrics, list) or not metrics or not all(
            isinstance(m, str) and m for m in metrics):
        raise ConfigError(source, "sweep.metrics", "must be a non-empty list of names", metrics)
    axes: dict[str, list[Any]] = {}
    device_tables = table.pop("device", None) if isinstance(table.get("device"), dict) else None
    flat = dict(table)
    if device_tables is not None:  # [sweep.device] tiles = [...]: device.tiles
        flat.update({f"{DEVICE_AXIS}{k}": v for k, v in device_tables.items()})
    for field, values in flat.items():
        axis = _axis_name(source, f"sweep.{field}", field)
        if not isinstance(values, list) or not values:
            raise ConfigError(source, f"sweep.{field}", "must be a non-empty list", values)
        axes[axis] = [_resolve(_axis_value(source, f"sweep.{field}", axis, v), axis, here)
                      for v in values]
    explicit = data.get("case", [])
    if not isinstance(explicit, list):
        raise ConfigError(source, "case", "must be an array of tables ([[case]])", explicit)
    first = {a: axes[a][0] if a in axes else AXES[a][1] for a in AXES}
    first.update({a: v[0] for a, v in axes.items() if a.startswith(DEVICE_AXIS)})
    cases: list[dict[str, Any]] = []
    if axes:
        names = list(axes)
        for combo in itertools.product(*(axes[a] for a in names)):
            cases.append({**first, **dict(zip(names, combo, strict=True))})
    for i, c in enumerate(explicit):
        if not isinstance(c, dict):
            raise ConfigError(source, f"case[{i}]", "must be a table", c)
        values = {}
        for field, v in c.items():
            axis = _axis_name(source, f"case[{i}].{field}", field)
            values[axis] = _resolve(_axis_value(source, f"case[{i}].{field}", axis, v), axis,
                                    here)
        cases.append({**first, **values})
    unique = list({case_key(c): c for c in cases}.values())  # a case listed twice runs once
    plot = data.get("plot")
    plot_pair: tuple[str, str] | None = None
    if plot is not None:
        if not isinstance(plot, dict) or set(plot) != {"metric", "axis"}:
            raise ConfigError(source, "plot", "must be a table of metric and axis", plot)
        if not isinstance(plot["axis"], str):
            raise ConfigError(source, "plot.axis", "must be an axis name", plot["axis"])
        _axis_name(source, "plot.axis", plot["axis"])
        if not isinstance(plot["metric"], str):
            raise ConfigError(source, "plot.metric", "must be a name", plot["metric"])
        plot_pair = (plot["metric"], plot["axis"])
    if not axes and not explicit:
        raise ConfigError(source, "sweep", "an empty grid: no axis and no [[case]] (give at "
                          "least `model = [...]`)")
    return Sweep(name, source, tuple(unique), tuple(metrics), plot_pair)


def case_device(case: Mapping[str, Any]) -> Any:
    """The Device of a case: its `device` with its `device.<field>` values."""
    from simulator.device import COST_FIELDS, Device, load_device

    dev = load_device(case["device"])
    changed = {a[len(DEVICE_AXIS):]: v for a, v in sorted(case.items())
               if a.startswith(DEVICE_AXIS)}
    if not changed:
        return dev
    table: dict[str, Any] = {k: v for k, v in changed.items() if k not in COST_FIELDS}
    costs = {k: v for k, v in changed.items() if k in COST_FIELDS}
    if costs:
        table["costs"] = costs
    name = dev.name + "".join(f"+{k}={v}" for k, v in changed.items())
    here = Path(case["device"]).resolve() if is_path(case["device"]) else None
    return Device.from_dict({"base": str(here) if here else case["device"], "name": name,
                             **table}, f"device {name}")


def metric_names() -> tuple[str, ...]:
    """Every metric a row can hold: the run summary's keys and ROW_METRICS."""
    from planner.report import SUMMARY_SCHEMA

    return (*SUMMARY_SCHEMA["properties"], *ROW_METRICS)


def check_sweep(sweep: Sweep) -> None:
    """Everything a sweep needs, before any case runs (module docstring):
    ConfigError naming the sweep file and the field otherwise."""
    from planner.ir.models import load_model
    from planner.pipeline import check_names
    from planner.search.incumbent import PipelineConfig

    known = metric_names()
    for m in sweep.metrics:
        if m not in known:
            raise ConfigError(sweep.source, "sweep.metrics", f"unknown metric; known: "
                              f"{', '.join(known)}", m)
    if sweep.plot is not None:
        from planner.report import NUMERIC_SUMMARY_KEYS

        metric, axis = sweep.plot
        if metric not in (*NUMERIC_SUMMARY_KEYS, *ROW_METRICS):
            raise ConfigError(sweep.source, "plot.metric", "must be a numeric metric", metric)
        if axis not in sweep.axes():
            raise ConfigError(sweep.source, "plot.axis", "is not an axis of this sweep", axis)
    seen: set[str] = set()
    for c in sweep.cases:
        for what, key, check in (
                ("model", json.dumps([c["model"], c["layers"], c["batch"]]),
                 lambda c=c: load_model(c["model"], layers=c["layers"], batch=c["batch"])),
                ("device", json.dumps(
                    {a: v for a, v in c.items() if a == "device" or a.startswith(DEVICE_AXIS)},
                    sort_keys=True), lambda c=c: case_device(c)),
                ("baseline", json.dumps([c["baseline"], c["optimizer"]]),
                 lambda c=c: check_names(PipelineConfig(baseline=c["baseline"],
                                                        optimizer=c["optimizer"]))),
                ("constraints", json.dumps([c.get("constraints"), c["model"], c["layers"],
                                            c["batch"]]), lambda c=c: _check_pins(c))):
            if what + key in seen:
                continue
            seen.add(what + key)
            try:
                check()
            except ConfigError as e:
                raise ConfigError(sweep.source, f"sweep.{e.field}", f"case {case_key(c)}: "
                                  f"{e.source}: {e.message}", e.value) from None


def _check_pins(case: Mapping[str, Any]) -> None:
    """A case's constraints file read and matched to its model (nothing
    without one)."""
    if case.get("constraints") is None:
        return
    from planner.decide.constraints import load_constraints, resolve
    from planner.ir.models import load_model

    c = load_constraints(case["constraints"])
    resolve(c, load_model(case["model"], layers=case["layers"], batch=case["batch"]),
            case_device(case))


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    import tomllib

    p = Path(path)
    check_regular_file(p, "sweep", 1 << 20)
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(str(p), "toml", f"not valid TOML: {e}") from None
    return parse_sweep(data, str(p), p.resolve().parent)


# ---- one case -------------------------------------------------------------------------------


def run_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """Plan (and simulate) one case: its row.  Picklable, for any executor;
    never raises for a failing case."""
    from planner.ir.models import load_model
    from planner.pipeline import check_names, run_model
    from planner.search.incumbent import PipelineConfig
    from tilecommon.runtime import configure

    configure()
    row: dict[str, Any] = {a: case[a] for a in case}
    row["key"] = case_key(case)
    t0 = time.perf_counter()
    try:
        pins = None
        if case.get("constraints") is not None:
            from planner.decide.constraints import load_constraints

            pins = load_constraints(case["constraints"])
        cfg = PipelineConfig(optimization_steps=case["optimization_steps"],
                             baseline=case["baseline"], optimizer=case["optimizer"],
                             constraints=pins)
        check_names(cfg)
        graph = load_model(case["model"], layers=case["layers"], batch=case["batch"])
        out = run_model(graph, case_device(case), cfg, numerics=case["numerics"],
                        seed=case["seed"])
        row.update(out.summary)
        # the case's own axis values win over the summary's (a device path stays the
        # path; layers and batch left to the model show the model's values)
        row.update({a: v for a, v in case.items() if v is not None})
        row["status"] = "ok" if out.status == 0 else "error"
        if out.status:
            row["error"] = f"faults {out.summary.get('faults')}, numerics_ok " \
                           f"{out.summary.get('numerics_ok')}"
    except BuildFailure as e:
        row.update(status="build-failure", stage=e.stage, tile=e.tile, need=e.need,
                   have=e.have, error=str(e), hint=FIT_HINT)
    except TileplanError as e:
        row.update(status="error", error=f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - a row, never a crashed sweep
        row.update(status="error", error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc())
    row["case_seconds"] = round(time.perf_counter() - t0, 3)
    return row


# ---- results --------------------------------------------------------------------------------


# row keys whose values must be non-negative integers when present
_COUNTS = ("cycles", "baseline_cycles", "faults", "peak_tile_bytes", "steps", "vertices",
           "transfers", "need", "have", "layers", "batch", "optimization_steps", "seed")


def _check_row(row: Any, where: str) -> dict[str, Any]:
    """A results row as written by this module, or ConfigError naming `where`."""
    if not isinstance(row, dict):
        raise ConfigError(where, "row", "must be a JSON object", type(row).__name__)
    key = row.get("key")
    if not isinstance(key, str) or len(key) != 16 or any(c not in "0123456789abcdef"
                                                        for c in key):
        raise ConfigError(where, "key", "must be a case key (16 hex digits)", key)
    if row.get("status") not in STATUSES:
        raise ConfigError(where, "status", f"must be one of {list(STATUSES)}",
                          row.get("status"))
    for f in _COUNTS:
        v = row.get(f)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            if not (f == "tile" or (f in ("layers", "batch") and v is None)):
                raise ConfigError(where, f, "must be an integer >= 0", v)
    if row["status"] == "ok" and not isinstance(row.get("cycles"), int):
        raise ConfigError(where, "cycles", "an ok row needs its cycles", row.get("cycles"))
    for a in AXES:
        if a in row and row[a] is not None:
            _axis_value(where, a, a, row[a])
    return row


def read_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of DIR/results.jsonl, each checked (`_check_row`): a file
    edited by hand into another shape is refused with its line number."""
    path = out / RESULTS_FILE
    if not path.exists():
        return []
    check_regular_file(path, "results", 1 << 30)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        at = path.read_bytes()[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{at}", "row", "not UTF-8 text") from None
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{i}", "row", f"not JSON: {e.msg}") from None
        rows.append(_check_row(row, f"{path}:{i}"))
    return rows


def _write_rows(out: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    write_text_atomic(out / RESULTS_FILE,
                      "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def table_rows(sweep: Sweep, rows: Sequence[Mapping[str, Any]]
               ) -> tuple[list[str], list[list[Any]]]:
    """(header, cells) of the summary: the varying axes, status, the metrics."""
    axes = sweep.varying() or ["model"]
    header = [*axes, "status", *sweep.metrics]
    order = {case_key(c): i for i, c in enumerate(sweep.cases)}
    cells = []
    for r in sorted(rows, key=lambda r: order.get(r["key"], len(order))):
        metric_cells = [r.get(m, r.get("stage", "")) if r["status"] == "build-failure"
                        and m == sweep.metrics[0] else r.get(m, "") for m in sweep.metrics]
        cells.append([_axis_cell(a, r.get(a)) for a in axes]
                     + [r["status"], *map(_cell, metric_cells)])
    return header, cells


def _axis_cell(axis: str, value: Any) -> Any:
    """An axis value as the table shows it: a model or device path by its stem."""
    if axis in ("model", "device") and isinstance(value, str) and is_path(value):
        return Path(value).stem
    return value


def _cell(value: Any) -> Any:
    """A table cell: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else value


def write_csv(out: Path, sweep: Sweep, rows: Sequence[Mapping[str, Any]]) -> Path:
    cols = [*sweep.axes(), "key", "status", *sweep.metrics, "stage", "tile", "need", "have",
            "error", "hint"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    order = {case_key(c): i for i, c in enumerate(sweep.cases)}
    for r in sorted(rows, key=lambda r: order.get(r["key"], len(order))):
        w.writerow(["" if r.get(c) is None else r.get(c) for c in cols])
    return write_text_atomic(out / TABLE_FILE, buf.getvalue())


def plot_metric(out: Path, sweep: Sweep, rows: Sequence[Mapping[str, Any]]) -> Path | None:
    """DIR/<metric>-vs-<axis>.png: the metric of the ok rows against the axis,
    one line per combination of the other varying axes."""
    if sweep.plot is None:
        return None
    metric, axis = sweep.plot
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [a for a in sweep.varying() if a != axis]
    series: dict[str, list[tuple[Any, float]]] = {}
    for r in rows:
        if r["status"] != "ok" or not isinstance(r.get(metric), int | float):
            continue
        label = ", ".join(f"{a}={Path(str(r[a])).stem}" for a in others) or metric
        series.setdefault(label, []).append((r[axis], float(r[metric])))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, pts in sorted(series.items()):
        pts.sort(key=lambda p: (str(type(p[0])), p[0]))
        ax.plot([str(p[0]) if isinstance(p[0], str) else p[0] for p in pts],
                [p[1] for p in pts], marker="o", label=label)
    if all(isinstance(p[0], int) for pts in series.values() for p in pts):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers 1, 2, 3: no 1.5
    ax.set_xlabel(axis)
    ax.set_ylabel(metric)
    ax.set_title(f"sweep {sweep.name}")
    if len(series) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"{metric}-vs-{axis}.png"
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


# ---- executors ------------------------------------------------------------------------------


def _init_worker() -> None:
    """A local worker: the numeric runtime configured; SIGTERM back to its
    default and Ctrl-C ignored (the parent stops the workers itself: `close`
    in make_executor; a forked worker would otherwise run the CLI's handler
    and print a traceback as it is stopped)."""
    import signal

    from tilecommon.runtime import configure

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure()


def make_executor(kind: str, workers: int, scheduler: str | None
                  ) -> tuple[Executor, Callable[[], None]]:
    """(executor, close) for "local" or "dask"."""
    if kind == "local":
        if scheduler:
            raise ConfigError(scheduler, "--scheduler", "only with --executor dask")
        pool = ProcessPoolExecutor(workers, initializer=_init_worker)

        def close() -> None:
            # stop the workers too (a running case would outlive Ctrl-C or SIGTERM);
            # then shut down without waiting: a worker terminated while it held the
            # result queue's lock would leave `shutdown(wait=True)` waiting forever
            procs = list(getattr(pool, "_processes", {}).values())
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=5)
            pool.shutdown(wait=False, cancel_futures=True)

        return pool, close
    if kind != "dask":
        raise ConfigError(kind, "--executor", f"must be one of {', '.join(EXECUTORS)}")
    try:
        from distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ConfigError(kind, "--executor", "dask.distributed is not installed") from None
    if scheduler:
        try:
            client = Client(scheduler, timeout="10s")
        except OSError as e:
            raise ConfigError(scheduler, "--scheduler", f"cannot connect: {e}") from None
        print(f"sweep: dask dashboard {client.dashboard_link}", file=sys.stderr)
        return client.get_executor(), client.close
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    client = Client(cluster)
    print(f"sweep: dask dashboard {client.dashboard_link}", file=sys.stderr)

    def close_cluster() -> None:
        client.close()
        cluster.close()

    return client.get_executor(), close_cluster


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]
    ran: int  # cases run by this call (the others were finished before --resume)
    seconds: float

    @property
    def failures(self) -> int:
        return sum(r["status"] == "error" for r in self.rows)


@contextlib.contextmanager
def _locked(root: Path) -> Any:
    """Hold DIR/.lock (fcntl.flock, released with the process): a second
    sweep into the same DIR is refused, not interleaved."""
    import fcntl

    with open(root / LOCK_FILE, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(str(root), "--out", "is in use by another sweep") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def _identity(sweep: Sweep) -> dict[str, Any]:
    return {"name": sweep.name, "source": sweep.source,
            "cases": sorted(case_key(c) for c in sweep.cases)}


def run_sweep(sweep: Sweep, out: str | os.PathLike[str], executor: str = "local",
              workers: int = 2, scheduler: str | None = None, resume: bool = False,
              progress: bool = True, make_parents: bool = True) -> SweepResult:
    """Run every case not yet finished in `out` (module docstring); the
    parent directories of `out` are made when `make_parents` (the CLI's
    default --out), else they must exist."""
    check_sweep(sweep)
    if make_parents:
        Path(out).resolve().parent.mkdir(parents=True, exist_ok=True)
    root = check_output_dir(out, "--out", RESULTS_FILE, "sweep")
    if root.exists() and not resume and (root / RESULTS_FILE).exists():
        raise ConfigError(str(root), "--out", f"holds the results of a sweep ({RESULTS_FILE}); "
                          "pass --resume to finish it, or another --out")
    old = read_rows(root)
    keys = {case_key(c) for c in sweep.cases}
    foreign = sorted({r["key"] for r in old} - keys)
    if foreign:
        raise ConfigError(str(root), "--out", f"holds {len(foreign)} result(s) of cases this "
                          f"sweep does not have (another sweep's, e.g. case {foreign[0]}); "
                          f"use another --out")
    done = {r["key"]: r for r in old if r["status"] in FINISHED}
    todo = [c for c in sweep.cases if case_key(c) not in done]
    rows = list(done.values())
    t0 = time.perf_counter()
    pool, close = make_executor(executor, workers, scheduler) if todo else (None, lambda: None)
    created = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root):
            write_text_atomic(root / IDENTITY_FILE,
                              json.dumps(_identity(sweep), indent=1, sort_keys=True) + "\n")
            if pool is not None:
                futures: Iterable[Future[dict[str, Any]]] = [pool.submit(run_case, c)
                                                            for c in todo]
                from tqdm import tqdm

                show = progress and sys.stderr.isatty()  # no bars in logs
                for fut in tqdm(as_completed(list(futures)), total=len(todo),
                                disable=not show, desc=f"sweep {sweep.name}", unit="case"):
                    rows.append(fut.result())
                    _write_rows(root, rows)
            _write_rows(root, rows)
            write_csv(root, sweep, rows)
            plot_metric(root, sweep, rows)
    except BaseException:
        if created and not (root / RESULTS_FILE).exists():
            shutil.rmtree(root, ignore_errors=True)  # nothing of this sweep to keep
        raise
    finally:
        close()
    return SweepResult(rows, len(todo), time.perf_counter() - t0)
