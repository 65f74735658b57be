"""planner.lowering.schedule: phase merging, loop marks, reduction overlap."""

from __future__ import annotations

import numpy as np
import pytest
from handprog import copy_vertex, loop_program

from kernels.abi import REDUCE
from planner.lowering.program import LoopMark, Phase, Program, Ref, Transfer, Vertex, Xfers
from planner.lowering.schedule import (
    COMPUTE,
    EXCHANGE,
    REPEAT_BEGIN,
    REPEAT_END,
    schedule,
    vertex_arrays,
)
from tilecommon.errors import BuildFailure


def test_loop_program_steps_and_merge() -> None:
    s = schedule(loop_program(3))
    kinds = [st.kind for st in s.steps]
    # exchange, merged copies, BEGIN, add, END, exchange
    assert kinds == [EXCHANGE, COMPUTE, REPEAT_BEGIN, COMPUTE, REPEAT_END, EXCHANGE]
    assert s.steps[1].labels == ("x into ping", "side copy")
    assert s.merged == 1
    assert s.steps[2].trips == 3 and s.steps[2].match == 4 and s.steps[4].match == 2
    assert s.loop_of == (-1, -1, -1, 2, -1, -1)
    assert s.loops() == [(2, 4, 3)]


def test_dependent_phases_do_not_merge() -> None:
    p = Program()
    a = p.new_buf(0, 64, "activation", "a", persistent=True)
    b = p.new_buf(0, 64, "activation", "b")
    c = p.new_buf(0, 64, "activation", "c", persistent=True)
    p.items += [Phase("compute", "a->b", [copy_vertex(0, a, b)]),
                Phase("compute", "b->c", [copy_vertex(0, b, c)])]
    s = schedule(p)
    assert len(s.steps) == 2 and s.merged == 0


def _reduce(tile: int, src: int, dst: int) -> Vertex:
    return Vertex(tile, REDUCE, (0,) * 16, (Ref(0, src), Ref(4, dst)), (src,), (dst,))


def _reduction_program() -> Program:
    """reduce(p0 → r) ; exchange q → q' (independent) ; copy s → t (independent)."""
    p = Program()
    ids = {n: p.new_buf(0 if n != "q2" else 1, 64, "activation", n, persistent=True)
           for n in ("p0", "r", "q", "q2", "s", "t")}
    p.items += [
        Phase("compute", "reduce", [_reduce(0, ids["p0"], ids["r"])]),
        Phase("exchange", "move q", transfers=[Transfer(Ref(1, ids["q"]), Ref(1, ids["q2"]), 64)]),
        Phase("compute", "copy", [copy_vertex(0, ids["s"], ids["t"])]),
    ]
    return p


def test_reduction_overlap_flag() -> None:
    plain = schedule(_reduction_program())
    assert [st.kind for st in plain.steps] == [COMPUTE, EXCHANGE, COMPUTE]
    over = schedule(_reduction_program(), reduction_overlap=True)
    assert [st.kind for st in over.steps] == [EXCHANGE, COMPUTE]
    assert over.steps[1].labels == ("reduce", "copy")
    assert over.delayed == 1 and over.merged == 1


def test_reduction_not_delayed_past_dependent_exchange() -> None:
    p = _reduction_program()
    r = 1  # buffer "r" is id 1: make the exchange read it
    ex = p.items[1]
    assert isinstance(ex, Phase)
    ex.transfers = Xfers.of([Transfer(Ref(1, r), ex.transfers[0].dst, 64)])
    s = schedule(p, reduction_overlap=True)
    # the exchange stays after the reduction; the independent copy overlaps it instead
    assert [st.kind for st in s.steps] == [COMPUTE, EXCHANGE]
    assert s.steps[0].labels == ("reduce", "copy") and s.delayed == 0
    # a copy of what the exchange delivers must wait for it
    p.items[2] = Phase("compute", "copy q2", [copy_vertex(1, 3, 5)])  # reads q2 (id 3)
    s = schedule(p, reduction_overlap=True)
    assert [st.kind for st in s.steps] == [COMPUTE, EXCHANGE, COMPUTE]


def test_unbalanced_loop_marks_fail() -> None:
    p = Program()
    p.items.append(LoopMark(True, 2, "open"))
    with pytest.raises(BuildFailure, match="schedule"):
        schedule(p)
    q = Program()
    q.items.append(LoopMark(False, 2, "close"))
    with pytest.raises(BuildFailure, match="without a begin"):
        schedule(q)


def test_iterated_ref_outside_loop_fails() -> None:
    p = Program()
    a = p.new_buf(0, 128, "activation", "a", persistent=True)
    b = p.new_buf(0, 64, "activation", "b", persistent=True)
    v = Vertex(0, 10, (0,) * 16, (Ref(0, a, iter_stride=64), Ref(2, b)), (a,), (b,))
    p.items.append(Phase("compute", "bad", [v]))
    with pytest.raises(BuildFailure, match="outside any Repeat"):
        schedule(p)


