"""Reading a file of published kernel measurements and mapping its entries to
our kernel calls (the input of simulator.calibrate).

The format is a TOML file of `[[measurement]]` tables (the shipped
`simulator/calibration/ipu21.toml` names its public source and explains its
fields): every entry has a string `id` and `kind`; `kernel` entries are one
kernel call on one tile with per-tile extents `R` (rows), `K` (inner extent or,
for a reduction, the number of partials), `C` (columns, or elements), dtypes
`dtype_in` / `dtype_out`, the measured `cycles` and a `date`; `fit` entries are
published cost formulas, and a fit's `note` may hold a table of
`(elements, cycles)` pairs ("GELU table v2: (2,462) (6,702) ...").

`read_file(path)` validates what it reads: a file that is not TOML, an entry
without `id` or `kind`, a field of the wrong type, non-positive cycles or
extents raise ConfigError naming the file, the entry id and the field.

`select(entries, device)` turns usable entries into `Measurement`s (our kernel,
its named arguments, the cycles) and lists every other kernel entry as
`Skipped` with the reason.  Rules, in order:

1. only `kind = "kernel"` entries, and tables in the notes of `fit` entries;
2. the op must be one of ours (`OP_KERNELS`); fused and packed variants are not;
3. measured cycles — or, for a GEMM, a useful-efficiency percentage with its
   full geometry (cycles = 2 R K C / (2 * peak MACs * efficiency));
4. the extents the kernel needs; a `tiles` field marks a figure from a run on
   many tiles (a phase span, an in-model maximum), not one call;
5. one measurement per kernel, geometry and path: the latest date wins, a dated
   entry wins over an undated one, and of the tables of one op only the highest
   version is read;
6. a kernel's current version: dated entries older than the kernel's newest
   usable one by more than `window_days` measure an earlier version.
"""

from __future__ import annotations

import datetime
import math
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilecommon.errors import ConfigError

# dataset op -> our kernel
OP_KERNELS: dict[str, str] = {
    "gemm": "MATMUL", "gemm_qk": "MATMUL", "gemm_pv": "MATMUL",
    "reduce_add": "REDUCE", "add": "ADD", "gelu": "GELU", "layernorm": "LAYERNORM",
    "softmax": "SOFTMAX", "cast": "CAST", "copy": "COPY",
}
# kernel -> the cost family its constants belong to (MATMUL and BATCH_MATMUL share the AMP)
DTYPES = ("fp8", "fp16", "fp32")
INT_FIELDS = ("R", "K", "C", "tiles", "batch", "layers")
MAX_EXTENT = 1 << 24  # per-tile extents of one call (a tile holds at most a few MiB)
MAX_CYCLES = 1 << 48
NUM_FIELDS = ("cycles", "value")
STR_FIELDS = ("id", "kind", "op", "what", "source", "date", "note", "unit", "dtype_in",
              "dtype_out")
_TABLE = re.compile(r"table\s*(?:v(\d+))?[^:]*:\s*((?:\(\s*\d+\s*,\s*\d+\s*\)\s*)+)", re.I)
_PAIR = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)")


