"""The exchange schedule (simulator.xschedule): what the scheduler books, that
verify proves it, and that both engines time exchange steps from it."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_device, run, verify
from simulator.device import Device
from simulator.package import Package
from simulator.testing import PackageBuilder
from simulator.timing import package_bounds
from simulator.xschedule import (
    V_COVER,
    V_LANE,
    V_LATE,
    V_NONE,
    V_PORT,
    fabric,
    forget,
    latency,
    schedule,
    schedule_arrays,
    source_patches,
    violations,
)
from tilecommon.errors import PackageInvalid


@pytest.fixture(scope="module")
def dev() -> Device:
    return load_device("tiny")


def _exchange(dev: Device, transfers: list[tuple[int, int, int, int, int]]) -> Package:
    """One exchange step of `transfers` (src tile, src addr, dst tile, dst
    addr, bytes) between 64 KiB buffers on every tile they name."""
    b = PackageBuilder(dev)
    base = dev.memory_base + 16384
    for t in sorted({t for x in transfers for t in (x[0], x[2])}):
        b.buffer(f"buf{t}", t, base, 16384)
    b.exchange(*[(s, base + sa, d, base + da, n) for s, sa, d, da, n in transfers])
    return b.build()


def _window(pkg: Package) -> int:
    return int(pkg["step_xcycles"][pkg["step_kind"] == 1][0])


def test_a_multicast_is_one_transmission_each_receiver_hears_after_its_latency(
        dev: Device) -> None:
    rows = dev.with_costs(tiles_per_row=4)  # tiles 1, 5, 9: rows 0, 1, 2
    pkg = _exchange(rows, [(0, 0, 1, 0, 1000), (0, 0, 5, 0, 1000), (0, 0, 9, 0, 1000)])
    verify(pkg)
    assert pkg["x_send"].tolist() == [0, 0, 0]  # one send, heard by all three
    assert pkg["q_send"].tolist() == [0] and pkg["q_start"].tolist() == [0]
    c = rows.costs
    assert (c.arrival_latency_cycles, c.arrival_latency_row_cycles) == (52, 2)
    # the farthest receiver (two rows away) hears the last of 250 words at 56 + 250
    assert _window(pkg) == 56 + 250
    for engine in ("numba", "simpy"):
        assert run(pkg, numerics=False, engine=engine).cycles == \
            rows.exchange_fixed_cycles + 56 + 250


def test_a_receiver_listens_to_one_sender_at_a_time(dev: Device) -> None:
    pkg = _exchange(dev, [(0, 0, 2, 0, 400), (1, 0, 2, 400, 400)])
    verify(pkg)
    assert sorted(pkg["q_start"].tolist()) == [0, 100]  # the second waits for the port
    assert _window(pkg) == 52 + 200
    bound = int(package_bounds(pkg).max())
    assert bound == 200 and _window(pkg) >= bound


def test_the_window_of_the_engine_test_step(dev: Device) -> None:
    """The six transfers of tests/test_engine.py's exchange step: tile 5
    receiving 2001 bytes is the longest port (501 cycles), 52 cycles away."""
    pkg = _exchange(dev, [(0, 0, 1, 0, 1000), (0, 0, 2, 0, 1000), (0, 0, 3, 0, 1000),
                          (0, 2000, 4, 0, 300), (4, 1024, 5, 8, 2001),
                          (5, 3000, 3, 2000, 100)])
    verify(pkg)
    assert pkg["x_send"].tolist() == [0, 0, 0, 3, 4, 5]
    assert _window(pkg) == 52 + 501


def test_a_second_transfer_to_a_tile_is_a_send_of_its_own(dev: Device) -> None:
    pkg = _exchange(dev, [(0, 0, 1, 0, 64), (0, 0, 1, 64, 64), (0, 0, 2, 0, 64)])
    verify(pkg)
    assert pkg["x_send"].tolist() == [0, 1, 0]


def test_every_booking_is_disjoint_and_inside_the_window(dev: Device) -> None:
    """The planner's vit-micro on tiny: lanes and ports from the stored
    schedule, booked by hand here."""
    from planner import PipelineConfig, load_model, plan

    pkg = plan(load_model("vit-micro"), dev, PipelineConfig(optimization_steps=0)).package
    a, fab = pkg.arrays, fabric(dev)
    assert (violations(dev, a)[:, 0] == V_NONE).all()
    step_of = np.repeat(np.arange(pkg.n_steps), np.diff(a["step_piece"]))
    members: dict[int, list[int]] = {}
    for x, lead in enumerate(a["x_send"].tolist()):
        members.setdefault(lead, []).append(x)
    busy: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    for q in range(a["q_send"].size):
        s, lead, nb = int(step_of[q]), int(a["q_send"][q]), int(a["q_bytes"][q])
        t0, st = int(a["q_start"][q]), int(a["x_src_tile"][lead])
        lane = max(-(-nb // 4), -(-nb // 256) * 2)
        busy.setdefault(("lane", s, st), []).append((t0, t0 + lane))
        for x in members[lead]:
            d = int(a["x_dst_tile"][x])
            arr = t0 + int(latency(fab, st, d))
            port = -(-nb // 4)
            if a["q_offset"][q] == 0:
                port = max(port, 3)
            busy.setdefault(("port", s, d), []).append((arr, arr + port))
    for (_, s, _), spans in busy.items():
        spans.sort()
        assert all(e0 <= b1 for (_, e0), (b1, _) in zip(spans, spans[1:], strict=False))
        assert spans[-1][1] <= a["step_xcycles"][s]
    bounds = package_bounds(pkg)
    ex = a["step_kind"] == 1
    assert (a["step_xcycles"][ex] >= bounds[ex]).all()
    forget()  # the scheduler itself, not its memo
    again = schedule_arrays(dev, a)
    for k, v in again.items():
        np.testing.assert_array_equal(v, a[k], err_msg=k)  # deterministic


def test_a_long_unicast_cut_into_pieces_fills_a_gap_its_whole_send_cannot(
        dev: Device) -> None:
    """Tile 2 multicasts three 256-byte sends (64 cycles each, booked first:
    wider); the first and the third reach tile 1, whose port is then busy
    over [52, 116) and [180, 244).  Tile 0's 512-byte unicast to tile 1 (128
    cycles) fits the 64-cycle gap between only when cut: whole, it waits
    for the port until 244 (window 372); in two instruction-sized pieces, the
    first fills the gap at 116 and the second follows at 244 (window 308).
    Both engines time the cut schedule."""
    import dataclasses

    pkg = _exchange(dev, [(2, 0, 1, 0, 256), (2, 0, 3, 0, 256), (2, 0, 4, 0, 256),
                          (2, 0, 5, 0, 256), (2, 256, 6, 0, 256), (2, 256, 7, 0, 256),
                          (2, 256, 8, 0, 256), (2, 256, 9, 0, 256), (2, 512, 1, 256, 256),
                          (2, 512, 10, 0, 256), (2, 512, 11, 0, 256), (2, 512, 12, 0, 256),
                          (0, 0, 1, 512, 512)])
    a = pkg.arrays
    assert _window(pkg) == 372  # whole sends (no cutting: what a package gets by default)
    args = (a["step_xfer"], a["x_src_tile"], a["x_dst_tile"], a["x_bytes"], a["x_send"])
    cut = schedule(dev, *args, piece=dev.costs.send_max_bytes)
    assert int(cut["step_xcycles"].max()) == 308
    mine = cut["q_send"] == 12
    assert cut["q_offset"][mine].tolist() == [0, 256] and cut["q_bytes"][mine].tolist() == [256] * 2
    assert cut["q_start"][mine].tolist() == [64, 192]  # arriving at 116 and 244
    cpkg = dataclasses.replace(pkg, arrays={**a, **cut})
    # each piece is a send row on tile 0 and a receive row on tile 1: tables
    # sized for the whole send are too small (the planner sizes them from the
    # schedule it makes before allocation, planner.lowering.link.reserve)
    with pytest.raises(PackageInvalid, match="tile 0: fp_xtable = 8 < 16 required"):
        verify(cpkg)
    for engine in ("numba", "simpy"):
        assert run(cpkg, numerics=False, engine=engine).cycles == dev.exchange_fixed_cycles + 308
    # where cutting does not end the step sooner, the step keeps whole sends
    alone = _exchange(dev, [(0, 0, 1, 512, 512)]).arrays
    kept = schedule(dev, alone["step_xfer"], alone["x_src_tile"], alone["x_dst_tile"],
                    alone["x_bytes"], alone["x_send"], piece=dev.costs.send_max_bytes)
    assert kept["q_bytes"].tolist() == [512] and int(kept["step_xcycles"].max()) == 52 + 128


def _program_order_window(dev: Device, pkg: Package) -> int:
    """The window of `pkg`'s one exchange step booked in program order only
    (the scheduler's first order before the rotations)."""
    from simulator import xschedule

    a = {k: pkg[k].astype(np.int64) for k in ("x_send", "x_bytes", "x_src_tile", "x_dst_tile")}
    tiles = np.int64(dev.tiles)
    lead, ptr, mem = xschedule._members(a["x_send"], 0, a["x_send"].size)
    ug, uoff, ub, order = xschedule._units(lead, ptr, mem, a["x_bytes"], a["x_src_tile"], tiles)
    start = np.empty(ug.size, dtype=np.int64)
    return int(xschedule._run_units(ug, uoff, ub, order, lead, ptr, mem, a["x_src_tile"],
                                    a["x_dst_tile"], fabric(dev), tiles, start,
                                    np.int64(1) << 62))


def test_an_all_to_all_books_as_rounds_of_permutations(dev: Device) -> None:
    """Six tiles each send 400 bytes to each other (a K-split's partial
    sums): every port and lane carries 5 x 100 cycles.  In program order
    every tile first sends to the same receiver (752); in rotation order
    round r sends tile s to tile s + r, so the step ends at the bound plus
    one latency."""
    pkg = _exchange(dev, [(s, 400 * d, d, 4096 + 400 * s, 400)
                          for s in range(6) for d in range(6) if d != s])
    verify(pkg)
    assert int(package_bounds(pkg).max()) == 500
    assert _window(pkg) == 500 + 52
    assert _program_order_window(dev, pkg) == 752
    for engine in ("numba", "simpy"):
        assert run(pkg, numerics=False, engine=engine).cycles == dev.exchange_fixed_cycles + 552


def test_groups_fed_by_the_same_sources_take_them_in_turns(dev: Device) -> None:
    """Six sources each multicast a 256-byte slice to each of three groups of
    two tiles (a matmul's A blocks: one row block's K-blocks), one tile per
    physical row so that latency grows with distance.  Each group hears six
    slices (384 cycles); in program order all three groups ask the first
    source first and wait for each other (586), rotated by group each starts
    with a different source and the step ends 70 cycles after the bound
    (the latencies, 52 + 2 per row, up to 74 here)."""
    rows = dev.with_costs(tiles_per_row=1)
    pkg = _exchange(rows, [(s, 256 * j, 6 + j + 3 * m, 256 * s, 256)
                           for s in range(6) for j in range(3) for m in range(2)])
    verify(pkg)
    assert int(package_bounds(pkg).max()) == 384
    assert _window(pkg) == 454
    assert _program_order_window(rows, pkg) == 586


def test_a_step_scheduled_before_is_reused_where_it_recurs(dev: Device) -> None:
    """The memo is keyed by a step's content, not its place: the same
    transfers in another step (and at other transfer indices) get the
    schedule the scheduler gives them afresh."""
    pkg = _exchange(dev, [(0, 0, 2, 0, 400), (1, 0, 3, 0, 400), (0, 400, 3, 400, 400),
                          (0, 0, 1, 0, 64)])
    a = pkg.arrays
    n = a["x_src_tile"].size
    twice = {k: np.concatenate([a[k], a[k]]) for k in ("x_src_tile", "x_dst_tile", "x_bytes")}
    xptr = np.array([0, n, 2 * n], dtype=np.int64)
    lead = np.concatenate([a["x_send"], a["x_send"] + n])
    forget()
    fresh = schedule(dev, xptr, twice["x_src_tile"], twice["x_dst_tile"], twice["x_bytes"], lead)
    again = schedule(dev, xptr, twice["x_src_tile"], twice["x_dst_tile"], twice["x_bytes"], lead)
    for k in fresh:
        np.testing.assert_array_equal(again[k], fresh[k], err_msg=k)
    sp = fresh["step_piece"]
    assert sp.tolist() == [0, 4, 8]
    np.testing.assert_array_equal(fresh["q_send"][4:], fresh["q_send"][:4] + n)
    np.testing.assert_array_equal(fresh["q_start"][4:], fresh["q_start"][:4])
    # a fabric with other latencies is another key
    far = dev.with_costs(arrival_latency_cycles=90)
    moved = schedule(far, xptr, twice["x_src_tile"], twice["x_dst_tile"], twice["x_bytes"], lead)
    assert (moved["step_xcycles"] == fresh["step_xcycles"] + 38).all()


def test_a_step_found_valid_is_checked_again_once_its_schedule_changes(dev: Device) -> None:
    pkg = _exchange(dev, [(0, 0, 2, 0, 400), (1, 0, 3, 0, 400), (0, 400, 3, 400, 400)])
    assert violations(dev, pkg.arrays)[0, 0] == V_NONE  # now remembered as valid
    q = pkg["q_start"].copy()
    q[pkg["q_send"] == 1] = q[pkg["q_send"] == 2]  # the port of tile 3 twice
    assert violations(dev, pkg.with_arrays(q_start=q).arrays)[0, 0] == V_PORT


def test_transfers_share_a_patch_id_exactly_when_their_source_patches_agree() -> None:
    from kernels.abi import PATCH_XFER_DST, PATCH_XFER_SRC

    src, dst = PATCH_XFER_SRC, PATCH_XFER_DST
    rows = [  # target, transfer, mode, stride, table address
        (src, 0, 1, 64, 0), (src, 1, 1, 64, 0), (src, 2, 1, 128, 0), (src, 3, 2, 64, 0),
        (src, 4, 1, 64, 512), (dst, 5, 1, 64, 0), (src, 6, 1, 128, 0)]
    a = {"x_src_tile": np.zeros(8, dtype=np.int64)}
    for k, col in zip(("p_target", "p_index", "p_mode", "p_stride", "p_table_addr"),
                      zip(*rows, strict=True), strict=True):
        a[k] = np.array(col, dtype=np.int64)
    ids = source_patches(a).tolist()
    assert ids[5] == ids[7] == 0  # a destination patch, no patch
    assert ids[0] == ids[1] and ids[2] == ids[6]
    assert len({ids[0], ids[2], ids[3], ids[4]}) == 4 and 0 not in (ids[0], ids[2], ids[3], ids[4])


def test_verify_names_a_send_heard_twice_on_one_tile(dev: Device) -> None:
    pkg = _exchange(dev, [(0, 0, 1, 0, 64), (0, 0, 1, 64, 64), (0, 0, 2, 0, 64)])
    zero = np.array([0], dtype=np.int64)
    bad = pkg.with_arrays(x_send=np.zeros(3, dtype=np.int64), q_send=zero, q_offset=zero,
                          q_bytes=zero + 64, q_start=zero, step_piece=np.array([0, 1]))
    with pytest.raises(PackageInvalid, match="two transfers of the send led by transfer 0 "
                                             "land on tile 1"):
        verify(bad)


@pytest.mark.parametrize("change, kind", [
    ("drop", V_COVER), ("lane", V_LANE), ("port", V_PORT), ("late", V_LATE)])
def test_violations_name_the_first_broken_booking(dev: Device, change: str, kind: int) -> None:
    pkg = _exchange(dev, [(0, 0, 2, 0, 400), (1, 0, 3, 0, 400), (0, 400, 3, 400, 400)])
    a = dict(pkg.arrays)
    q = a["q_start"].copy()
    lead = a["q_send"]
    if change == "drop":
        keep = lead != 2
        a.update(q_send=lead[keep], q_offset=a["q_offset"][keep], q_bytes=a["q_bytes"][keep],
                 q_start=q[keep])
        a["step_piece"] = np.array([0, int(keep.sum())], dtype=np.int64)
    elif change == "lane":  # tile 0's second send on top of its first
        q[lead == 2] = q[lead == 0]
    elif change == "port":  # tile 1's send to tile 3 on top of tile 0's
        q[lead == 1] = q[lead == 2]
    else:
        q[lead == 1] = a["step_xcycles"][0]
    if change != "drop":
        a["q_start"] = q
    bad = pkg.with_arrays(**{k: a[k] for k in ("q_send", "q_offset", "q_bytes", "q_start",
                                                "step_piece")})
    row = violations(dev, bad.arrays)[0]
    assert row[0] == kind, row
    with pytest.raises(PackageInvalid, match=r"step 0: .* on tile \d+"):
        verify(bad)


def test_verify_rejects_a_send_shared_by_two_sources(dev: Device) -> None:
    pkg = _exchange(dev, [(0, 0, 2, 0, 64), (0, 64, 3, 0, 64)])
    one = np.array([0], dtype=np.int64)
    bad = pkg.with_arrays(x_send=np.array([0, 0], dtype=np.int64), q_send=one, q_offset=one,
                          q_bytes=one + 64, q_start=one, step_piece=np.array([0, 1]))
    with pytest.raises(PackageInvalid, match="x_send: a transfer shares a send"):
        verify(bad)


def test_a_package_refuses_schedule_indices_out_of_range(dev: Device) -> None:
    pkg = _exchange(dev, [(0, 0, 2, 0, 64)])
    with pytest.raises(PackageInvalid, match=r"array q_send\[0\] = 5"):
        pkg.with_arrays(q_send=np.array([5], dtype=np.int64))
    with pytest.raises(PackageInvalid, match=r"array q_start\[0\] = -1"):
        pkg.with_arrays(q_start=np.array([-1], dtype=np.int64))


def test_each_tiles_lane_and_port_bookings_are_its_send_and_receive_busy(dev: Device) -> None:
    """Tile 0 multicasts 1000 bytes to tiles 1 and 2 (its lane 250 cycles,
    each port 250) while tile 1 sends 400 to tile 0 (lane and port 100):
    both engines count each tile's booked cycles, the multicast once on its
    sender."""
    from simulator.xschedule import transfer_busy

    pkg = _exchange(dev, [(0, 0, 1, 0, 1000), (0, 0, 2, 0, 1000), (1, 8192, 0, 4096, 400)])
    verify(pkg)
    x_lane, x_port = transfer_busy(dev, pkg.arrays)
    assert x_lane.tolist() == [250, 0, 100] and x_port.tolist() == [250, 250, 100]
    for engine in ("numba", "simpy"):
        res = run(pkg, numerics=False, engine=engine)
        assert res.tile_send_busy[:3].tolist() == [250, 100, 0], engine
        assert res.tile_receive_busy[:3].tolist() == [100, 250, 250], engine
        assert res.tile_bytes_out[:3].tolist() == [1000, 400, 0]
        assert int(res.tile_send_busy[3:].sum() + res.tile_receive_busy[3:].sum()) == 0