def test_lookahead_hoists_independent_phase_past_other_kind() -> None:
    """copy a→b ; exchange b→c (needs the copy) ; copy d→e (independent):
    adjacent-only merging keeps three steps; with lookahead the second copy
    joins the first step, jumping the exchange it does not depend on."""
    p = Program()
    a, b, d, e = (p.new_buf(0, 64, "activation", n, persistent=True) for n in "abde")
    c = p.new_buf(1, 64, "activation", "c", persistent=True)
    p.items += [Phase("compute", "a->b", [copy_vertex(0, a, b)]),
                Phase("exchange", "b->c", transfers=[Transfer(Ref(1, b), Ref(1, c), 64)]),
                Phase("compute", "d->e", [copy_vertex(0, d, e)])]
    assert [st.kind for st in schedule(p).steps] == [COMPUTE, EXCHANGE, COMPUTE]
    s = schedule(p, lookahead=2)
    assert [st.kind for st in s.steps] == [COMPUTE, EXCHANGE]
    assert s.steps[0].labels == ("a->b", "d->e")
    # a phase that reads what the jumped-over exchange writes may not be hoisted
    p.items[2] = Phase("compute", "c->e", [copy_vertex(1, c, e)])
    assert len(schedule(p, lookahead=2).steps) == 3


def _seq_program() -> Program:
    """Exchanges before, inside and after a 3-trip Repeat; inside, a ping-pong
    carry (seq source and destination), a strided parameter read and a seq
    destination only; two independent exchanges merge into one step."""
    p = Program()
    a, b = (p.new_buf(0, 64, "activation", n) for n in "ab")
    c, d = (p.new_buf(1, 64, "activation", n) for n in "cd")
    w = p.new_buf(1, 192, "parameter", "w", persistent=True)
    e = p.new_buf(2, 64, "activation", "e", persistent=True)
    f = p.new_buf(3, 64, "activation", "f", persistent=True)
    g, h = (p.new_buf(1, 64, "activation", n) for n in "gh")
    seq_ab = ((a, 0), (b, 0), (a, 0))
    seq_cd = ((c, 8), (d, 8), (c, 8))
    seq_hg = ((h, 0), (g, 0), (h, 0))
    p.items += [
        Phase("exchange", "in", transfers=[Transfer(Ref(1, e), Ref(1, a), 64)]),
        Phase("exchange", "side", transfers=[Transfer(Ref(1, w, 8), Ref(1, f, 16), 32),
                                             Transfer(Ref(1, w, 40), Ref(1, f, 48), 8)]),
        LoopMark(True, 3, "loop"),
        Phase("exchange", "carry", transfers=[
            Transfer(Ref(0, a, 0, 0, seq_ab), Ref(1, c, 8, 0, seq_cd), 32),
            Transfer(Ref(0, w, 0, 64), Ref(1, b, 8), 16)]),
        Phase("exchange", "tail", transfers=[Transfer(Ref(0, f, 4), Ref(1, h, 0, 0, seq_hg), 8)]),
        LoopMark(False, 3, "loop"),
        Phase("exchange", "out", transfers=[Transfer(Ref(1, c), Ref(1, e), 64)]),
    ]
    return p


def test_transfer_arrays_with_seq_rows() -> None:
    s = schedule(_seq_program())
    assert [st.labels for st in s.steps] == [("in", "side"), ("loop",), ("carry", "tail"),
                                             ("loop",), ("out",)]
    x = s.transfers()
    assert x.step.tolist() == [0, 0, 0, 2, 2, 2, 4]
    assert x.src_buf.tolist() == [5, 4, 4, 0, 4, 6, 2]
    assert x.src_off.tolist() == [0, 8, 40, 0, 0, 4, 0]
    assert x.src_stride.tolist() == [0, 0, 0, 0, 64, 0, 0]
    assert x.dst_buf.tolist() == [0, 6, 6, 2, 1, 8, 5]
    assert x.dst_off.tolist() == [0, 16, 48, 8, 8, 0, 0]
    assert x.dst_stride.tolist() == [0, 0, 0, 0, 0, 0, 0]
    assert x.nbytes.tolist() == [64, 32, 8, 32, 16, 8, 64]
    assert x.seq.tolist() == [3, 5]
    a, b, c, d, g, h = 0, 1, 2, 3, 7, 8
    assert x.seq_refs == (
        (((a, 0), (b, 0), (a, 0)), ((c, 8), (d, 8), (c, 8))),
        ((), ((h, 0), (g, 0), (h, 0))),
    )
    src, dst = x.refs(3)
    assert src == Ref(0, a, 0, 0, ((a, 0), (b, 0), (a, 0)))
    assert dst == Ref(1, c, 8, 0, ((c, 8), (d, 8), (c, 8)))
    assert x.refs(4) == (Ref(0, 4, 0, 64), Ref(1, b, 8))
    assert x.refs(5)[1] == Ref(1, h, 0, 0, ((h, 0), (g, 0), (h, 0)))
    # merged steps hold the rows of their phases as columns, in program order
    carry = s.steps[2].transfers
    assert isinstance(carry, Xfers) and len(carry) == 3
    assert carry.dst_buf.tolist() == [c, b, h] and [i for i, _, _ in carry.seq] == [0, 2]
    assert carry.iterated and not s.steps[0].transfers.iterated