@dataclass(frozen=True)
class Entry:
    """One validated `[[measurement]]` table (`fields` as read)."""

    id: str
    kind: str
    fields: dict[str, Any] = field(compare=False, hash=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def date(self) -> datetime.date | None:
        d = self.fields.get("date")
        return None if d is None else datetime.date.fromisoformat(d)


@dataclass(frozen=True)
class Measurement:
    """One measured kernel call mapped to ours: `kernel` name, `args` (named
    arguments of contracts §2 without addresses), `cycles` measured,
    `geometry` as printed, `family` of cost constants, `derived` when the
    cycles were computed from an efficiency."""

    id: str
    op: str
    kernel: str
    args: tuple[tuple[str, int], ...]
    cycles: int
    geometry: str
    date: datetime.date | None
    derived: bool = False

    @property
    def family(self) -> str:
        return self.kernel

    @property
    def key(self) -> tuple:
        return (self.kernel, self.args)


@dataclass(frozen=True)
class Skipped:
    id: str
    op: str
    reason: str


def read_file(path: str | Path) -> list[Entry]:
    """The entries of a measurements file (module docstring for the checks)."""
    src = str(path)
    p = Path(path)
    if not p.is_file():
        raise ConfigError(src, "file", "not a file" if p.exists() else "file not found")
    try:
        data = tomllib.loads(p.read_text())
    except UnicodeDecodeError as e:
        raise ConfigError(src, "toml", f"not a text file: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(src, "toml", f"not valid TOML: {e}") from None
    table = data.get("measurement")
    if not isinstance(table, list) or not table:
        raise ConfigError(src, "measurement", "must be a non-empty array of tables")
    out: list[Entry] = []
    seen: set[str] = set()
    for i, item in enumerate(table):
        out.append(_entry(item, f"{src}: measurement[{i}]", src, seen))
    return out


def _entry(item: Any, where: str, src: str, seen: set[str]) -> Entry:
    if not isinstance(item, dict):
        raise ConfigError(where, "measurement", "must be a table", type(item).__name__)
    ident = item.get("id")
    if not isinstance(ident, str) or not ident:
        raise ConfigError(where, "id", "missing or not a non-empty string", ident)
    here = f"{src}: entry {ident!r}"
    if ident in seen:
        raise ConfigError(here, "id", "duplicate id")
    seen.add(ident)
    for key in STR_FIELDS:
        if key in item and not isinstance(item[key], str):
            raise ConfigError(here, key, "must be a string", item[key])
    if not item.get("kind"):
        raise ConfigError(here, "kind", "missing")
    for key in INT_FIELDS:
        v = item.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not 1 <= v <= MAX_EXTENT):
            raise ConfigError(here, key, f"must be an integer in [1, {MAX_EXTENT}] (per tile)",
                              v)
    v = item.get("cycles")
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                          or not 0 < v <= MAX_CYCLES):
        raise ConfigError(here, "cycles", f"must be an integer in [1, {MAX_CYCLES}]", v)
    v = item.get("value")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
        raise ConfigError(here, "value", "must be a number or a string", v)
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(here, "value", "must be finite", v)
    if item.get("unit") == "percent_useful_efficiency" and isinstance(v, (int, float)) \
            and not 0 < v <= 100:
        raise ConfigError(here, "value", "an efficiency must be in (0, 100] percent", v)
    if "date" in item:
        try:
            datetime.date.fromisoformat(item["date"])
        except ValueError:
            raise ConfigError(here, "date", "must be YYYY-MM-DD", item["date"]) from None
    for key in ("dtype_in", "dtype_out"):
        if key in item and item[key] not in DTYPES:
            raise ConfigError(here, key, f"must be one of {list(DTYPES)}", item[key])
    return Entry(ident, item["kind"], dict(item))


def by_id(entries: Iterable[Entry]) -> dict[str, Entry]:
    return {e.id: e for e in entries}


def _path(what: str) -> int:
    """SOFTMAX path an entry measured: 2 split rows, 1 whole rows, 0 either."""
    w = what.lower()
    if "split" in w or "segmented" in w:
        return 2
    if "whole row" in w or "whole-row" in w:
        return 1
    return 0


