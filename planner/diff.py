"""Compare two runs: what changed in cycles, memory and decisions.

`load_side(spec)` reads one side: a run directory written by `--out` (its
summary.json and, when saved, plan.toml), a summary.json path, or one row of
a sweep as `SWEEP_DIR@KEY` (a case key or a unique prefix of one, as
results.jsonl holds them).  `diff_runs(a, b)` returns a `RunDiff`:

- totals: cycles, baseline cycles, peak tile bytes (b − a and b / a);
- cycles by step kind (compute, exchange, sync, loop) when both sides hold
  them (`cycle_totals`);
- per op: cycles, compute, exchange and sync of every op either side costs
  (`ops`, the per-op breakdown; an op only one side has counts as 0 on the
  other), largest |delta| first;
- decisions: every plan decision that differs (recipes, cast orders, open
  boundaries, fused groups, tile shifts, rotation bases, plan-wide fields),
  from both sides' plan.toml; None when a side has no saved plan (runs
  saved before plans were, sweep rows).

`format_diff` prints it; `diff_json` is the `--json` form.  A run compared
with itself has zero deltas and no decisions.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.decide.constraints import parse_constraints
from planner.report import PLAN_FILE, check_summary, load_summary
from tilecommon.errors import ConfigError

KINDS = ("compute", "exchange", "sync", "loop")
OP_PARTS = ("cycles", "compute", "exchange", "sync")


@dataclass(frozen=True)
class Side:
    """One run: its name (as given), summary and saved plan decisions."""

    name: str
    summary: dict[str, Any]
    decisions: dict[str, str] | None  # "table key" -> value; None: no saved plan


@dataclass(frozen=True)
class RunDiff:
    a: str
    b: str
    totals: list[tuple[str, int | None, int | None]]
    kinds: list[tuple[str, int, int]]
    ops: list[tuple[str, dict[str, int], dict[str, int]]]
    decisions: list[tuple[str, str | None, str | None]] | None
    notes: list[str] = field(default_factory=list)

    @property
    def zero(self) -> bool:
        """No delta anywhere (a run against itself)."""
        return (all(x == y for _, x, y in self.totals) and all(x == y for _, x, y in self.kinds)
                and all(x == y for _, x, y in self.ops) and not self.decisions)


def _decisions(text: str, source: str) -> dict[str, str]:
    try:
        c = parse_constraints(tomllib.loads(text), source)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(source, "toml", f"not valid TOML: {e}") from None
    out = {f"plan {k}": json.dumps(v) for k, v in c.plan if k != "exact"}
    for table in ("recipes", "cast", "open", "fused", "shift", "rotation"):
        for k, v in getattr(c, table):
            out[f"{table} {k}"] = json.dumps(v)
    return out


def load_side(spec: str) -> Side:
    """One side of a diff (module docstring); ConfigError naming `spec`."""
    if "@" in spec and Path(spec.split("@", 1)[0]).is_dir() and not Path(spec).exists():
        return _sweep_row(spec)
    path = Path(spec)
    summary = load_summary(path)
    root = path if path.is_dir() else path.parent
    plan = root / PLAN_FILE
    decisions = _decisions(plan.read_text(), str(plan)) if plan.is_file() else None
    return Side(spec, summary, decisions)


def _sweep_row(spec: str) -> Side:
    from planner.sweep import read_rows

    where, key = spec.split("@", 1)
    rows = [r for r in read_rows(Path(where)) if str(r.get("key", "")).startswith(key)]
    if len(rows) != 1:
        keys = [r.get("key") for r in read_rows(Path(where))][:6]
        raise ConfigError(spec, "key", f"{'no' if not rows else 'more than one'} case of the "
                          f"sweep matches; its keys: {', '.join(map(str, keys))}", key)
    row = rows[0]
    if row.get("status") != "ok":
        raise ConfigError(spec, "status", "the case did not run to a plan", row.get("status"))
    check_summary(row, spec)
    return Side(spec, row, None)


def _ops(s: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {o["op"]: {p: int(o.get(p, 0)) for p in OP_PARTS} for o in s.get("ops") or []}


def diff_runs(a: Side, b: Side) -> RunDiff:
    """What differs from run `a` to run `b` (module docstring)."""
    sa, sb = a.summary, b.summary
    totals = [(k, sa.get(k), sb.get(k)) for k in ("cycles", "baseline_cycles",
                                                   "peak_tile_bytes")]
    ka, kb = sa.get("cycle_totals") or {}, sb.get("cycle_totals") or {}
    kinds = [(k, int(ka.get(k, 0)), int(kb.get(k, 0))) for k in KINDS
             if k in ka or k in kb]
    oa, ob = _ops(sa), _ops(sb)
    zero = dict.fromkeys(OP_PARTS, 0)
    ops = [(op, oa.get(op, zero), ob.get(op, zero)) for op in sorted(set(oa) | set(ob))]
    ops.sort(key=lambda r: (-abs(r[2]["cycles"] - r[1]["cycles"]), r[0]))
    notes = []
    if not ka or not kb:
        notes.append("cycles by kind: not in both summaries")
    if not oa or not ob:
        notes.append("per-op cycles: not in both summaries")
    decisions = None
    if a.decisions is not None and b.decisions is not None:
        keys = sorted(set(a.decisions) | set(b.decisions))
        decisions = [(k, a.decisions.get(k), b.decisions.get(k)) for k in keys
                     if a.decisions.get(k) != b.decisions.get(k)]
    else:
        missing = [s.name for s in (a, b) if s.decisions is None]
        notes.append(f"plan decisions: no saved plan ({PLAN_FILE}) for {', '.join(missing)}")
    return RunDiff(a.name, b.name, totals, kinds, ops, decisions, notes)


def _delta(x: int | None, y: int | None) -> str:
    if x is None or y is None:
        return "?"
    d = y - x
    ratio = f" ({y / x:.3f}x)" if x else ""
    return f"{d:+,}{ratio}"


def format_diff(d: RunDiff, top: int = 12) -> str:
    """One screen: totals, kinds, the ops that moved most, the decisions."""
    from tilecommon.tables import table

    lines = [f"diff {d.a} -> {d.b}" + ("  (identical)" if d.zero else "")]
    lines.append(table(["", "a", "b", "b - a"],
                       [[k, f"{x:,}" if x is not None else "?", f"{y:,}" if y is not None
                         else "?", _delta(x, y)] for k, x, y in d.totals]))
    if d.kinds:
        lines.append("")
        lines.append(table(["cycles by kind", "a", "b", "b - a"],
                           [[k, f"{x:,}", f"{y:,}", _delta(x, y)] for k, x, y in d.kinds]))
    moved = [r for r in d.ops if r[1] != r[2]]
    if moved:
        lines.append("")
        lines.append(table(["op", "a cycles", "b cycles", "b - a", "compute", "exchange",
                            "sync"],
                           [[op, f"{x['cycles']:,}", f"{y['cycles']:,}",
                             _delta(x["cycles"], y["cycles"]),
                             *(f"{y[p] - x[p]:+,}" for p in ("compute", "exchange", "sync"))]
                            for op, x, y in moved[:top]]))
        if len(moved) > top:
            lines.append(f"... {len(moved) - top} more op(s) changed (--json lists all)")
    if d.decisions:
        lines.append("")
        lines.append(table(["decision", "a", "b"],
                           [[k, x if x is not None else "-", y if y is not None else "-"]
                            for k, x, y in d.decisions]))
    elif d.decisions is not None:
        lines.append("decisions: the same plan")
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)


def diff_json(d: RunDiff) -> dict[str, Any]:
    return {
        "a": d.a, "b": d.b, "identical": d.zero,
        "totals": {k: {"a": x, "b": y, "delta": None if x is None or y is None else y - x}
                   for k, x, y in d.totals},
        "kinds": {k: {"a": x, "b": y, "delta": y - x} for k, x, y in d.kinds},
        "ops": [{"op": op, "a": x, "b": y, "delta": {p: y[p] - x[p] for p in OP_PARTS}}
                for op, x, y in d.ops],
        "decisions": None if d.decisions is None else
        [{"decision": k, "a": x, "b": y} for k, x, y in d.decisions],
        "notes": d.notes,
    }


def diff_html(d: RunDiff) -> str:
    """A self-contained page of the diff's tables (every op, every decision)."""
    from html import escape

    def tab(header: list[str], rows: list[list[Any]]) -> str:
        head = "".join(f"<th>{escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>"
                       for r in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    parts = [f"<h1>{escape(d.a)} &rarr; {escape(d.b)}</h1>",
             "<p>identical</p>" if d.zero else "",
             tab(["", "a", "b", "b - a"], [[k, x, y, _delta(x, y)] for k, x, y in d.totals])]
    if d.kinds:
        parts += ["<h2>Cycles by kind</h2>",
                  tab(["kind", "a", "b", "b - a"], [[k, x, y, _delta(x, y)]
                                                    for k, x, y in d.kinds])]
    parts += ["<h2>Ops</h2>", tab(["op", "a cycles", "b cycles", "b - a", "compute",
                                   "exchange", "sync"],
                                  [[op, x["cycles"], y["cycles"], _delta(x["cycles"],
                                                                         y["cycles"]),
                                    *(y[p] - x[p] for p in ("compute", "exchange", "sync"))]
                                   for op, x, y in d.ops])]
    if d.decisions is not None:
        parts += ["<h2>Decisions</h2>", tab(["decision", "a", "b"],
                                            [[k, x or "-", y or "-"]
                                             for k, x, y in d.decisions])]
    parts += [f"<p>note: {escape(n)}</p>" for n in d.notes]
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tileplan diff</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>")
