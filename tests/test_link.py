"""planner.lowering.link: reservations, patches (arithmetic and table), memory map,
verify + simulate."""

from __future__ import annotations

import numpy as np
import pytest
from handprog import NBYTES, loop_program, loop_reference

from kernels.abi import (
    BUF_CODE,
    BUF_SUPPORT,
    BUF_XTABLE,
    PATCH_ARITH,
    PATCH_TABLE,
    TABLE_ENTRY_BYTES,
)
from planner.lowering.allocate import allocate
from planner.lowering.link import link, reserve
from planner.lowering.schedule import schedule
from simulator.device import load_device
from simulator.verify import verify
from tilecommon.errors import BuildFailure

TINY = load_device("tiny")


def _linked(trips: int):
    p = loop_program(trips)
    s = schedule(p)
    res = reserve(p, s, TINY)
    alloc = allocate(p, s, TINY, res.overheads)
    pkg, stats = link(p, s, alloc, res, TINY, "loop", {"trips": trips})
    return p, res, alloc, pkg, stats


def test_reserve_counts() -> None:
    """The footprint model on a hand-made program, every term non-zero."""
    dev = TINY.with_costs(runtime_bytes=1000, step_code_bytes=24, loop_code_bytes=40,
                          xt_jump_bytes=4, xt_phase_bytes=8, xt_send_long_bytes=4,
                          xt_long_bytes=NBYTES - 1)
    c = dev.costs
    p = loop_program(3)
    res = reserve(p, schedule(p), dev)
    o = res.overheads
    copy, add = c.image_bytes(10), c.image_bytes(4)
    r8 = lambda n: -(-n // 8) * 8  # noqa: E731
    used = c.runtime_bytes + c.loop_code_bytes  # every tile in use runs the one loop
    # tile 1: copy + add vertices (the body's add once) in two compute steps; one
    # send and one receive (its first in the phase: a jump), each in its own phase
    assert o.code[1] == r8(used + 2 * c.vertex_code_bytes + 2 * c.step_code_bytes + copy + add)
    xt = c.xt_send_bytes + c.xt_send_long_bytes + c.xt_receive_bytes + c.xt_jump_bytes \
        + 2 * c.xt_phase_bytes
    assert o.xtable[1] == r8(xt)
    assert o.support[1] == r8(c.support_bytes + 2 * 3 * TABLE_ENTRY_BYTES)
    # tile 0 holds x and y, sends x and receives y, runs no vertex
    assert o.code[0] == r8(used) and o.xtable[0] == r8(xt)
    assert o.support[0] == c.support_bytes
    assert o.support[3] == o.code[3] == 0  # an unused tile holds nothing


def test_three_trips_table_patches_verify() -> None:
    p, res, alloc, pkg, stats = _linked(3)
    verify(pkg)
    a = pkg.arrays
    modes = a["p_mode"].tolist()
    assert sorted(modes) == [PATCH_ARITH, PATCH_TABLE, PATCH_TABLE]
    assert stats.table_patches == 2 and stats.arithmetic_patches == 1
    ping = next(b.id for b in p.bufs if b.name == "ping")
    pong = next(b.id for b in p.bufs if b.name == "pong")
    ap, bp = int(alloc.addr[ping]), int(alloc.addr[pong])
    tables = a["table_values"].reshape(2, 3).tolist()
    assert tables == [[ap, bp, ap], [bp, ap, bp]]
    w = next(b.id for b in p.bufs if b.name == "w")
    ar = int(np.flatnonzero(a["p_mode"] == PATCH_ARITH)[0])
    assert (a["p_base"][ar], a["p_stride"][ar]) == (alloc.addr[w], NBYTES)
    # tables sit in tile 1's support buffer, after the runtime support bytes
    sup = np.flatnonzero((a["buf_kind"] == BUF_SUPPORT) & (a["buf_tile"] == 1))[0]
    t_addr = a["p_table_addr"][a["p_mode"] == PATCH_TABLE]
    assert (t_addr >= a["buf_addr"][sup] + TINY.costs.support_bytes).all()
    assert (a["p_table_tile"][a["p_mode"] == PATCH_TABLE] == 1).all()


def test_two_trips_all_arithmetic() -> None:
    _, _, _, pkg, stats = _linked(2)
    verify(pkg)
    assert stats.table_patches == 0 and stats.arithmetic_patches == 3
    assert pkg.arrays["table_values"].size == 0


def test_memory_map_layout() -> None:
    _, res, alloc, pkg, _ = _linked(3)
    a = pkg.arrays
    for kind, size in ((BUF_CODE, res.overheads.code), (BUF_XTABLE, res.overheads.xtable),
                       (BUF_SUPPORT, res.overheads.support)):
        m = a["buf_kind"] == kind
        assert np.array_equal(np.sort(a["buf_tile"][m]), np.flatnonzero(size > 0))
        assert (a["buf_first"][m] == 0).all() and (a["buf_last"][m] == pkg.n_steps - 1).all()
    code = (a["buf_kind"] == BUF_CODE) & (a["buf_tile"] == 1)
    assert a["buf_addr"][code][0] == TINY.memory_base
    assert (a["fp_tensor_lo"] == alloc.tensor_lo).all()
    assert (a["fp_tensor"] == a["fp_tensor_hi"] - a["fp_tensor_lo"]).all()


@pytest.mark.parametrize("trips", [2, 3])
def test_simulates_to_reference(trips: int) -> None:
    from simulator.run import run

    _, _, _, pkg, _ = _linked(trips)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((trips, 4, 8)).astype(np.float32)
    sim = run(pkg, params={"w": w}, inputs={"x": x, "s": x}, numerics=True)
    assert not sim.faults, sim.faults
    want = loop_reference(x, w).astype(np.float32)
    assert np.array_equal(sim.outputs["y"], want)
    assert sim.cycles > 0


def test_seq_length_mismatch_fails() -> None:
    p = loop_program(3)
    for it in p.items:
        if getattr(it, "trips", 0) == 3:
            object.__setattr__(it, "trips", 2)
    s = schedule(p)
    res = reserve(p, s, TINY)
    alloc = allocate(p, s, TINY, res.overheads)
    with pytest.raises(BuildFailure, match="seq of 3 addresses in a 2-trip Repeat"):
        link(p, s, alloc, res, TINY, "bad", {})


def _transfer_loop_program(trips: int):
    """Each iteration moves layer i of w (tile 0, `iter_stride`) into a
    ping-pong landing pair on tile 1 (`seq` destination) and copies it to y:
    after the loop y = w[trips - 1]."""
    from handprog import LD, ROWS, copy_vertex

    from planner.lowering.program import IOBlock, LoopMark, Phase, Program, Ref, Transfer, Vertex

    p = Program()
    w = p.new_buf(0, trips * NBYTES, "parameter", "w", persistent=True)
    y = p.new_buf(1, NBYTES, "activation", "y", persistent=True)
    pair = (p.new_buf(1, NBYTES, "exchange-landing", "land0"),
            p.new_buf(1, NBYTES, "exchange-landing", "land1"))
    seq = tuple((pair[i % 2], 0) for i in range(trips))
    p.items.append(LoopMark(True, trips, "loop"))
    p.items.append(Phase("exchange", "fetch w[i]", transfers=[
        Transfer(Ref(0, w, iter_stride=NBYTES), Ref(1, pair[0], seq=seq), NBYTES)]))
    cp = copy_vertex(1, pair[0], y)
    cp = Vertex(1, cp.kernel, cp.args, (Ref(0, pair[0], seq=seq), Ref(2, y)), pair, (y,))
    p.items.append(Phase("compute", "copy", [cp]))
    p.items.append(LoopMark(False, trips, "loop"))
    p.io_tensors = [
        {"name": "w", "role": "parameter", "shape": [trips, ROWS, 8], "dtype": "fp16",
         "scale_exp": 0},
        {"name": "y", "role": "output", "shape": [ROWS, 8], "dtype": "fp16", "scale_exp": 0},
    ]
    p.io = [IOBlock("w", "parameter", w, 0, (0, 0, 0), (trips, ROWS, 8), NBYTES, LD),
            IOBlock("y", "output", y, 0, (0, 0, 0), (1, ROWS, 8), NBYTES, LD)]
    return p


@pytest.mark.parametrize("trips", [2, 3])
def test_iterated_transfer_endpoints(trips: int) -> None:
    from planner.lowering.stages import build_program
    from simulator.run import run

    built = build_program(_transfer_loop_program(trips), TINY, "xloop", {})
    a = built.package.arrays
    src = np.flatnonzero(a["p_target"] == 1)
    assert src.size == 1 and a["p_mode"][src[0]] == PATCH_ARITH
    assert a["p_stride"][src[0]] == NBYTES
    dst = np.flatnonzero(a["p_target"] == 2)
    assert dst.size == 1 and a["p_mode"][dst[0]] == (PATCH_TABLE if trips == 3 else PATCH_ARITH)
    w = np.random.default_rng(3).standard_normal((trips, 4, 8)).astype(np.float16)
    sim = run(built.package, params={"w": w.astype(np.float32)}, numerics=True)
    assert not sim.faults
    assert np.array_equal(sim.outputs["y"], w[-1].astype(np.float32))


def test_vertex_args_match_per_ref_resolution() -> None:
    """v_args against the obvious walk: every ref's iteration-0 address
    written into its arg, the other args as the vertex holds them."""
    p, _, alloc, pkg, _ = _linked(3)
    s = schedule(p)
    want = []
    for st in s.steps:
        for v in st.vertices:
            args = list(v.args)
            for r in v.refs:
                b, o = r.seq[0] if r.seq else (r.buf, r.offset)
                args[r.arg] = int(alloc.addr[b]) + o
            want.append(args)
    assert pkg.arrays["v_args"].tolist() == want
    assert pkg.arrays["v_tile"].tolist() == [1, 2, 1]


def test_unknown_kernel_fails_in_reserve() -> None:
    from planner.lowering.program import Vertex

    p = loop_program(2)
    for it in p.items:
        if getattr(it, "label", "") == "side copy":
            v = it.vertices[0]
            it.vertices[0] = Vertex(v.tile, 999, v.args, v.refs, v.reads, v.writes)
    with pytest.raises(BuildFailure, match="unknown kernel id 999"):
        reserve(p, schedule(p), TINY)


def test_io_block_of_unknown_tensor_fails() -> None:
    from dataclasses import replace

    p = loop_program(2)
    p.io[2] = replace(p.io[2], tensor="nope")
    s = schedule(p)
    res = reserve(p, s, TINY)
    alloc = allocate(p, s, TINY, res.overheads)
    with pytest.raises(BuildFailure, match="io block of nope: not in Program.io_tensors"):
        link(p, s, alloc, res, TINY, "bad", {})


def test_io_arrays_per_block() -> None:
    p, _, alloc, pkg, _ = _linked(3)
    a = pkg.arrays
    names = [d["name"] for d in p.io_tensors]
    assert a["io_tensor"].tolist() == [names.index(b.tensor) for b in p.io]
    assert a["io_tile"].tolist() == [p.bufs[b.buf].tile for b in p.io]
    assert a["io_addr"].tolist() == [int(alloc.addr[b.buf]) + b.offset for b in p.io]
    assert a["io_lo"].tolist() == [list(b.lo) for b in p.io]
    assert a["io_hi"].tolist() == [list(b.hi) for b in p.io]
    assert a["io_ld0"].tolist() == [b.ld0 for b in p.io]
    assert a["io_ld1"].tolist() == [b.ld1 for b in p.io]


def test_iterated_vertex_ref_outside_loop_fails_in_link() -> None:
    """A schedule that claims no loop encloses the body (schedule itself
    refuses that): link names the step of the first iterated ref."""
    from dataclasses import replace

    p = loop_program(2)
    s = schedule(p)
    res = reserve(p, s, TINY)
    alloc = allocate(p, s, TINY, res.overheads)
    loose = replace(s, loop_of=tuple(-1 for _ in s.loop_of))
    with pytest.raises(BuildFailure, match="step 3: iterated ref outside a Repeat"):
        link(p, loose, alloc, res, TINY, "bad", {})
