"""One self-contained HTML profile of a run: `tileplan report RUN --html OUT`
and `tileplan run|plan --report OUT`.

The file needs no network: figures are matplotlib PNGs inlined as data URIs,
the per-op table sorts with a few lines of inline script.  Sections: the
summary; the per-op table (cycles by role, share of the total, vertices,
bytes moved); a timeline of the steps coloured by op family, Repeat bodies
shaded; per-tile heat maps (compute busy, exchange bytes in and out, peak
memory); the memory map of one tile over the steps (buffers as bars over
their live range, coloured by kind; the fullest tile unless `tile` is
given); the optimizer's history.  Everything comes from the package (its
provenance and memory map), a timing-only simulation of it and the summary.
A baseline that does not build gets `render_failure`: the failing stage,
tile and bytes, and that tile's memory by kind against its capacity.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kernels.abi import BUFFER_KIND_NAMES, STEP_COMPUTE, STEP_EXCHANGE, STEP_REPEAT_BEGIN
from planner.breakdown import executions, op_breakdown
from planner.report import format_summary
from simulator.package import Package
from tilecommon.files import write_text_atomic

_SORT_JS = """
window.addEventListener('load', () => {  // what rendered, for a headless check
  const imgs = Array.from(document.images).filter(i => i.naturalWidth > 0);
  document.body.dataset.imagesRendered = imgs.length;
  document.body.dataset.opRows = document.querySelectorAll('#ops tbody tr').length;
});
document.querySelectorAll('table.sortable th').forEach((th, col) => {
  th.addEventListener('click', () => {
    const body = th.closest('table').tBodies[0];
    const rows = Array.from(body.rows);
    const num = r => parseFloat(r.cells[col].dataset.v ?? r.cells[col].textContent);
    const asc = th.dataset.asc !== '1';
    rows.sort((a, b) => { const x = num(a), y = num(b);
      return (isNaN(x) || isNaN(y)) ? a.cells[col].textContent.localeCompare(
        b.cells[col].textContent) * (asc ? 1 : -1) : (x - y) * (asc ? 1 : -1); });
    th.dataset.asc = asc ? '1' : '0';
    rows.forEach(r => body.appendChild(r));
  });
});
"""
_CSS = """
body { font-family: sans-serif; margin: 2em; max-width: 1200px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
th { cursor: pointer; background: #eee; }
pre { background: #f6f6f6; padding: 1em; }
img { max-width: 100%; }
"""


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _family_colors(families: list[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {f: cmap(i % 10) for i, f in enumerate(sorted(set(families)))}


def timeline(pkg: Package, cycles_per_step: np.ndarray) -> str:
    """Steps in program order, bar length = cycles (all iterations), coloured
    by the family of the first op each step serves; Repeat bodies shaded."""
    plt = _plt()
    fams = [step[0][1] if step else "control" for step in pkg.provenance] or \
        ["control"] * pkg.n_steps
    colors = _family_colors(fams)
    fig, ax = plt.subplots(figsize=(11, 2.6))
    x = np.concatenate([[0], np.cumsum(cycles_per_step)])
    for s in range(pkg.n_steps):
        ax.barh(0, cycles_per_step[s], left=x[s], color=colors[fams[s]], height=0.8)
    kind, match = pkg["step_kind"], pkg["step_match"]
    for b in np.flatnonzero(kind == STEP_REPEAT_BEGIN).tolist():
        e = int(match[b])
        ax.axvspan(x[b], x[e + 1], color="grey", alpha=0.12)
        ax.text(x[b], 0.5, f"Repeat x{int(pkg['step_trips'][b])}", fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("cycles")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
              labels=list(colors), fontsize=7, ncol=min(len(colors), 8), loc="upper center",
              bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    return _png(fig)


def peak_memory(pkg: Package) -> np.ndarray:
    """Bytes per tile: code + exchange tables + support + tensor range."""
    a = pkg.arrays
    return a["fp_code"] + a["fp_xtable"] + a["fp_support"] + a["fp_tensor"]


def heat_maps(pkg: Package, sim: Any) -> str:
    """Per-tile compute busy, exchange bytes in and out, and peak memory, each
    as a grid of tiles (row-major, 32 or 64 per row)."""
    plt = _plt()
    n = pkg.tiles
    width = 64 if n > 512 else 32 if n > 32 else max(n, 1)
    rows = -(-n // width)
    fig, axes = plt.subplots(2, 2, figsize=(11, 5.5))
    for ax, (title, values) in zip(axes.flat, (
            ("compute busy cycles", sim.tile_busy), ("exchange bytes in", sim.tile_bytes_in),
            ("exchange bytes out", sim.tile_bytes_out), ("peak memory bytes", peak_memory(pkg))),
            strict=True):
        grid = np.full(rows * width, np.nan)
        grid[:n] = values
        im = ax.imshow(grid.reshape(rows, width), aspect="auto", cmap="viridis")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"tile mod {width}", fontsize=8)
        ax.set_ylabel(f"tile // {width}", fontsize=8)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return _png(fig)


def fullest_tile(pkg: Package) -> int:
    return int(np.argmax(peak_memory(pkg))) if pkg.tiles else 0


def memory_map(pkg: Package, tile: int) -> str:
    """The buffers of `tile` as bars: x = steps they live over, y = address."""
    plt = _plt()
    a = pkg.arrays
    on = np.flatnonzero(a["buf_tile"] == tile)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    cmap = plt.get_cmap("tab10")
    last_step = max(pkg.n_steps - 1, 0)
    seen: set[int] = set()
    for b in on.tolist():
        kind = int(a["buf_kind"][b])
        lo, hi = int(a["buf_first"][b]), int(a["buf_last"][b])
        lo, hi = max(lo, 0), min(max(hi, lo), last_step)
        label = BUFFER_KIND_NAMES[kind] if kind not in seen else None
        seen.add(kind)
        ax.broken_barh([(lo, hi - lo + 1)], (int(a["buf_addr"][b]), int(a["buf_bytes"][b])),
                       facecolors=cmap(kind % 10), edgecolor="black", linewidth=0.2,
                       label=label)
    ax.set_xlim(0, max(pkg.n_steps, 1))
    ax.set_ylim(pkg.device.memory_base, pkg.device.memory_end)
    ax.set_xlabel("step")
    ax.set_ylabel("address")
    ax.set_title(f"tile {tile}: {on.size} buffers", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return _png(fig)


def _ops_table(rows: list[dict[str, Any]], total: int) -> str:
    roles = sorted({r for o in rows for r in o["roles"]})
    head = ["op", "family", "cycles", "share", "compute", "exchange", "sync",
            *(f"as {r}" for r in roles), "vertices", "bytes"]
    out = ["<table class='sortable' id='ops'><thead><tr>"
           + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for o in rows:
        cells = [html.escape(o["op"]), html.escape(o["family"]), o["cycles"],
                 f"{100 * o['cycles'] / max(total, 1):.1f}%", o["compute"], o["exchange"],
                 o["sync"], *(o["roles"].get(r, 0) for r in roles), o["vertices"], o["bytes"]]
        out.append("<tr>" + "".join(
            f"<td data-v='{c}'>{c:,}</td>" if isinstance(c, int) else f"<td>{c}</td>"
            for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _history_table(summary: Mapping[str, Any]) -> str:
    props = list(summary.get("proposals") or [])
    if not props:
        return "<p>No proposals evaluated (baseline only).</p>"
    base = summary.get("baseline_cycles")
    head = ["#", "kind", "proposal", "estimated gain", "cycles", "accepted", "why not"]
    out = ["<table class='sortable' id='history'><thead><tr>"
           + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for i, p in enumerate(props):
        why = "" if p.get("accepted") else (p.get("why") or "not cheaper")
        out.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            i + 1, p.get("kind"), p.get("description"), p.get("estimated_gain"),
            p.get("cycles"), "yes" if p.get("accepted") else "no", why)) + "</tr>")
    out.append("</tbody></table>")
    return f"<p>baseline {base} cycles</p>" + "\n".join(out)


def render(pkg: Package, summary: Mapping[str, Any], tile: int | None = None) -> str:
    """The report's HTML text."""
    from simulator import run

    sim = run(pkg, numerics=False)
    rows = op_breakdown(pkg, sim.cycles_per_step)
    tile = fullest_tile(pkg) if tile is None else tile
    if not 0 <= tile < pkg.tiles:
        raise ValueError(f"tile {tile} outside 0..{pkg.tiles - 1}")
    kinds = pkg["step_kind"]
    runs = executions(pkg)
    stats = (f"{pkg.n_steps} steps ({int((kinds == STEP_COMPUTE).sum())} compute, "
             f"{int((kinds == STEP_EXCHANGE).sum())} exchange), "
             f"{int((runs * (kinds != STEP_REPEAT_BEGIN)).sum())} step executions")
    title = f"tileplan: {summary.get('model', pkg.name)} on {pkg.device.name}"
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<h2>Summary</h2><pre>{html.escape(format_summary(summary))}</pre><p>{stats}</p>",
        "<h2>Cycles by op</h2><p>Click a column to sort.</p>",
        _ops_table(rows, sim.cycles),
        "<h2>Timeline</h2>",
        f"<img id='timeline' alt='timeline' src='{timeline(pkg, sim.cycles_per_step)}'>",
        "<h2>Per tile</h2>", f"<img id='heatmaps' alt='heat maps' src='{heat_maps(pkg, sim)}'>",
        f"<h2>Memory map of tile {tile}</h2>",
        f"<img id='memmap' alt='memory map' src='{memory_map(pkg, tile)}'>",
        "<h2>Optimizer history</h2>", _history_table(summary),
        f"<script>{_SORT_JS}</script></body></html>",
    ]
    return "\n".join(parts)


def render_failure(failure: Any, title: str, capacity: int) -> str:
    """The report of a baseline that did not build: the failing stage, tile
    and bytes, and that tile's memory at the point of failure (by kind)."""
    plt = _plt()
    prof = dict(getattr(failure, "profile", {}) or {})
    img = ""
    if prof:
        fig, ax = plt.subplots(figsize=(8, 0.6 + 0.35 * len(prof)))
        names = sorted(prof, key=lambda k: -prof[k])
        ax.barh(names, [prof[k] for k in names], color="tab:red")
        ax.axvline(capacity, color="black", linestyle="--", label=f"tile memory {capacity:,}")
        ax.set_xlabel("bytes")
        ax.legend(fontsize=8)
        fig.tight_layout()
        img = f"<img id='memmap' alt='memory at failure' src='{_png(fig)}'>"
    where = f"tile {failure.tile}" if failure.tile >= 0 else "the device"
    return "\n".join([
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}: the baseline did not build</h1>",
        f"<pre>{html.escape(str(failure))}</pre>",
        f"<p>stage <b>{html.escape(failure.stage)}</b>, {where}: needs "
        f"{failure.need:,} bytes, has {failure.have:,}.</p>",
        f"<h2>Memory of {where} at the failure</h2>", img or "<p>(no memory profile)</p>",
        "</body></html>"])


def write_report(path: str | os.PathLike[str], pkg: Package, summary: Mapping[str, Any],
                 tile: int | None = None) -> Path:
    """Render and write the report atomically."""
    return write_text_atomic(Path(path), render(pkg, summary, tile))
