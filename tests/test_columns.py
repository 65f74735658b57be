"""planner.lowering.columns: per-phase vertex columns, their concatenation, the phase memo."""

from __future__ import annotations

import numpy as np
import pytest
from handprog import copy_vertex, loop_program

from planner.lowering.columns import (
    BufColumns,
    BufMemo,
    PhaseMemo,
    buf_columns,
    concat_columns,
    phase_columns,
)
from planner.lowering.program import TENSOR_KINDS, Buf, Phase, Program, Ref, Transfer, Vertex, Xfers
from planner.lowering.schedule import schedule, vertex_arrays


def _vertices() -> list[Vertex]:
    seq = ((4, 0), (5, 0))
    return [copy_vertex(1, 3, 4),
            Vertex(2, 11, (9,) * 16, (Ref(1, 6, 8, 64), Ref(3, 7), Ref(5, 4, 0, 0, seq)),
                   (6, 4, 5), (7,)),
            Vertex(0, 10, (1,) * 16, (), (), (2,))]


def test_phase_columns_match_per_vertex_reading() -> None:
    vs = _vertices()
    c = phase_columns(vs)
    refs = [r for v in vs for r in v.refs]
    assert c.tile.tolist() == [1, 2, 0] and c.kernel.tolist() == [v.kernel for v in vs]
    assert c.args.tolist() == [list(v.args) for v in vs]
    assert c.nref.tolist() == [2, 3, 0]
    assert c.ref_arg.tolist() == [r.arg for r in refs] == [0, 2, 1, 3, 5]
    assert c.ref_buf.tolist() == [3, 4, 6, 7, 4]
    assert c.ref_off.tolist() == [0, 0, 8, 0, 0]
    assert c.iterated.tolist() == [2, 4] and c.iter_refs == (refs[2], refs[4])
    assert c.nread.tolist() == [1, 3, 0] and c.read_buf.tolist() == [3, 6, 4, 5]
    assert c.nwrite.tolist() == [1, 1, 1] and c.write_buf.tolist() == [4, 7, 2]
    assert not c.ref_buf.flags.writeable and not c.args.flags.writeable


def test_concat_columns_offsets_blocks() -> None:
    vs = _vertices()
    a, b = phase_columns(vs[:2]), phase_columns(vs[1:])
    v = concat_columns([a, b], [4, 9])
    assert v.step.tolist() == [4, 4, 9, 9]
    assert v.tile.tolist() == [1, 2, 2, 0]
    assert v.ref_vertex.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert v.iterated.tolist() == [2, 4, 5, 7]
    assert v.read_vertex.tolist() == [0, 1, 1, 1, 2, 2, 2]
    assert v.write_vertex.tolist() == [0, 1, 2, 3] and v.write_buf.tolist() == [4, 7, 7, 2]
    empty = concat_columns([], [])
    assert empty.step.size == 0 and empty.args.shape == (0, 16)


def test_memo_returns_value_only_for_unchanged_phase() -> None:
    memo: PhaseMemo[str] = PhaseMemo(6)  # weight: vertices + transfer rows + 1 per phase
    vs = _vertices()
    ph = Phase("compute", "p", list(vs))
    memo.put(ph, "cols")
    assert memo.get(ph) == "cols"
    assert memo.get(Phase("compute", "p", list(vs))) is None  # another phase object
    ph.vertices[1] = Vertex(2, 11, (8,) * 16, vs[1].refs, vs[1].reads, vs[1].writes)
    assert memo.get(ph) is None  # a vertex replaced
    ph.vertices[1] = vs[1]
    assert memo.get(ph) == "cols"
    ph.vertices.append(vs[0])
    assert memo.get(ph) is None  # a vertex appended
    ex = Phase("exchange", "x", transfers=[Transfer(Ref(0, 1), Ref(1, 2), 8)])
    memo.put(ex, "facts")
    assert memo.get(ex) == "facts"
    ex.transfers = Xfers.of([Transfer(Ref(0, 1), Ref(1, 3), 8)])
    assert memo.get(ex) is None  # other transfers
    assert memo.weight == 4 + 2
    q = Phase("compute", "q", [])
    memo.put(q, "q")  # weight 7 > 6: the least recently used (ph) leaves
    assert len(memo) == 2 and memo.weight == 2 + 1 and memo.get(ph) is None
    big = Phase("compute", "big", _vertices() * 3)
    memo.put(big, "big")  # heavier than the bound: kept alone
    assert len(memo) == 1 and memo.get(big) == "big"