def test_vertex_arrays_of_loop_program() -> None:
    s = schedule(loop_program(3))
    v = s.vertex_arrays()
    # copies on tiles 1 and 2 (step 1), the body's add on tile 1 (step 3)
    assert v.step.tolist() == [1, 1, 3]
    assert v.tile.tolist() == [1, 2, 1]
    assert v.kernel.tolist() == [st.kernel for st in (*s.steps[1].vertices, *s.steps[3].vertices)]
    assert v.args.shape == (3, 16)
    assert v.args.tolist() == [list(x.args) for st in s.steps for x in st.vertices]
    # buffers: x 0, y 1, w 2, land 3, ping 4, pong 5, side_in 6, side_out 7
    assert v.ref_vertex.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert v.ref_arg.tolist() == [0, 2, 0, 2, 0, 2, 4]
    assert v.ref_buf.tolist() == [3, 4, 6, 7, 4, 2, 5]
    assert v.ref_off.tolist() == [0] * 7
    assert v.iterated.tolist() == [4, 5, 6]
    assert v.iter_refs == s.steps[3].vertices[0].refs


def test_vertex_arrays_match_per_vertex_reading() -> None:
    """The flat columns against an obvious per-object walk (the slow twin)."""
    p = _seq_program()
    a, c, w = 0, 2, 4
    p.items.insert(3, Phase("compute", "in loop", [
        Vertex(1, 10, tuple(range(16)), (Ref(0, w, 8, 64), Ref(2, c, 4)), (w,), (c,)),
        Vertex(0, 11, (7,) * 16, (Ref(1, a, 0, 0, ((a, 0), (1, 0), (a, 0))),), (a, 1), ())]))
    s = schedule(p)
    v = vertex_arrays(s.steps)
    rows = [(i, x) for i, st in enumerate(s.steps) for x in st.vertices]
    refs = [(k, r) for k, (_, x) in enumerate(rows) for r in x.refs]
    assert v.step.tolist() == [i for i, _ in rows]
    assert v.tile.tolist() == [x.tile for _, x in rows]
    assert v.kernel.tolist() == [x.kernel for _, x in rows]
    assert v.args.tolist() == [list(x.args) for _, x in rows]
    assert v.ref_vertex.tolist() == [k for k, _ in refs]
    assert v.ref_arg.tolist() == [r.arg for _, r in refs]
    assert v.ref_buf.tolist() == [r.buf for _, r in refs]
    assert v.ref_off.tolist() == [r.offset for _, r in refs]
    assert v.iterated.tolist() == [j for j, (_, r) in enumerate(refs) if r.iterated] == [0, 2]
    assert v.iter_refs == tuple(r for _, r in refs if r.iterated)


def test_vertex_without_nargs_args_fails() -> None:
    p = Program()
    a = p.new_buf(0, 64, "activation", "a", persistent=True)
    p.items.append(Phase("compute", "short", [Vertex(0, 10, (0,) * 15, (Ref(0, a),), (a,), ())]))
    with pytest.raises(ValueError, match="15 args, not 16"):
        schedule(p)


def test_xfers_rows_are_views_with_seq_renumbered() -> None:
    seq = ((0, 0), (1, 0))
    x = Xfers.of([Transfer(Ref(0, 2), Ref(1, 3), 8),
                  Transfer(Ref(0, 0, 0, 0, seq), Ref(1, 4), 16),
                  Transfer(Ref(0, 5), Ref(1, 6, 8), 24),
                  Transfer(Ref(0, 7), Ref(1, 1, 0, 0, seq), 32)])
    part = x.rows(1, 3)
    assert part.src_buf.tolist() == [0, 5] and part.dst_off.tolist() == [0, 8]
    assert part.nbytes.tolist() == [16, 24]
    assert part.seq == ((0, seq, ()),)
    assert np.shares_memory(part.nbytes, x.nbytes) and not part.nbytes.flags.writeable
    assert x.rows(3, 4).seq == ((0, (), seq),)
    assert len(x.rows(2, 2)) == 0 and x.rows(2, 2).seq == ()
    whole = x.rows(0, 4)
    assert [t for t in whole] == [t for t in x]


def test_step_transfers_are_rows_of_the_flat_arrays() -> None:
    s = schedule(_seq_program())
    x = s.transfers()
    lo = 0
    for i, st in enumerate(s.steps):
        n = len(st.transfers)
        assert (x.step[lo:lo + n] == i).all()
        assert st.transfers.dst_buf.tolist() == x.dst_buf[lo:lo + n].tolist()
        lo += n
    assert lo == x.step.size
