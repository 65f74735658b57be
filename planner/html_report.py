"""One self-contained, interactive HTML profile of a run: `tileplan report
RUN --html OUT` and `tileplan run|plan --report OUT`.

The file needs no network: plotly.js is embedded once, every figure is a
Plotly figure drawn from JSON in the page, and a few lines of inline script
sort the tables and tie the figures together.  Sections:

- the summary and the per-op table (cycles by role, share, vertices, bytes),
  sortable by any column;
- the timeline: one lane per step kind (compute, exchange, sync, loop
  control), one bar per step execution coloured by the family of the op it
  serves; hover gives step, ops and roles, cycles and bytes; zoom with the
  mouse.  Repeat loops are collapsed (each body drawn once, its steps at
  their cycles per iteration, the body shaded with its trip count) and
  expand to every iteration with the "expanded" button;
- tile maps (compute busy cycles, exchange bytes in and out, peak memory) as
  grids of tiles, hover names the tile and its value (the tile id also goes
  to the "hovered" line); the hottest tiles of each map by id;
- liveness: live tensor bytes per step over the chip (the fullest tile and
  the mean tile), and the memory of one tile — code, exchange tables and
  support against the tensor range, and its buffers over their live steps
  by address — for the tile typed into the box or clicked on a tile map
  (the fullest tile first, or `tile`);
- the optimizer's history.

Everything comes from the package (provenance, memory map), a timing-only
simulation of it (`simulator.trace.walk` lays out the executions) and the
summary.  A baseline that does not build gets `render_failure`: stage, tile
and bytes, and that tile's memory by kind at the failure as bars whose total
the page states.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernels.abi import BUFFER_KIND_NAMES, STEP_COMPUTE, STEP_EXCHANGE, STEP_REPEAT_BEGIN
from planner.breakdown import executions, op_breakdown
from planner.report import format_summary
from simulator.package import Package
from tilecommon.files import write_text_atomic

LANES = ("compute", "exchange", "sync", "loop")  # timeline lanes, top to bottom
MAPS = (("busy", "compute busy cycles"), ("bytes_in", "exchange bytes in"),
        ("bytes_out", "exchange bytes out"), ("peak", "peak memory bytes"))
HOTTEST = 8  # tiles listed per map
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")

_JS = """
const D = JSON.parse(document.getElementById('report-data').textContent);
const CFG = {displaylogo: false, responsive: true};
function lanesFig(view) {
  return {data: D.timeline[view], layout: Object.assign({}, D.timeline.layout,
    {shapes: D.timeline.shapes[view], annotations: D.timeline.annotations[view],
     xaxis: {title: {text: D.timeline.xtitle[view]}}})};
}
function showTimeline(view) {
  const f = lanesFig(view);
  Plotly.react('timeline', f.data, f.layout, CFG);
  document.getElementById('timeline').dataset.view = view;
}
function drawTile(t) {
  t = Math.max(0, Math.min(D.tiles - 1, parseInt(t, 10) || 0));
  document.getElementById('tile-input').value = t;
  const m = D.memory, lo = m.ptr[t], hi = m.ptr[t + 1], byKind = {};
  for (let i = lo; i < hi; i++) {
    const k = m.kind[i]; (byKind[k] = byKind[k] || []).push(i);
  }
  const traces = Object.keys(byKind).map(k => {
    const ix = byKind[k];
    return {type: 'bar', name: m.kinds[k], x: ix.map(i => (m.first[i] + m.last[i]) / 2),
      width: ix.map(i => m.last[i] - m.first[i] + 1), base: ix.map(i => m.addr[i]),
      y: ix.map(i => m.bytes[i]), marker: {color: D.palette[k % D.palette.length],
      line: {width: 0.3, color: '#000'}},
      customdata: ix.map(i => [m.names[i], m.bytes[i], m.first[i], m.last[i], m.addr[i]]),
      hovertemplate: '%{customdata[0]}<br>%{customdata[1]:,} bytes at %{customdata[4]:#x}'
        + '<br>live steps %{customdata[2]}..%{customdata[3]}<extra>' + m.kinds[k]
        + '</extra>'};
  });
  const f = m.fixed[t];
  Plotly.react('memmap', traces, {barmode: 'overlay', height: 420,
    title: {text: 'tile ' + t + ': ' + (hi - lo) + ' buffers; code ' + f[0].toLocaleString()
      + ', exchange tables ' + f[1].toLocaleString() + ', support ' + f[2].toLocaleString()
      + ', tensor range ' + f[3].toLocaleString() + ' bytes', font: {size: 13}},
    xaxis: {title: {text: 'step'}, range: [0, D.steps]},
    yaxis: {title: {text: 'address'}, range: [D.memory_base, D.memory_end],
            tickformat: '#x'}, margin: {t: 40}}, CFG);
  document.getElementById('memmap').dataset.tile = t;
}
function hovered(ev) {
  const p = ev.points[0];
  document.getElementById('hover-tile').textContent = p.customdata;
  document.getElementById('hover-value').textContent =
    p.data.name + ' ' + Number(p.z).toLocaleString();
}
window.addEventListener('load', () => {
  showTimeline(D.timeline.start);
  document.querySelectorAll('button.view').forEach(b =>
    b.addEventListener('click', () => showTimeline(b.dataset.view)));
  D.maps.forEach(m => {
    Plotly.newPlot('map-' + m.key, [{type: 'heatmap', z: m.z, customdata: m.tile,
      name: m.title, colorscale: 'Viridis', hoverongaps: false,
      hovertemplate: 'tile %{customdata}<br>%{z:,}<extra>' + m.title + '</extra>'}],
      {title: {text: m.title, font: {size: 13}}, height: 300, margin: {t: 36, b: 36},
       xaxis: {title: {text: 'tile mod ' + D.width}},
       yaxis: {title: {text: 'tile // ' + D.width}, autorange: 'reversed'}}, CFG);
    const div = document.getElementById('map-' + m.key);
    div.on('plotly_hover', hovered);
    div.on('plotly_click', ev => drawTile(ev.points[0].customdata));
  });
  Plotly.newPlot('liveness', D.liveness.data, D.liveness.layout, CFG);
  document.getElementById('tile-input').addEventListener('change',
    e => drawTile(e.target.value));
  drawTile(D.tile);
  document.body.dataset.rendered = document.querySelectorAll('.js-plotly-plot').length;
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
body { font-family: sans-serif; margin: 2em; max-width: 1300px; }
table { border-collapse: collapse; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
th { cursor: pointer; background: #eee; }
pre { background: #f6f6f6; padding: 1em; }
.maps { display: grid; grid-template-columns: 1fr 1fr; gap: 8px; }
.note { color: #555; font-size: 13px; }
"""


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def _head(title: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_CSS}</style><script>{_plotly_js()}</script></head><body>")


def _data_script(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f"<script type='application/json' id='report-data'>{text}</script>"


def peak_memory(pkg: Package) -> np.ndarray:
    """Bytes per tile: code + exchange tables + support + tensor range."""
    a = pkg.arrays
    return a["fp_code"] + a["fp_xtable"] + a["fp_support"] + a["fp_tensor"]


def fullest_tile(pkg: Package) -> int:
    return int(np.argmax(peak_memory(pkg))) if pkg.tiles else 0


def step_bytes(pkg: Package) -> np.ndarray:
    """int64 [S]: bytes an exchange step moves (0 for other steps)."""
    csum = np.concatenate([[0], np.cumsum(pkg["x_bytes"])])
    return (csum[pkg["step_xfer"][1:]] - csum[pkg["step_xfer"][:-1]]).astype(np.int64)


def _families(pkg: Package) -> list[str]:
    return [step[0][1] if step else "control" for step in pkg.provenance] or \
        ["control"] * pkg.n_steps


def _lane_traces(rows: Sequence[tuple[str, int, float, float, str]], pkg: Package,
                 colors: Mapping[str, str]) -> list[dict[str, Any]]:
    """One horizontal bar trace per lane from rows (lane, step, start,
    cycles, iteration text)."""
    from simulator.hardware import step_ops

    fams = _families(pkg)
    nbytes = step_bytes(pkg)
    ops = [step_ops(pkg, s) for s in range(pkg.n_steps)]
    out = []
    for lane in LANES:
        mine = [r for r in rows if r[0] == lane]
        out.append({
            "type": "bar", "orientation": "h", "name": lane, "showlegend": False,
            "y": [lane] * len(mine), "base": [r[2] for r in mine], "x": [r[3] for r in mine],
            "marker": {"color": [colors[fams[r[1]]] for r in mine]},
            "customdata": [[r[1], ops[r[1]], round(r[3]), int(nbytes[r[1]]), r[4]]
                           for r in mine],
            "hovertemplate": ("step %{customdata[0]} " + lane + "<br>%{customdata[1]}"
                              "<br>%{customdata[2]:,} cycles, %{customdata[3]:,} bytes"
                              "%{customdata[4]}<extra></extra>")})
    return out


def timeline_figures(pkg: Package, sim: Any) -> dict[str, Any]:
    """The timeline's two views as Plotly JSON: "expanded" (every execution at
    its simulated start; lanes add up to the run's cycles) and "collapsed"
    (Repeat bodies once, each step at its mean cycles per execution)."""
    from simulator.trace import walk

    fams = _families(pkg)
    colors = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(sorted(set(fams)))}
    sync = pkg.device.costs.sync_cycles
    rows: list[tuple[str, int, float, float, str]] = []
    for sp in walk(pkg, sim, np.zeros(0, dtype=np.int64)):
        if sp.what == "repeat":
            continue
        it = "".join(f"<br>iteration {c} of loop @{b}" for b, c in sp.iteration)
        if sp.what == "exchange":
            head = min(sync, sp.cycles)
            rows.append(("sync", sp.step, sp.start, head, it))
            rows.append(("exchange", sp.step, sp.start + head, sp.cycles - head, it))
        else:
            rows.append((sp.what, sp.step, sp.start, sp.cycles, it))
    # collapsed: program order, Repeat bodies once at cycles per execution
    kind, runs = pkg["step_kind"], executions(pkg)
    per = sim.cycles_per_step / np.maximum(runs, 1)
    flat: list[tuple[str, int, float, float, str]] = []
    starts = np.zeros(pkg.n_steps + 1)
    t = 0.0
    for s in range(pkg.n_steps):
        starts[s] = t
        k = int(kind[s])
        if k == STEP_REPEAT_BEGIN:
            continue
        note = f"<br>mean of {int(runs[s])} executions" if runs[s] > 1 else ""
        if k == STEP_EXCHANGE:
            part = min(float(sync), float(per[s]))
            flat.append(("sync", s, t, part, note))
            flat.append(("exchange", s, t + part, float(per[s]) - part, note))
        else:
            flat.append(("compute" if k == STEP_COMPUTE else "loop", s, t, float(per[s]), note))
        t += float(per[s])
    starts[pkg.n_steps] = t
    shapes, notes = [], []
    for b in np.flatnonzero(kind == STEP_REPEAT_BEGIN).tolist():
        e = int(pkg["step_match"][b])
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": starts[b],
                       "x1": starts[e + 1], "y0": 0, "y1": 1, "fillcolor": "grey",
                       "opacity": 0.12, "line": {"width": 0}, "layer": "below"})
        notes.append({"x": starts[b], "y": 1.02, "xref": "x", "yref": "paper",
                      "xanchor": "left", "showarrow": False, "font": {"size": 11},
                      "text": f"Repeat x{int(pkg['step_trips'][b])} (body once)"})
    legend = [{"type": "bar", "orientation": "h", "name": f, "x": [None], "y": ["compute"],
               "marker": {"color": c}} for f, c in colors.items()]
    has_loops = bool(shapes)
    return {
        "collapsed": _lane_traces(flat, pkg, colors) + legend,
        "expanded": _lane_traces(rows, pkg, colors) + legend,
        "shapes": {"collapsed": shapes, "expanded": []},
        "annotations": {"collapsed": notes, "expanded": []},
        "xtitle": {"collapsed": "cycles (Repeat bodies drawn once, at cycles per iteration)",
                   "expanded": f"cycles (all {int(sim.cycles):,})"},
        "start": "collapsed" if has_loops else "expanded",
        "loops": has_loops,
        "layout": {"barmode": "overlay", "height": 320, "margin": {"t": 40, "l": 80},
                   "yaxis": {"categoryorder": "array", "categoryarray": list(LANES[::-1]),
                             "fixedrange": True},
                   "legend": {"orientation": "h", "y": -0.35, "font": {"size": 11}},
                   "hovermode": "closest"},
    }


def map_width(tiles: int) -> int:
    return 64 if tiles > 512 else 32 if tiles > 32 else max(tiles, 1)


def tile_maps(pkg: Package, sim: Any) -> list[dict[str, Any]]:
    """Each per-tile metric as a grid (row-major, `map_width` tiles per row)
    with the tile id of each cell (-1 beyond the last tile)."""
    n, width = pkg.tiles, map_width(pkg.tiles)
    rows = -(-n // width)
    ids = np.arange(rows * width)
    values = {"busy": sim.tile_busy, "bytes_in": sim.tile_bytes_in,
              "bytes_out": sim.tile_bytes_out, "peak": peak_memory(pkg)}
    out = []
    for key, title in MAPS:
        v = np.asarray(values[key], dtype=np.int64)
        z: list[Any] = v.tolist() + [None] * (rows * width - n)
        hot = np.argsort(-v, kind="stable")[:HOTTEST]
        out.append({"key": key, "title": title,
                    "z": [z[r * width:(r + 1) * width] for r in range(rows)],
                    "tile": np.where(ids < n, ids, -1).reshape(rows, width).tolist(),
                    "hottest": [[int(t), int(v[t])] for t in hot.tolist()]})
    return out


def liveness(pkg: Package) -> dict[str, Any]:
    """Live tensor bytes per step: the fullest tile and the mean tile."""
    from simulator.trace import live_tensor_bytes

    live = live_tensor_bytes(pkg, np.arange(pkg.tiles, dtype=np.int64))
    steps = list(range(pkg.n_steps))
    top = live.max(axis=0) if live.size else np.zeros(pkg.n_steps, dtype=np.int64)
    which = live.argmax(axis=0) if live.size else np.zeros(pkg.n_steps, dtype=np.int64)
    mean = live.mean(axis=0) if live.size else np.zeros(pkg.n_steps)
    return {"data": [
        {"type": "scatter", "mode": "lines", "name": "fullest tile", "x": steps,
         "y": top.tolist(), "customdata": which.tolist(), "line": {"shape": "hv"},
         "hovertemplate": "step %{x}: %{y:,} bytes on tile %{customdata}<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "mean tile", "x": steps,
         "y": np.round(mean).astype(np.int64).tolist(), "line": {"shape": "hv"},
         "hovertemplate": "step %{x}: %{y:,} bytes per tile on average<extra></extra>"}],
        "layout": {"height": 300, "margin": {"t": 30}, "xaxis": {"title": {"text": "step"}},
                   "yaxis": {"title": {"text": "live tensor bytes"}},
                   "legend": {"orientation": "h"}}}


def memory_data(pkg: Package) -> dict[str, Any]:
    """Every buffer by tile (ptr = offsets of each tile's run) and the fixed
    regions of each tile: [code, exchange tables, support, tensor range]."""
    a = pkg.arrays
    order = np.lexsort((a["buf_addr"], a["buf_tile"]))
    tile = a["buf_tile"][order]
    ptr = np.searchsorted(tile, np.arange(pkg.tiles + 1))
    last_step = max(pkg.n_steps - 1, 0)
    first = np.clip(a["buf_first"][order], 0, last_step)
    last = np.clip(np.maximum(a["buf_last"][order], first), 0, last_step)
    names = [f"buffer {int(b)}" for b in order.tolist()]
    return {"ptr": ptr.tolist(), "kind": a["buf_kind"][order].tolist(),
            "addr": a["buf_addr"][order].tolist(), "bytes": a["buf_bytes"][order].tolist(),
            "first": first.tolist(), "last": last.tolist(), "names": names,
            "kinds": list(BUFFER_KIND_NAMES),
            "fixed": np.stack([a["fp_code"], a["fp_xtable"], a["fp_support"],
                               a["fp_tensor"]], axis=1).tolist()}


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


def _hottest_table(maps: list[dict[str, Any]]) -> str:
    out = ["<table id='hottest'><thead><tr><th>map</th>"
           + "".join(f"<th>#{i + 1}</th>" for i in range(HOTTEST)) + "</tr></thead><tbody>"]
    for m in maps:
        out.append(f"<tr><td>{m['title']}</td>" + "".join(
            f"<td title='{v:,}'>tile {t}</td>" for t, v in m["hottest"]) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


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
    tl = timeline_figures(pkg, sim)
    maps = tile_maps(pkg, sim)
    data = {"tiles": pkg.tiles, "steps": pkg.n_steps, "tile": tile,
            "width": map_width(pkg.tiles), "palette": list(PALETTE),
            "memory_base": pkg.device.memory_base, "memory_end": pkg.device.memory_end,
            "timeline": tl, "maps": maps, "liveness": liveness(pkg),
            "memory": memory_data(pkg)}
    buttons = ("<p>Repeat loops: <button class='view' data-view='collapsed'>collapsed</button>"
               " <button class='view' data-view='expanded'>expanded</button></p>"
               if tl["loops"] else "")
    parts = [
        _head(title),
        f"<h1>{html.escape(title)}</h1>",
        f"<h2>Summary</h2><pre>{html.escape(format_summary(summary))}</pre><p>{stats}</p>",
        "<h2>Cycles by op</h2><p class='note'>Click a column to sort.</p>",
        _ops_table(rows, sim.cycles),
        "<h2>Timeline</h2><p class='note'>One lane per step kind; hover a bar for its step, "
        "ops, cycles and bytes; drag to zoom, double-click to reset.</p>", buttons,
        f"<div id='timeline' data-lanes='{json.dumps(list(LANES))}'></div>",
        "<h2>Per tile</h2><p class='note'>Hover a cell for its tile; click it to show that "
        "tile's memory below. Hovered: tile <b id='hover-tile'>-</b> "
        "<span id='hover-value'></span></p>",
        "<div class='maps'>" + "".join(f"<div id='map-{m['key']}'></div>" for m in maps)
        + "</div>",
        "<h3>Hottest tiles</h3>", _hottest_table(maps),
        "<h2>Liveness</h2><div id='liveness'></div>",
        f"<h2>Memory of a tile</h2><p>Tile <input id='tile-input' type='number' min='0' "
        f"max='{pkg.tiles - 1}' value='{tile}'> (fullest: tile {fullest_tile(pkg)})</p>",
        "<div id='memmap'></div>",
        "<h2>Optimizer history</h2>", _history_table(summary),
        _data_script(data), f"<script>{_JS}</script></body></html>",
    ]
    return "\n".join(parts)


FIXED_REGIONS = ("code", "exchange-table", "support")


def failure_bars(failure: Any) -> list[tuple[str, int]]:
    """The failing tile's memory at the failure as bars.  An allocate
    failure's profile holds the fixed regions and the peak of live tensor
    bytes (plus tensor bytes by kind over the whole program, which are never
    all live at once): its bars are the fixed regions and that peak, the
    memory the tile needs at its fullest step.  Otherwise the profile's
    buffers by kind.  Largest first."""
    prof = {k: int(v) for k, v in dict(getattr(failure, "profile", {}) or {}).items()}
    if "peak_live_tensor" in prof:
        prof = {k: prof[k] for k in (*FIXED_REGIONS, "peak_live_tensor") if k in prof}
    return sorted(((k, v) for k, v in prof.items() if v), key=lambda kv: (-kv[1], kv[0]))


def render_failure(failure: Any, title: str, capacity: int) -> str:
    """The report of a baseline that did not build: the failing stage, tile
    and bytes, and that tile's memory at the point of failure by kind, whose
    total the page states beside the tile's capacity."""
    bars = failure_bars(failure)
    total = sum(v for _, v in bars)
    where = f"tile {failure.tile}" if failure.tile >= 0 else "the device"
    fig = {"data": [{"type": "bar", "orientation": "h", "y": [k for k, _ in bars],
                     "x": [v for _, v in bars], "marker": {"color": "#d62728"},
                     "hovertemplate": "%{y}: %{x:,} bytes<extra></extra>"}],
           "layout": {"height": 120 + 28 * len(bars), "margin": {"l": 180, "t": 20},
                      "xaxis": {"title": {"text": "bytes"}},
                      "yaxis": {"autorange": "reversed"},
                      "shapes": [{"type": "line", "x0": capacity, "x1": capacity, "y0": 0,
                                  "y1": 1, "yref": "paper", "line": {"dash": "dash"}}]}}
    body = (f"<div id='failure-bars' data-total='{total}'></div><script>Plotly.newPlot("
            f"'failure-bars', {json.dumps(fig['data'])}, {json.dumps(fig['layout'])}, "
            "{displaylogo: false});</script>" if bars else "<p>(no memory profile)</p>")
    return "\n".join([
        _head(title),
        f"<h1>{html.escape(title)}: the baseline did not build</h1>",
        f"<pre>{html.escape(str(failure))}</pre>",
        f"<p>stage <b>{html.escape(failure.stage)}</b>, {where}: needs "
        f"{failure.need:,} bytes, has {failure.have:,}.</p>",
        f"<h2>Memory of {where} at the failure</h2>",
        f"<p id='failure-total'>The bars add up to {total:,} bytes (the tile holds "
        f"{capacity:,}; dashed line).</p>" if bars else "", body,
        "</body></html>"])


def write_report(path: str | os.PathLike[str], pkg: Package, summary: Mapping[str, Any],
                 tile: int | None = None) -> Path:
    """Render and write the report atomically."""
    return write_text_atomic(Path(path), render(pkg, summary, tile))
