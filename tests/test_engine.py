"""The numba engine: Repeat vs unrolled, timing formulas, and run-time faults."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.abi import ADD, COPY
from kernels.registry import KERNELS
from simulator import load_device, run, verify
from simulator.device import Device
from simulator.engines.base import (
    F_DST_BUFFER,
    F_NO_BUFFER,
    F_RACE,
    F_UNINIT,
)
from simulator.package import Package
from simulator.testing import (
    PackageBuilder,
    ksplit_matmul,
    repeat_program,
    repeat_reference,
)
from simulator.timing import loop_patch_words
from simulator.xschedule import rescheduled

TRIPS = 5


@pytest.fixture(scope="module")
def dev() -> Device:
    return load_device("tiny")


def _repeat_io(seed: int = 3) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((TRIPS, 4, 8)).astype(np.float32)
    return {"w": w}, {"x": x}


def test_repeat_equals_unrolled_in_outputs_and_cycles(dev: Device) -> None:
    looped, unrolled = repeat_program(dev, TRIPS), repeat_program(dev, TRIPS, unrolled=True)
    verify(looped)
    verify(unrolled)
    # the loop really is a loop: one ADD vertex and two patched transfers' worth of data
    assert looped.n_vertices == 3 and unrolled.n_vertices == 2 + TRIPS
    assert looped.n_patches == 5 and int(looped["table_values"].size) == 3 * TRIPS
    params, inputs = _repeat_io()
    r_loop = run(looped, params=params, inputs=inputs)
    r_unr = run(unrolled, params=params, inputs=inputs)
    assert r_loop.ok and r_unr.ok
    for name in ("y", "hist"):
        np.testing.assert_array_equal(r_loop.outputs[name], r_unr.outputs[name])
    y, hist = repeat_reference(inputs["x"], params["w"])
    np.testing.assert_array_equal(r_loop.outputs["hist"], hist)
    # loop overhead every iteration; before each of the TRIPS - 1 jumps back the
    # busiest tile's patches (tile 0: four patched args and transfer sources)
    patched = int(loop_patch_words(looped).max())
    assert patched == 4
    overhead = (dev.costs.loop_overhead_cycles * TRIPS
                + dev.costs.patch_word_cycles * patched * (TRIPS - 1))
    assert r_loop.cycles == r_unr.cycles + overhead
    # per-step cycles: the body steps hold the sum over iterations of the unrolled steps
    body = r_loop.cycles_per_step
    unr = r_unr.cycles_per_step
    assert body[0] == unr[0] and body[-1] == unr[-1]
    assert body[2] == unr[1:-1:2].sum() and body[3] == unr[2:-1:2].sum()
    assert body[1] == 0 and body[4] == overhead
    np.testing.assert_array_equal(r_loop.tile_busy, r_unr.tile_busy)
    np.testing.assert_array_equal(r_loop.tile_bytes_in, r_unr.tile_bytes_in)
    np.testing.assert_array_equal(r_loop.tile_bytes_out, r_unr.tile_bytes_out)


def test_nested_repeat_runs_inner_body_product_times(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("src", 0, base, 64, "activation")
    b.buffer("dst", 0, base + 64, 3 * 64, "activation")
    x = b.io("x", "input", (4, 8), "fp16")
    b.io_block(x, 0, base, (0, 0), (4, 8), 0, 16)
    b.repeat(2)
    inner = b.repeat(3)
    (v,) = b.compute((0, COPY, {0: base, 1: 16, 2: base + 64, 3: 16, 4: 4, 5: 16}))
    b.patch(0, v, 2, inner, base + 64, 64)
    b.end_repeat()
    b.end_repeat()
    pkg = b.build()
    verify(pkg)
    res = run(pkg, inputs={"x": np.ones((4, 8), np.float32)})
    assert res.ok and res.vertex_invocations == 6
    one = KERNELS[COPY].cycles(pkg["v_args"][0], dev.tile_desc().as_array())
    # the inner loop jumps back 2 of 3 times per outer iteration, 1 patch on tile 0
    assert res.cycles == 6 * one + (6 + 2) * dev.costs.loop_overhead_cycles \
        + 2 * 2 * dev.costs.patch_word_cycles


def test_compute_step_is_max_over_tiles_of_summed_vertex_cycles(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    for t in range(2):
        b.buffer(f"in{t}", t, base, 1024, "activation")
        b.buffer(f"out{t}", t, base + 1024, 1024, "activation")
    cp = {1: 64, 3: 64, 5: 64}
    verts = [
        (0, COPY, {**cp, 0: base, 2: base + 1024, 4: 8}),
        (0, COPY, {**cp, 0: base + 512, 2: base + 1536, 4: 8}),
        (1, COPY, {**cp, 0: base, 2: base + 1024, 4: 12}),
    ]
    b.compute(*verts)
    pkg = b.build()
    verify(pkg)
    desc = dev.tile_desc().as_array()
    c = [KERNELS[COPY].cycles(pkg["v_args"][i], desc) for i in range(3)]
    res = run(pkg, numerics=False)
    assert res.cycles == max(c[0] + c[1], c[2])
    assert res.tile_busy[:2].tolist() == [c[0] + c[1], c[2]]


def test_exchange_step_cycles_follow_the_formula_with_multicast(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    for t in range(6):
        b.buffer(f"buf{t}", t, base, 4096, "activation")
    transfers = [
        (0, base, 1, base, 1000),  # multicast: the same source to tiles 1, 2, 3
        (0, base, 2, base, 1000),
        (0, base, 3, base, 1000),
        (0, base + 2000, 4, base, 300),  # a second, distinct source on tile 0
        (4, base + 1024, 5, base + 8, 2001),  # 2001 bytes in on tile 5 -> ceil
        (5, base + 3000, 3, base + 2000, 100),
    ]
    b.exchange(*transfers)
    pkg = b.build()
    verify(pkg)
    res = run(pkg, numerics=False)
    bytes_in = np.zeros(dev.tiles, np.int64)
    bytes_out = np.zeros(dev.tiles, np.int64)
    for _, _, dt, _, nb in transfers:
        bytes_in[dt] += nb
    bytes_out[0], bytes_out[4], bytes_out[5] = 1000 + 300, 2001, 100
    np.testing.assert_array_equal(res.tile_bytes_in, bytes_in)
    np.testing.assert_array_equal(res.tile_bytes_out, bytes_out)
    c = dev.costs
    bw_in, bw_out = c.exchange_in_bytes_per_cycle, c.exchange_out_bytes_per_cycle
    per_tile = [max(-(-int(i) // bw_in), -(-int(o) // bw_out))
                for i, o in zip(bytes_in, bytes_out, strict=True)]
    # the endpoint bound: tile 5's 2001 bytes in; the scheduled window adds the
    # arrival latency of its last word (tiny: 16 tiles on one row)
    assert max(per_tile) == 501  # ceil(2001 / 4)
    lat = c.arrival_latency_cycles
    assert res.cycles == dev.exchange_fixed_cycles + lat + max(per_tile)
    assert run(pkg, numerics=False, engine="simpy").cycles == res.cycles


def test_patched_words_count_a_multicast_send_once_per_instruction(dev: Device) -> None:
    """A source patch rewrites each send instruction of its send once: a
    multicast of one patched source counts ceil(bytes / send_max_bytes) words
    on the source tile; destination patches count one word per receive."""
    trips, nbytes = 3, 600  # 600 bytes: 3 send instructions of at most 256
    assert dev.costs.send_max_bytes == 256
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("w", 0, base, trips * nbytes, "parameter")
    for t in (1, 2, 3):
        b.buffer(f"land{t}", t, base, trips * nbytes, "activation")
    x = b.io("x", "input", (trips, nbytes // 2), "fp16")
    b.io_block(x, 0, base, (0, 0), (trips, nbytes // 2), 0, nbytes)
    loop = b.repeat(trips)
    ids = b.exchange(*[(0, base, t, base, nbytes) for t in (1, 2, 3)])
    for i in ids:  # one multicast, its source moving one block per iteration
        b.patch(1, i, 0, loop, base, nbytes)
    b.patch(2, ids[0], 0, loop, base, nbytes)  # tile 1 lands each block further on
    b.end_repeat()
    pkg = b.build()
    verify(pkg)
    # tile 0: one send of 3 instructions (not 3 transfers x 1); tile 1: one receive
    assert int(loop_patch_words(pkg).max()) == 3
    c = dev.costs
    res = run(pkg, numerics=False)
    one = c.sync_cycles + c.exchange_setup_cycles + c.arrival_latency_cycles + max(
        -(-nbytes // c.exchange_out_bytes_per_cycle), 3 * c.send_cycles,
        -(-nbytes // c.exchange_in_bytes_per_cycle), c.receive_cycles)
    assert res.cycles == trips * (one + c.loop_overhead_cycles) \
        + (trips - 1) * 3 * c.patch_word_cycles
    assert run(pkg, numerics=False, engine="simpy").cycles == res.cycles


def test_many_small_transfers_are_bound_by_their_controls(dev: Device) -> None:
    """The supervisor issues one send and one receive control per transfer:
    200 eight-byte transfers into one tile cost 200 receive controls, more
    than their 400 payload cycles would."""
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("src", 0, base, 4096, "activation")
    b.buffer("dst", 1, base, 4096, "activation")
    b.exchange(*[(0, base + 8 * i, 1, base + 8 * i, 8) for i in range(200)])
    pkg = b.build()
    verify(pkg)
    c = dev.costs
    want = max(-(-1600 // c.exchange_in_bytes_per_cycle), 200 * c.receive_cycles,
               200 * c.send_cycles)
    # the receives serialise on tile 1's port; the last arrives a latency later
    assert run(pkg, numerics=False).cycles == \
        dev.exchange_fixed_cycles + c.arrival_latency_cycles + want
    assert want == 200 * c.receive_cycles > 400


# ---- run-time faults --------------------------------------------------------------------


def _drop_transfer(pkg: Package, x: int) -> Package:
    keep = np.arange(pkg.n_transfers) != x
    sx = pkg["step_xfer"].copy()
    sx[np.searchsorted(sx, x, side="right"):] -= 1
    return rescheduled(pkg, step_xfer=sx, **{k: pkg[k][keep] for k in (
        "x_src_tile", "x_src_addr", "x_dst_tile", "x_dst_addr", "x_bytes")})


def test_dropped_transfer_is_a_read_of_unwritten_memory(dev: Device) -> None:
    pkg, params, inputs, _ = ksplit_matmul(dev)
    bad = _drop_transfer(pkg, 1)  # tile 2's partials never reach tile 0
    verify(bad)  # statically nothing is wrong: the landing buffer is still live
    res = run(bad, params=params, inputs=inputs)
    slot = int(pkg["x_dst_addr"][1])
    assert [f.code for f in res.faults[:1]] == [F_UNINIT]
    f = res.faults[0]
    assert (f.step, f.tile, f.address) == (2, 0, slot)
    assert "read of never-written memory at step 2 (COMPUTE), tile 0" in f.message


def test_short_transfer_is_a_read_of_unwritten_memory(dev: Device) -> None:
    pkg, params, inputs, _ = ksplit_matmul(dev)
    nb = pkg["x_bytes"].copy()
    nb[2] -= 64
    bad = rescheduled(pkg, x_bytes=nb)  # scheduled as the shorter transfer it is
    verify(bad)
    res = run(bad, params=params, inputs=inputs)
    assert res.faults[0].code == F_UNINIT
    assert res.faults[0].address == int(pkg["x_dst_addr"][2]) + int(nb[2])


def test_race_between_two_writers_is_reported(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 256, "activation")
    b.buffer("c", 0, base + 256, 256, "activation")
    x = b.io("a", "input", (64,), "fp32")
    b.io_block(x, 0, base, (0,), (64,), 0, 0)
    cp = {1: 64, 3: 64, 4: 4, 5: 64}
    # two vertices copy into the same destination rows
    b.compute((0, COPY, {**cp, 0: base, 2: base + 256}), (0, COPY, {**cp, 0: base, 2: base + 256}))
    res = run(b.build(), inputs={"a": np.ones(64, np.float32)})
    races = [f for f in res.faults if f.code == F_RACE]
    assert len(races) == 1
    assert races[0].step == 0 and races[0].tile == 0 and races[0].address == base + 256
    assert "vertex 0 (kernel 10) and vertex 1 (kernel 10)" in races[0].message


def test_interleaved_column_blocks_are_not_a_race(dev: Device) -> None:
    # two vertices writing disjoint column halves of the same rows: bounding boxes
    # overlap, exact byte intervals do not
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 256, "activation")
    b.buffer("c", 0, base + 256, 256, "activation")
    x = b.io("a", "input", (64,), "fp32")
    b.io_block(x, 0, base, (0,), (64,), 0, 0)
    cp = {1: 64, 3: 64, 4: 4, 5: 32}
    b.compute((0, COPY, {**cp, 0: base, 2: base + 256}),
              (0, COPY, {**cp, 0: base + 32, 2: base + 256 + 32}))
    pkg = b.build()
    verify(pkg)
    assert run(pkg, inputs={"a": np.ones(64, np.float32)}).ok


def test_out_of_range_vertex_and_transfer_are_faults_not_crashes(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 256, "activation")
    x = b.io("a", "input", (64,), "fp32")
    b.io_block(x, 0, base, (0,), (64,), 0, 0)
    far = dev.memory_end - 32
    b.compute((0, COPY, {0: base, 1: 64, 2: far, 3: 64, 4: 4, 5: 64}))
    b.exchange((0, base, 0, dev.memory_end + 64, 8))
    pkg = b.build()
    res = run(pkg, inputs={"a": np.ones(64, np.float32)})
    codes = [f.code for f in res.faults]
    assert codes == [F_NO_BUFFER, F_DST_BUFFER]  # outside every live buffer: skipped
    assert res.faults[0].address == far and res.faults[1].address == dev.memory_end + 64


def test_add_reads_its_operands(dev: Device) -> None:
    # ADD with an operand nobody wrote: the fault names the operand's address
    b = PackageBuilder(dev)
    base = dev.memory_base
    for k, name in enumerate("abc"):
        b.buffer(name, 0, base + 64 * k, 64, "activation")
    x = b.io("a", "input", (4, 8), "fp16")
    b.io_block(x, 0, base, (0, 0), (4, 8), 0, 16)
    b.compute((0, ADD, {0: base, 1: 16, 2: base + 64, 3: 16, 4: base + 128, 5: 16, 6: 4, 7: 8,
                        8: 1, 9: 1, 10: 1}))
    res = run(b.build(), inputs={"a": np.ones((4, 8), np.float32)})
    assert [(f.code, f.address) for f in res.faults] == [(F_UNINIT, base + 64)]


def test_exchange_copies_read_the_pre_step_state(dev: Device) -> None:
    # tile 0 swaps two fp32 blocks with two transfers (a race, reported) and tile 1
    # shifts a block onto itself with one overlapping transfer (no race); both
    # see the state before the step
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("pair", 0, base, 64, "activation")
    b.buffer("line", 1, base, 64, "activation")
    pair = b.io("pair", "input", (16,), "fp32")
    line = b.io("line", "input", (16,), "fp32")
    out0 = b.io("pair_out", "output", (16,), "fp32")
    out1 = b.io("line_out", "output", (16,), "fp32")
    for k, tile in ((pair, 0), (out0, 0), (line, 1), (out1, 1)):
        b.io_block(k, tile, base, (0,), (16,), 0, 0)
    b.exchange((0, base, 0, base + 32, 32), (0, base + 32, 0, base, 32),
               (1, base, 1, base + 16, 32))
    x = np.arange(16, dtype=np.float32)
    res = run(b.build(), inputs={"pair": x, "line": x + 100})
    assert [f.code for f in res.faults] == [F_RACE]
    np.testing.assert_array_equal(res.outputs["pair_out"], np.concatenate([x[8:], x[:8]]))
    want = x + 100
    want[4:12] = (x + 100)[:8]
    np.testing.assert_array_equal(res.outputs["line_out"], want)


# ---- the engine's timing against a slow, obvious Python twin ----------------------------


def naive_timing(pkg: Package) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(cycles per step, tile busy, bytes in, bytes out) by walking the program in
    Python: loops by recursion, patches applied per iteration, formulas of
    docs/contracts.md §3 written out directly."""
    from kernels.dispatch import vertex_cycles

    a, dev = pkg.arrays, pkg.device
    desc = dev.tile_desc().as_array()
    per_step = np.zeros(pkg.n_steps, dtype=np.int64)
    busy = np.zeros(pkg.tiles, dtype=np.int64)
    b_in = np.zeros(pkg.tiles, dtype=np.int64)
    b_out = np.zeros(pkg.tiles, dtype=np.int64)
    counters: dict[int, int] = {}

    def value(p: int) -> int:
        i = counters[int(a["p_loop"][p])]
        if a["p_mode"][p] == 0:
            return int(a["p_base"][p] + i * a["p_stride"][p])
        return int(a["table_values"][a["p_table"][p] + i])

    def patches(target: int, index: int) -> list[int]:
        sel = (a["p_target"] == target) & (a["p_index"] == index)
        if target:
            sel = (a["p_target"] != 0) & (a["p_index"] == index)
        return np.flatnonzero(sel).tolist()

    def walk(s: int, stop: int) -> None:
        while s < stop:
            kind = int(a["step_kind"][s])
            if kind == 2:
                end = int(a["step_match"][s])
                for i in range(int(a["step_trips"][s])):
                    counters[s] = i
                    walk(s + 1, end)
                    per_step[end] += dev.costs.loop_overhead_cycles
                    if i + 1 < int(a["step_trips"][s]):  # patches before the jump back
                        per_tile_patches: dict[int, int] = {}
                        for p in np.flatnonzero(a["p_loop"] == s).tolist():
                            i_ = int(a["p_index"][p])
                            t = int(a["v_tile"][i_] if a["p_target"][p] == 0 else
                                    a["x_src_tile"][i_] if a["p_target"][p] == 1 else
                                    a["x_dst_tile"][i_])
                            per_tile_patches[t] = per_tile_patches.get(t, 0) + 1
                        per_step[end] += dev.costs.patch_word_cycles * max(
                            per_tile_patches.values(), default=0)
                s = end + 1
                continue
            if kind == 0:
                tiles: dict[int, int] = {}
                for v in range(a["step_vtx"][s], a["step_vtx"][s + 1]):
                    args = a["v_args"][v].copy()
                    for p in patches(0, v):
                        args[a["p_arg"][p]] = value(p)
                    c = int(vertex_cycles(int(a["v_kernel"][v]), args, desc))
                    t = int(a["v_tile"][v])
                    tiles[t] = tiles.get(t, 0) + c
                    busy[t] += c
                per_step[s] += max(tiles.values(), default=0)
            elif kind == 1:
                into: dict[int, int] = {}
                receives: dict[int, int] = {}
                sources: set[tuple[int, int, int]] = set()
                for x in range(a["step_xfer"][s], a["step_xfer"][s + 1]):
                    src = int(a["x_src_addr"][x])
                    for p in patches(1, x):
                        if a["p_target"][p] == 1:
                            src = value(p)
                    nb, d = int(a["x_bytes"][x]), int(a["x_dst_tile"][x])
                    into[d] = into.get(d, 0) + nb
                    receives[d] = receives.get(d, 0) + 1
                    sources.add((int(a["x_src_tile"][x]), src, nb))
                out: dict[int, int] = {}
                sends: dict[int, int] = {}
                c = dev.costs
                for t, _, nb in sources:
                    out[t] = out.get(t, 0) + nb
                    sends[t] = sends.get(t, 0) + -(-nb // c.send_max_bytes)
                for t, n in into.items():
                    b_in[t] += n
                for t, n in out.items():
                    b_out[t] += n
                worst = max([max(-(-n // c.exchange_in_bytes_per_cycle),
                                  receives[t] * c.receive_cycles) for t, n in into.items()]
                            + [max(-(-n // c.exchange_out_bytes_per_cycle),
                                   sends[t] * c.send_cycles) for t, n in out.items()],
                            default=0)
                window = int(a["step_xcycles"][s])  # the schedule's, never under the bound
                assert window >= worst
                per_step[s] += dev.exchange_fixed_cycles + window
            s += 1

    walk(0, pkg.n_steps)
    return per_step, busy, b_in, b_out


def test_engine_timing_matches_the_python_twin(dev: Device) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import bench_simulator

    packages = [repeat_program(dev, TRIPS), repeat_program(dev, 3, unrolled=True),
                ksplit_matmul(dev)[0],
                bench_simulator.build_package(dev, 5, shape=bench_simulator.SMALL_SHAPE)]
    for pkg in packages:
        res = run(pkg, numerics=False)
        per_step, busy, b_in, b_out = naive_timing(pkg)
        np.testing.assert_array_equal(res.cycles_per_step, per_step, err_msg=pkg.name)
        np.testing.assert_array_equal(res.tile_busy, busy, err_msg=pkg.name)
        np.testing.assert_array_equal(res.tile_bytes_in, b_in, err_msg=pkg.name)
        np.testing.assert_array_equal(res.tile_bytes_out, b_out, err_msg=pkg.name)
        assert res.cycles == int(per_step.sum())


def test_written_bitmap_agrees_with_a_byte_mask() -> None:
    from simulator.access import bits_first_unset, bits_set

    rng = np.random.default_rng(2)
    bits = np.zeros((2, 8), dtype=np.uint64)  # 512 bytes per row
    mask = np.zeros((2, 512), dtype=bool)
    for _ in range(400):
        row = int(rng.integers(0, 2))
        a = int(rng.integers(0, 500))
        n = int(rng.integers(0, min(140, 512 - a) + 1))
        if rng.random() < 0.3:
            bits_set(bits, row, a, n)
            mask[row, a:a + n] = True
        unset = np.flatnonzero(~mask[row, a:a + n])
        want = a + int(unset[0]) if unset.size else -1
        assert bits_first_unset(bits, row, a, n) == want
    assert mask.any() and not mask.all()
    # the word-at-a-time test the exchange's image checks inline into their
    # parallel pass, inlined into one here
    import numba

    from simulator.access import bits_all_set

    @numba.njit(parallel=True)
    def all_set(bits, q, out):  # type: ignore[no-untyped-def]
        for i in numba.prange(q.shape[0]):
            out[i] = bits_all_set(bits, q[i, 0], q[i, 1], q[i, 2])

    q = np.array([(r, a, n) for r in range(2) for a in range(0, 512, 7)
                  for n in (0, 1, 5, 63, 64, 65, 130) if a + n <= 512], dtype=np.int64)
    got = np.zeros(len(q), dtype=np.bool_)
    all_set(bits, q, got)
    want_all = np.array([mask[r, a:a + n].all() for r, a, n in q])
    assert (got == want_all).all() and got.any() and not got.all()


def test_exchange_race_of_a_source_with_another_destination_is_reported(dev: Device) -> None:
    # adjacent destinations in one buffer are no race; a source that is
    # another transfer's destination is one (the buffer-row check finds it, the
    # exact sweep names the pair)
    def two_steps(second: tuple[tuple[int, int, int, int, int], ...]) -> Package:
        b = PackageBuilder(dev)
        base = dev.memory_base
        b.buffer("src", 0, base, 256, "activation")
        b.buffer("dst", 1, base, 256, "activation")
        x = b.io("src", "input", (64,), "fp32")
        b.io_block(x, 0, base, (0,), (64,), 0, 0)
        b.exchange((0, base, 1, base, 12), (0, base + 12, 1, base + 12, 20))
        b.exchange(*second)
        return b.build()

    base = dev.memory_base
    ones = {"src": np.ones(64, np.float32)}
    assert run(two_steps(((1, base, 1, base + 64, 32),)), inputs=ones).ok
    res = run(two_steps(((1, base, 1, base + 64, 32), (0, base, 1, base + 16, 16))), inputs=ones)
    assert [f.code for f in res.faults] == [F_RACE]
    assert res.faults[0].step == 1 and res.faults[0].tile == 1


def test_exchange_destinations_out_of_address_order_are_no_race(dev: Device) -> None:
    # the buffer-row check proves increasing destinations race-free; others
    # take the exact sweep, which must not call disjoint ones a race
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("src", 0, base, 256, "activation")
    b.buffer("dst", 1, base, 256, "activation")
    x = b.io("src", "input", (64,), "fp32")
    b.io_block(x, 0, base, (0,), (64,), 0, 0)
    y = b.io("dst", "output", (16,), "fp32")
    b.io_block(y, 1, base, (0,), (16,), 0, 0)
    b.exchange((0, base + 32, 1, base + 32, 32), (0, base, 1, base, 32))
    vals = np.arange(64, dtype=np.float32)
    res = run(b.build(), inputs={"src": vals})
    assert res.ok, res.faults
    assert np.array_equal(res.outputs["dst"], vals[:16])


def test_exchange_race_between_overlapping_live_buffers_is_reported(dev: Device) -> None:
    # an unverified package whose two live buffers on tile 1 overlap: the
    # transfers land in different buffers, and their bytes still collide
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("src", 0, base, 256, "activation")
    b.buffer("a", 1, base, 64, "activation")
    b.buffer("b", 1, base + 32, 64, "activation")
    x = b.io("src", "input", (64,), "fp32")
    b.io_block(x, 0, base, (0,), (64,), 0, 0)
    b.exchange((0, base, 1, base + 16, 32), (0, base + 64, 1, base + 40, 32))
    res = run(b.build(), inputs={"src": np.ones(64, np.float32)})
    assert [f.code for f in res.faults] == [F_RACE]
    assert res.faults[0].step == 0 and res.faults[0].tile == 1