def test_schedule_columns_same_with_warm_memo() -> None:
    """A schedule built from remembered phase facts equals one read fresh."""
    p = loop_program(3)
    first = schedule(p).vertex_arrays()
    again = schedule(p).vertex_arrays()
    fresh = vertex_arrays(schedule(p).steps)
    for v in (again, fresh):
        for name in ("step", "tile", "kernel", "args", "ref_vertex", "ref_arg", "ref_buf",
                     "ref_off", "iterated", "read_vertex", "read_buf", "write_vertex",
                     "write_buf"):
            assert np.array_equal(getattr(v, name), getattr(first, name)), name
        assert v.iter_refs == first.iter_refs


def test_schedule_sees_a_phase_changed_in_place() -> None:
    """Remembered facts are not reused for a phase whose vertices changed."""
    from planner.lowering.program import Program

    p = Program()
    a, b, c, d = (p.new_buf(0, 64, "activation", n, persistent=True) for n in "abcd")
    second = Phase("compute", "c->d", [copy_vertex(0, c, d)])
    p.items += [Phase("compute", "a->b", [copy_vertex(0, a, b)]), second]
    assert len(schedule(p).steps) == 1  # independent: merged
    second.vertices[0] = copy_vertex(0, b, d)  # now reads what the first writes
    s = schedule(p)
    assert len(s.steps) == 2
    assert s.vertex_arrays().ref_buf.tolist() == [a, b, b, d]


def _bufs(n: int, stem: str = "b") -> list[Buf]:
    return [Buf(i, i % 3, 8 * (i + 1), TENSOR_KINDS[i % 4], f"{stem}{i}", i % 2 == 0,
                8 << (i % 2)) for i in range(n)]


def _assert_reads(c: BufColumns, bufs: list[Buf]) -> None:
    """The slow, obvious twin: every field per Buf."""
    assert c.tile.tolist() == [b.tile for b in bufs]
    assert c.nbytes.tolist() == [b.nbytes for b in bufs]
    assert c.align.tolist() == [b.align for b in bufs]
    assert c.persistent.tolist() == [int(b.persistent) for b in bufs]
    assert c.kind.tolist() == [TENSOR_KINDS.index(b.kind) for b in bufs]
    assert c.names == tuple(b.name for b in bufs) and len(c) == len(bufs)
    assert not c.tile.flags.writeable and not c.kind.flags.writeable


def test_buf_memo_reads_only_past_a_remembered_prefix() -> None:
    memo = BufMemo(2)
    base = _bufs(3000)  # longer than one prefix chunk
    c0 = memo.columns(base)
    _assert_reads(c0, base)
    assert memo.columns(list(base)) is c0  # an equal list: the same columns
    grown = base[:2500] + _bufs(700, "x")[600:]  # incremental expansion: prefix + new
    _assert_reads(memo.columns(grown), grown)
    changed = list(base)
    changed[1700] = Buf(1700, 2, 16, "scratch", "other")  # equal prefix ends mid-chunk
    c2 = memo.columns(changed)
    _assert_reads(c2, changed)
    base.append(Buf(3000, 1, 8, "activation", "late"))  # the list read first grew since
    _assert_reads(memo.columns(base), base)
    assert len(memo) == 2
    _assert_reads(memo.columns([]), [])


def test_buf_columns_follow_the_program_and_reject_unknown_kinds() -> None:
    prog = Program()
    prog.new_buf(1, 64, "parameter", "w", persistent=True, align=16)
    _assert_reads(buf_columns(prog), prog.bufs)
    prog.new_buf(0, 32, "scratch", "s")
    _assert_reads(buf_columns(prog), prog.bufs)
    prog.bufs.append(Buf(2, 0, 8, "code", "bad"))
    with pytest.raises(ValueError, match="buffer bad has kind 'code'"):
        buf_columns(prog)
