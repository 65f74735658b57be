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
seed, numerics; an axis not given takes `tileplan run`'s default (layers and
batch: the model's own).  Cases are the cross product of the axes, then the
`[[case]]` list (its missing axes from the first value of each axis).  Paths
are relative to the sweep file.

`run_sweep` hands the picklable `run_case` to a `concurrent.futures.Executor`:
a `ProcessPoolExecutor` (executor "local") or a `dask.distributed` client's
executor ("dask": a `LocalCluster` started in the process, or the cluster at
`scheduler`).  Each finished case is one row of DIR/results.jsonl, rewritten
whole and atomically: the case's axis values, `key` (a hash of them),
`status` = ok / build-failure / error, and the keys of `tileplan run --json`
(package_hash, cycles, ...), or stage, tile, need and have, or the error.
`resume` skips cases whose key already has an ok or build-failure row.  At
the end DIR/results.csv holds the table and the plot is drawn.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilecommon.config import check_regular_file, is_path
from tilecommon.errors import BuildFailure, ConfigError, TileplanError
from tilecommon.files import write_text_atomic

# axis -> (type, default); None = the model's own (layers, batch)
AXES: dict[str, tuple[type, Any]] = {
    "model": (str, "vit-tiny"), "device": (str, "c600"), "layers": (int, None),
    "batch": (int, None), "optimization_steps": (int, 8), "baseline": (str, "default"),
    "optimizer": (str, "local"), "seed": (int, 0), "numerics": (bool, True),
}
DEFAULT_METRICS = ("cycles", "baseline_cycles", "plan_seconds")
RESULTS_FILE = "results.jsonl"
TABLE_FILE = "results.csv"
FINISHED = ("ok", "build-failure")
EXECUTORS = ("local", "dask")


@dataclass(frozen=True)
class Sweep:
    name: str
    source: str
    cases: tuple[dict[str, Any], ...]
    metrics: tuple[str, ...]
    plot: tuple[str, str] | None  # (metric, axis)

    def varying(self) -> list[str]:
        """The axes whose value differs between cases."""
        return [a for a in AXES if len({json.dumps(c[a]) for c in self.cases}) > 1]