def _named(kernel: str, e: Entry | None, r: int, k: int, c: int, din: str,
           dout: str) -> tuple[tuple[str, int], ...] | str:
    """Named args of our call for extents (r, k, c), or the reason it has none."""
    code = {d: i for i, d in enumerate(DTYPES)}
    what = (e.get("what", "") if e else "").lower()
    if kernel == "MATMUL":
        if din not in ("fp8", "fp16") or dout not in ("fp16", "fp32"):
            return f"GEMM {din} -> {dout}: our MATMUL takes fp8/fp16 to fp16/fp32"
        args = dict(M=r, K=k, N=c, in_dtype=code[din], out_dtype=code[dout])
    elif kernel == "REDUCE":
        args = dict(M=1, N=c, k=k, out_dtype=code[dout])
    elif kernel == "ADD":
        args = dict(M=r, N=c, dtype_a=code[din], dtype_b=code[din], dtype_c=code[dout],
                    broadcast=int("broadcast" in what))
    elif kernel in ("GELU", "LAYERNORM"):
        if dout != "fp16" or din != "fp16":
            return f"{kernel.lower()} {din} -> {dout}: ours reads and writes fp16"
        args = dict(M=r, N=c)
    elif kernel == "SOFTMAX":
        args = dict(M=r, N=c, dtype_x=code[din], dtype_y=code[dout], path=_path(what))
    elif kernel == "CAST":
        args = dict(M=r, N=c, dtype_x=code[din], dtype_y=code[dout])
    elif kernel == "COPY":
        args = dict(rows=1, row_bytes=c)
    else:
        return f"no mapping for kernel {kernel}"
    return tuple(sorted(args.items()))


_NEEDS = {"MATMUL": ("R", "K", "C"), "REDUCE": ("K", "C"), "SOFTMAX": ("R", "C")}
_VARIANTS = ("packed", "amp-left")  # layouts our kernels do not have


def _geometry(kernel: str, r: int, k: int, c: int, din: str, dout: str) -> str:
    if kernel == "MATMUL":
        return f"R{r} K{k} C{c} {din}"
    if kernel == "REDUCE":
        return f"{c} elements, {k} partials"
    if kernel == "COPY":
        return f"{c} bytes"
    return f"{r} x {c}" + ("" if din == dout == "fp16" else f" {din}->{dout}")


def select(entries: list[Entry], amp_macs_fp16: int, amp_macs_fp8: int,
           window_days: int = 3) -> tuple[list[Measurement], list[Skipped]]:
    """Usable measurements and the skipped kernel entries (module docstring)."""
    cands: list[Measurement] = []
    skipped: list[Skipped] = []
    for e in entries:
        if e.kind == "fit":
            cands.extend(_table_points(e))
            continue
        if e.kind != "kernel":
            continue
        m = _candidate(e, amp_macs_fp16, amp_macs_fp8)
        if isinstance(m, str):
            skipped.append(Skipped(e.id, e.get("op", "-"), m))
        else:
            cands.append(m)
    cands, more = _dedupe(cands)
    skipped.extend(more)
    cands, more = _current(cands, window_days)
    skipped.extend(more)
    return sorted(cands, key=lambda m: (m.kernel, m.id)), sorted(skipped, key=lambda s: s.id)


def _candidate(e: Entry, macs16: int, macs8: int) -> Measurement | str:
    op = e.get("op")
    kernel = OP_KERNELS.get(op or "")
    if kernel is None:
        return f"no kernel of ours runs op {op!r}" if op else "no op named"
    what = e.get("what", "")
    for v in _VARIANTS:
        if v in what.lower():
            return f"a {v} layout or output, which our {kernel} does not have"
    if e.get("tiles") is not None:
        return f"a figure from a run on {e.get('tiles')} tiles, not one kernel call"
    need = _NEEDS.get(kernel, ("C",))
    missing = [f for f in need if e.get(f) is None]
    if missing:
        return f"needs {'/'.join(missing)} to map to {kernel}"
    r, k, c = e.get("R", 1), e.get("K", 1), e.get("C", 1)
    din = e.get("dtype_in", "fp16")
    dout = e.get("dtype_out", "fp8" if kernel == "CAST" else "fp16")
    derived = False
    cycles = e.get("cycles")
    if cycles is None:
        if (kernel == "MATMUL" and e.get("unit") == "percent_useful_efficiency"
                and isinstance(e.get("value"), (int, float)) and e.get("value") > 0):
            peak = 2 * (macs8 if din == "fp8" else macs16)
            cycles = round(2 * r * k * c / (peak * e.get("value") / 100.0))
            derived = True
        else:
            return "no cycles (not a timed call)"
    args = _named(kernel, e, r, k, c, din, dout)
    if isinstance(args, str):
        return args
    return Measurement(e.id, op, kernel, args, int(cycles), _geometry(kernel, r, k, c, din, dout),
                       e.date, derived)


