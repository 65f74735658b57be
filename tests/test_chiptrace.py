"""The full-chip Perfetto trace (simulator/chiptrace.py): every tile's busy
spans, parsed back with Perfetto's own messages, agree with the simulation;
the 27-layer siglip-so400m-map trace covers all 1472 tiles (slow)."""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from planner import PipelineConfig, load_model, run_model
from planner.cli import main
from simulator import load_device, run
from simulator.chiptrace import TILE_UUID, TILES_UUID, write_chip_trace
from simulator.hardware import step_ops
from simulator.package import Package
from simulator.trace import step_executions
from simulator.xschedule import tile_windows


def parse(path: Path) -> dict[str, Any]:
    """Tracks, interned names and slices of a trace file, checked for balance."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace.FromString(path.read_bytes())
    tracks: dict[int, Any] = {}
    names: dict[int, str] = {}
    open_: dict[int, list[tuple[int, str]]] = defaultdict(list)
    slices: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    counters: dict[int, list[int]] = defaultdict(list)
    last_ts = 0
    for i, p in enumerate(trace.packet):
        assert p.trusted_packet_sequence_id == 1
        assert p.sequence_flags == (1 if i == 0 else 2)  # cleared once, then needed
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
            continue
        for e in p.interned_data.event_names:
            assert e.iid not in names
            names[e.iid] = e.name
        ev = p.track_event
        assert ev.track_uuid in tracks
        if ev.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_[ev.track_uuid].append((p.timestamp, names[ev.name_iid]))
            last_ts = max(last_ts, p.timestamp)
        elif ev.type == TrackEvent.TYPE_SLICE_END:
            t0, name = open_[ev.track_uuid].pop()
            assert p.timestamp >= t0
            slices[ev.track_uuid].append((t0, p.timestamp, name))
        else:
            assert ev.type == TrackEvent.TYPE_COUNTER
            counters[ev.track_uuid].append(ev.counter_value)
    assert not any(open_.values()), "a slice never ended"
    return {"tracks": tracks, "names": names, "slices": slices, "counters": counters,
            "packets": len(trace.packet)}


@pytest.fixture(scope="module")
def micro() -> tuple[Package, Any]:
    out = run_model(load_model("vit-micro"), load_device("tiny"),
                    PipelineConfig(optimization_steps=0), numerics=False)
    pkg = out.result.package
    return pkg, run(pkg, numerics=False)


def test_every_tile_and_step_agrees_with_the_simulation(micro: tuple[Package, Any],
                                                        tmp_path: Path) -> None:
    pkg, sim = micro
    ct = write_chip_trace(pkg, sim, tmp_path / "m.pftrace")
    got = parse(ct.path)
    assert got["packets"] == ct.packets and ct.bytes == ct.path.stat().st_size
    tiles = {u: d for u, d in got["tracks"].items() if d.parent_uuid == TILES_UUID}
    assert sorted(tiles) == [TILE_UUID + t for t in range(pkg.tiles)] == sorted(
        TILE_UUID + t for t in range(ct.tiles))
    ns = 1e9 / pkg.device.clock_hz
    compute = [[(a, b) for a, b, name in got["slices"][TILE_UUID + t]
                if not name.startswith("xchg ")] for t in range(pkg.tiles)]
    busy = np.array([sum(b - a for a, b in c) for c in compute])
    n = np.array([len(c) for c in compute])
    xchg = sum(len(got["slices"][TILE_UUID + t]) for t in range(pkg.tiles)) - int(n.sum())
    assert int(n.sum()) + xchg == ct.tile_slices > 0
    # each slice rounds its two ends to whole ns: at most one ns off per slice
    assert np.all(np.abs(busy - sim.tile_busy * ns) <= n + 1e-6)
    # an exchange slice per (execution, tile with a booking in its schedule)
    x_step, x_tile, first, end = tile_windows(pkg.device, pkg.arrays)
    assert (end > first).all() and xchg == int(step_executions(pkg)[x_step].sum()) > 0
    steps = got["slices"][1]
    assert max(b for _, b, _ in steps) == round(sim.cycles * ns)
    # step slices are named by the graph ops they serve, plus sync and loop overhead
    served = {step_ops(pkg, s) for s in range(pkg.n_steps)}
    named = {name for _, _, name in steps}
    assert "sync" in named and any(n.startswith("encoder/mm_q") for n in named)
    assert {n for n in named if n != "sync" and not n.startswith("loop overhead")} <= served
    assert max(got["counters"][3]) >= max(got["counters"][4]) > 0


def test_cli_writes_the_chip_trace(micro: tuple[Package, Any], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from simulator import save_package

    pkg, _ = micro
    save_package(pkg, tmp_path / "pkg")
    out = tmp_path / "t.pftrace"
    assert main(["simulate", str(tmp_path / "pkg"), "--no-numerics", "--trace", str(out),
                 "--quiet"]) == 0
    said = capsys.readouterr().out
    assert f"{pkg.tiles} tiles" in said and "ns at 1.5 GHz" in said
    assert len([u for u, d in parse(out)["tracks"].items()
                if d.parent_uuid == TILES_UUID]) == pkg.tiles
    assert main(["simulate", str(tmp_path / "pkg"), "--trace", str(tmp_path / "x.pftrace"),
                 "--trace-tiles", "1,2"]) == 2
    assert "--trace-tiles" in capsys.readouterr().err
    assert not (tmp_path / "x.pftrace").exists()


@pytest.mark.slow
def test_the_27_layer_trace_covers_every_tile(tmp_path: Path) -> None:
    """siglip-so400m-map (27 layers, c600, default baseline): 1472 tile tracks,
    each with slices; loaded by Perfetto's TraceProcessor when its
    trace_processor_shell is at hand (PERFETTO_TP_BIN or on PATH: the package
    downloads it otherwise, which needs the network)."""
    out = run_model(load_model("siglip-so400m-map"), load_device("c600"),
                    PipelineConfig(optimization_steps=0), numerics=False)
    pkg = out.result.package
    sim = run(pkg, numerics=False)
    ct = write_chip_trace(pkg, sim, tmp_path / "s.pftrace")
    got = parse(ct.path)
    tiles = [u - TILE_UUID for u, d in got["tracks"].items() if d.parent_uuid == TILES_UUID]
    assert sorted(tiles) == list(range(1472)) == list(range(pkg.tiles))
    assert all(got["slices"][TILE_UUID + t] for t in tiles)
    shell = os.environ.get("PERFETTO_TP_BIN") or shutil.which("trace_processor_shell")
    if shell is None:
        pytest.skip("trace_processor_shell not available offline; the trace parsed with "
                    "Perfetto's own messages above")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tp = TraceProcessor(trace=str(ct.path), config=TraceProcessorConfig(bin_path=shell))
    try:
        n = tp.query("select count(distinct track_id) as n from slice").as_pandas_dataframe()
        assert int(n["n"][0]) >= 1472
    finally:
        tp.close()