def case_key(case: Mapping[str, Any]) -> str:
    """A hash of a case's axis values (what --resume matches)."""
    text = json.dumps({a: case[a] for a in AXES}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- the sweep file -------------------------------------------------------------------------


def _axis_value(source: str, field: str, value: Any) -> Any:
    """`value` checked against the type of its axis (`field` ends in the axis name)."""
    typ = AXES[field.rsplit(".", 1)[-1]][0]
    ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
    if not ok or (typ is int and value < 0) or (typ is str and not value):
        what = {str: "a non-empty string", int: "an integer >= 0", bool: "true or false"}[typ]
        raise ConfigError(source, field, f"must be {what}", value)
    return value


def _resolve(value: Any, field: str, here: Path) -> Any:
    """A model or device path is taken relative to the sweep file."""
    if field in ("model", "device") and is_path(value) and not Path(value).is_absolute():
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
    for field, values in table.items():
        if field not in AXES:
            raise ConfigError(source, f"sweep.{field}",
                              f"unknown axis (axes: {', '.join(AXES)})")
        if not isinstance(values, list) or not values:
            raise ConfigError(source, f"sweep.{field}", "must be a non-empty list", values)
        axes[field] = [_resolve(_axis_value(source, f"sweep.{field}", v), field, here)
                       for v in values]
    first = {a: axes[a][0] if a in axes else AXES[a][1] for a in AXES}
    cases: list[dict[str, Any]] = []
    explicit = data.get("case", [])
    if not isinstance(explicit, list):
        raise ConfigError(source, "case", "must be an array of tables ([[case]])", explicit)
    if axes or not explicit:
        names = list(axes)
        for combo in itertools.product(*(axes[a] for a in names)):
            cases.append({**first, **dict(zip(names, combo, strict=True))})
    for i, c in enumerate(explicit):
        if not isinstance(c, dict):
            raise ConfigError(source, f"case[{i}]", "must be a table", c)
        for field in c:
            if field not in AXES:
                raise ConfigError(source, f"case[{i}].{field}",
                                  f"unknown axis (axes: {', '.join(AXES)})")
        cases.append({**first, **{f: _resolve(_axis_value(source, f"case[{i}].{f}", v), f, here)
                                  for f, v in c.items()}})
    unique = list({case_key(c): c for c in cases}.values())  # a case listed twice runs once
    plot = data.get("plot")
    plot_pair: tuple[str, str] | None = None
    if plot is not None:
        if not isinstance(plot, dict) or set(plot) != {"metric", "axis"}:
            raise ConfigError(source, "plot", "must be a table of metric and axis", plot)
        if plot["axis"] not in AXES:
            raise ConfigError(source, "plot.axis", f"unknown axis (axes: {', '.join(AXES)})",
                              plot["axis"])
        if not isinstance(plot["metric"], str):
            raise ConfigError(source, "plot.metric", "must be a name", plot["metric"])
        plot_pair = (plot["metric"], plot["axis"])
    return Sweep(name, source, tuple(unique), tuple(metrics), plot_pair)


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
    from simulator.device import load_device
    from tilecommon.runtime import configure

    configure()
    row: dict[str, Any] = {a: case[a] for a in AXES}
    row["key"] = case_key(case)
    t0 = time.perf_counter()
    try:
        cfg = PipelineConfig(optimization_steps=case["optimization_steps"],
                             baseline=case["baseline"], optimizer=case["optimizer"])
        check_names(cfg)
        graph = load_model(case["model"], layers=case["layers"], batch=case["batch"])
        out = run_model(graph, load_device(case["device"]), cfg, numerics=case["numerics"],
                        seed=case["seed"])
        row.update(out.summary)
        # the case's own axis values win over the summary's (a device path stays the
        # path; layers and batch left to the model show the model's values)
        row.update({a: case[a] for a in AXES if case[a] is not None})
        row["status"] = "ok" if out.status == 0 else "error"
        if out.status:
            row["error"] = f"faults {out.summary.get('faults')}, numerics_ok " \
                           f"{out.summary.get('numerics_ok')}"
    except BuildFailure as e:
        row.update(status="build-failure", stage=e.stage, tile=e.tile, need=e.need,
                   have=e.have, error=str(e))
    except TileplanError as e:
        row.update(status="error", error=f"{type(e).__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - a row, never a crashed sweep
        row.update(status="error", error=f"{type(e).__name__}: {e}",
                   traceback=traceback.format_exc())
    row["case_seconds"] = round(time.perf_counter() - t0, 3)
    return row


# ---- results --------------------------------------------------------------------------------


def read_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of DIR/results.jsonl (a torn last line, if any, is dropped)."""
    path = out / RESULTS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows.append(row)
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
    cols = [*AXES, "key", "status", *sweep.metrics, "stage", "tile", "need", "have", "error"]
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
    from tilecommon.runtime import configure

    configure()


def make_executor(kind: str, workers: int, scheduler: str | None
                  ) -> tuple[Executor, Callable[[], None]]:
    """(executor, close) for "local" or "dask"."""
    if kind == "local":
        if scheduler:
            raise ConfigError(scheduler, "--scheduler", "only with --executor dask")
        pool = ProcessPoolExecutor(workers, initializer=_init_worker)
        return pool, lambda: pool.shutdown(cancel_futures=True)
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
        return client.get_executor(), client.close
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    client = Client(cluster)

    def close() -> None:
        client.close()
        cluster.close()

    return client.get_executor(), close


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]
    ran: int  # cases run by this call (the others were finished before --resume)
    seconds: float

    @property
    def failures(self) -> int:
        return sum(r["status"] == "error" for r in self.rows)


def run_sweep(sweep: Sweep, out: str | os.PathLike[str], executor: str = "local",
              workers: int = 2, scheduler: str | None = None, resume: bool = False,
              progress: bool = True) -> SweepResult:
    """Run every case not yet finished in `out` (module docstring)."""
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(str(root), "--out", "exists and is not a directory")
    old = read_rows(root)
    if old and not resume:
        raise ConfigError(str(root), "--out", f"holds the results of a sweep ({RESULTS_FILE}); "
                          "pass --resume to finish it, or another --out")
    root.mkdir(parents=True, exist_ok=True)
    keys = {case_key(c) for c in sweep.cases}
    done = {r["key"]: r for r in old if r["status"] in FINISHED and r["key"] in keys}
    todo = [c for c in sweep.cases if case_key(c) not in done]
    rows = list(done.values())
    t0 = time.perf_counter()
    if todo:
        pool, close = make_executor(executor, workers, scheduler)
        try:
            futures: Iterable[Future[dict[str, Any]]] = [pool.submit(run_case, c)
                                                        for c in todo]
            from tqdm import tqdm

            for fut in tqdm(as_completed(list(futures)), total=len(todo), disable=not progress,
                            desc=f"sweep {sweep.name}", unit="case"):
                rows.append(fut.result())
                _write_rows(root, rows)
        finally:
            close()
    _write_rows(root, rows)
    write_csv(root, sweep, rows)
    plot_metric(root, sweep, rows)
    return SweepResult(rows, len(todo), time.perf_counter() - t0)