def _table_points(e: Entry) -> list[Measurement]:
    """Measurements of the `(elements, cycles)` table in a fit entry's note."""
    kernel = OP_KERNELS.get(e.get("op") or "")
    found = _TABLE.search(e.get("note", "") or "")
    if kernel is None or found is None:
        return []
    version = int(found.group(1) or 0)
    suffix = f" (table v{version})" if version else " (table)"
    out = []
    for n, cyc in _PAIR.findall(found.group(2)):
        args = _named(kernel, None, 1, 1, int(n), e.get("dtype_in", "fp16"), "fp16")
        if isinstance(args, str) or int(cyc) <= 0:
            continue
        out.append(Measurement(f"{e.id}[{n}]", e.get("op"), kernel, args, int(cyc),
                               _geometry(kernel, 1, 1, int(n), "fp16", "fp16") + suffix, None))
    return out


def _table_version(m: Measurement) -> int:
    found = re.search(r"\(table v(\d+)\)", m.geometry)
    return int(found.group(1)) if found else 0


def _dedupe(cands: list[Measurement]) -> tuple[list[Measurement], list[Skipped]]:
    """Rule 5: one measurement per (kernel, args)."""
    skipped: list[Skipped] = []
    # only the newest table version of each kernel
    newest: dict[str, int] = {}
    for m in cands:
        v = _table_version(m)
        if v:
            newest[m.kernel] = max(newest.get(m.kernel, 0), v)
    kept = []
    for m in cands:
        v = _table_version(m)
        if v and v < newest[m.kernel]:
            skipped.append(Skipped(m.id, m.op,
                                   f"table v{v} superseded by table v{newest[m.kernel]}"))
        else:
            kept.append(m)
    best: dict[tuple, Measurement] = {}
    order = sorted(kept, key=lambda m: (m.date or datetime.date.min, m.id))
    for m in order:
        prev = best.get(m.key)
        if prev is not None:
            skipped.append(Skipped(prev.id, prev.op, f"same call as {m.id}, measured later"
                                   if m.date else f"same call as {m.id}"))
        best[m.key] = m
    return list(best.values()), skipped


def _current(cands: list[Measurement], window_days: int) -> tuple[list[Measurement],
                                                                  list[Skipped]]:
    """Rule 6: per kernel, dated entries within `window_days` of its newest."""
    newest: dict[str, datetime.date] = {}
    for m in cands:
        if m.date is not None:
            newest[m.kernel] = max(newest.get(m.kernel, m.date), m.date)
    kept, skipped = [], []
    for m in cands:
        top = newest.get(m.kernel)
        if m.date is not None and top is not None and (top - m.date).days > window_days:
            skipped.append(Skipped(m.id, m.op, f"an earlier {m.kernel} version ({m.date}; "
                                               f"newest measurement {top})"))
        else:
            kept.append(m)
    return kept, skipped


def source_statement(path: str | Path) -> list[str]:
    """What a device fitted to the measurements at `path` may say of their
    origin: the `# Source:` paragraph of the file's leading comment when it
    has one, else that they are the user's own (nothing is claimed)."""
    lines: list[str] = []
    for line in Path(path).read_text(errors="replace").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    found = re.search(r"source:\s*(.+?)(?:\.\s|$)", text, flags=re.I)
    if found:
        return [f"The measurements' own header names their source: {found.group(1).strip()}."]
    return [f"The measurements are {Path(path).name}'s own; it names no public source."]
