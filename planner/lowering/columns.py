"""Flat columns of a program: its buffers, transfers and vertices as arrays.

Allocation and linking read every transfer and vertex of a schedule; as
columns they do that with numpy instead of per-object Python.  Transfers
already are columns (`Xfers`); vertices are objects, read here once per
compute phase into a `PhaseColumns` block, and a schedule's `VertexArrays`
is the concatenation of its phases' blocks in step order.

What is derived from a phase can be remembered in a `PhaseMemo` while the
phase and the very vertex and Xfers objects it holds are unchanged: the
optimizer's trial programs share most of their phases with the previous
expansion (incremental expansion reuses them), so the scheduler reads most
phases once per optimizer run, not once per trial.

A Program's buffers are read once into a `BufColumns` (`buf_columns`) that
allocate, reserve and link share.  Trial programs share a prefix of their
`Buf` objects with earlier expansions (incremental expansion copies the
buffer list up to a mark), so only the buffers past the longest prefix
equal to a recently read buffer list are read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, compress, count
from operator import attrgetter, is_, ne
from typing import Generic, TypeVar

import numpy as np

from planner.lowering.program import (
    NARGS,
    TENSOR_KINDS,
    Buf,
    Phase,
    Program,
    Ref,
    Seq,
    Vertex,
    Xfers,
)


@dataclass(frozen=True, eq=False)
class XferArrays:
    """All transfers of a schedule in step order, as read-only int64 arrays
    [X]: the owning step, then the `Xfers` columns (source and destination
    buffer, byte offset and `iter_stride`, bytes).  `seq` holds the indices
    (ascending) of the rows whose source or destination has a per-iteration
    `seq`, and `seq_refs` their (source seq, destination seq), `()` for a
    side without one; such a row's `*_buf`/`*_off` hold iteration 0."""

    step: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray
    nbytes: np.ndarray
    src_stride: np.ndarray
    dst_stride: np.ndarray
    seq: np.ndarray
    seq_refs: tuple[tuple[Seq, Seq], ...]

    def refs(self, i: int) -> tuple[Ref, Ref]:
        """Source (arg 0) and destination (arg 1) `Ref` of row `i` (for the
        few `seq` rows; any row works)."""
        k = int(np.searchsorted(self.seq, i))
        s, d = self.seq_refs[k] if k < self.seq.size and self.seq[k] == i else ((), ())
        return (Ref(0, int(self.src_buf[i]), int(self.src_off[i]), int(self.src_stride[i]), s),
                Ref(1, int(self.dst_buf[i]), int(self.dst_off[i]), int(self.dst_stride[i]), d))


def xfer_arrays(x: Xfers, counts: np.ndarray) -> XferArrays:
    """`x`: the transfer rows of all steps in order, `counts[s]` of them in
    step s."""
    step = _frozen(np.repeat(np.arange(len(counts), dtype=np.int64), counts))
    seq = _frozen(np.asarray([i for i, _, _ in x.seq], dtype=np.int64))
    return XferArrays(step=step, src_buf=x.src_buf, src_off=x.src_off, dst_buf=x.dst_buf,
                      dst_off=x.dst_off, nbytes=x.nbytes, src_stride=x.src_stride,
                      dst_stride=x.dst_stride, seq=seq,
                      seq_refs=tuple((a, b) for _, a, b in x.seq))


@dataclass(frozen=True, eq=False)
class PhaseColumns:
    """The vertices of one vertex list as read-only int64 arrays [n]: `tile`,
    `kernel`, `args` [n, NARGS] (`Vertex.args`: address args 0), and per
    vertex how many refs, reads and writes it has (`nref`, `nread`,
    `nwrite`).  Refs in (vertex, ref) order [R]: `ref_arg`, `ref_buf`,
    `ref_off`; `iterated` the indices of refs with an `iter_stride` or a
    `seq` and `iter_refs` those refs.  `read_buf`/`write_buf`: every vertex's
    `reads`/`writes` in vertex order."""

    tile: np.ndarray
    kernel: np.ndarray
    args: np.ndarray
    nref: np.ndarray
    ref_arg: np.ndarray
    ref_buf: np.ndarray
    ref_off: np.ndarray
    iterated: np.ndarray
    iter_refs: tuple[Ref, ...]
    nread: np.ndarray
    read_buf: np.ndarray
    nwrite: np.ndarray
    write_buf: np.ndarray


@dataclass(frozen=True, eq=False)
class VertexArrays:
    """All vertices of a schedule in step order as read-only int64 arrays
    [V]: owning `step`, `tile`, `kernel`, and `args` [V, NARGS] (`Vertex.args`:
    address args 0).  Their refs flattened in (vertex, ref) order [R]:
    `ref_vertex` (index into the vertex arrays), `ref_arg`, `ref_buf`,
    `ref_off`; `iterated` the indices (ascending) of the refs with an
    `iter_stride` or a `seq`, and `iter_refs` those `Ref`s.  `read_buf` /
    `read_vertex` [RD] and `write_buf` / `write_vertex` [WR]: every vertex's
    `reads` / `writes` in vertex order and the vertex each belongs to."""

    step: np.ndarray
    tile: np.ndarray
    kernel: np.ndarray
    args: np.ndarray
    ref_vertex: np.ndarray
    ref_arg: np.ndarray
    ref_buf: np.ndarray
    ref_off: np.ndarray
    iterated: np.ndarray
    iter_refs: tuple[Ref, ...]
    read_vertex: np.ndarray
    read_buf: np.ndarray
    write_vertex: np.ndarray
    write_buf: np.ndarray


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _ints(values: object, n: int) -> np.ndarray:
    return _frozen(np.fromiter(values, dtype=np.int64, count=n))  # type: ignore[call-overload]


def _distinct_rows(rows: list[tuple[int, ...]], distinct: Iterable[tuple[int, ...]],
                   ) -> np.ndarray:
    """int64 [len(rows), NARGS] from NARGS-tuples, `distinct` the distinct
    ones; vertices share few distinct args tuples (one per kernel shape), so
    each distinct one is converted once."""
    code = {r: i for i, r in enumerate(distinct)}
    index = np.fromiter(map(code.__getitem__, rows), dtype=np.int64, count=len(rows))
    table = np.asarray(list(code), dtype=np.int64).reshape(len(code), NARGS)
    return _frozen(table[index])


def _flat(rows: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, values) of a list of int tuples."""
    lengths = _ints(map(len, rows), len(rows))
    return lengths, _ints(chain.from_iterable(rows), int(lengths.sum()))


def phase_columns(vertices: Sequence[Vertex]) -> PhaseColumns:
    """Read `vertices` into columns (one pass per field).  Raises ValueError
    on a vertex without NARGS args (a builder bug)."""
    n = len(vertices)
    args = list(map(attrgetter("args"), vertices))
    distinct = dict.fromkeys(args)
    if any(len(a) != NARGS for a in distinct):
        bad = next(v for v in vertices if len(v.args) != NARGS)
        raise ValueError(f"tile {bad.tile}: vertex of kernel {bad.kernel} has "
                         f"{len(bad.args)} args, not {NARGS} (a builder bug)")
    per = list(map(attrgetter("refs"), vertices))
    nref = _ints(map(len, per), n)
    refs = list(chain.from_iterable(per))
    r = len(refs)
    stride = np.fromiter(map(attrgetter("iter_stride"), refs), dtype=np.int64, count=r)
    has_seq = np.fromiter(map(bool, map(attrgetter("seq"), refs)), dtype=bool, count=r)
    iterated = _frozen(np.flatnonzero((stride != 0) | has_seq))
    nread, read_buf = _flat(list(map(attrgetter("reads"), vertices)))
    nwrite, write_buf = _flat(list(map(attrgetter("writes"), vertices)))
    return PhaseColumns(
        tile=_ints(map(attrgetter("tile"), vertices), n),
        kernel=_ints(map(attrgetter("kernel"), vertices), n),
        args=_distinct_rows(args, distinct),
        nref=nref,
        ref_arg=_ints(map(attrgetter("arg"), refs), r),
        ref_buf=_ints(map(attrgetter("buf"), refs), r),
        ref_off=_ints(map(attrgetter("offset"), refs), r),
        iterated=iterated,
        iter_refs=tuple(refs[i] for i in iterated.tolist()),
        nread=nread, read_buf=read_buf, nwrite=nwrite, write_buf=write_buf,
    )


def concat_columns(blocks: Sequence[PhaseColumns], steps: Sequence[int]) -> VertexArrays:
    """The `VertexArrays` of `blocks` in order, block i's vertices in step
    `steps[i]`."""
    def cat(name: str) -> np.ndarray:
        parts = [getattr(b, name) for b in blocks]
        return _frozen(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))

    sizes = np.fromiter((b.tile.size for b in blocks), dtype=np.int64, count=len(blocks))
    n = int(sizes.sum())
    vertex = np.arange(n, dtype=np.int64)
    nref = cat("nref")
    ref_base = np.cumsum([0] + [b.ref_buf.size for b in blocks])
    iterated = [b.iterated + base for b, base in zip(blocks, ref_base.tolist(), strict=False)]
    args = (np.concatenate([b.args for b in blocks]) if blocks
            else np.zeros((0, NARGS), dtype=np.int64))
    return VertexArrays(
        step=_frozen(np.repeat(np.asarray(steps, dtype=np.int64), sizes)),
        tile=cat("tile"),
        kernel=cat("kernel"),
        args=_frozen(args),
        ref_vertex=_frozen(np.repeat(vertex, nref)),
        ref_arg=cat("ref_arg"),
        ref_buf=cat("ref_buf"),
        ref_off=cat("ref_off"),
        iterated=_frozen(np.concatenate(iterated) if iterated else np.zeros(0, np.int64)),
        iter_refs=tuple(chain.from_iterable(b.iter_refs for b in blocks)),
        read_vertex=_frozen(np.repeat(vertex, cat("nread"))),
        read_buf=cat("read_buf"),
        write_vertex=_frozen(np.repeat(vertex, cat("nwrite"))),
        write_buf=cat("write_buf"),
    )


V = TypeVar("V")


class PhaseMemo(Generic[V]):
    """Values derived from phases, returned only while the phase has the
    same kind and holds the same vertex objects in the same order and the
    same `Xfers` object (vertices and Xfers are immutable, so equal identity
    means equal content).  An entry keeps its phase alive, so the phase's id
    cannot be reused while it is remembered; the entries' phases hold at most
    `max_weight` vertices + transfer rows + 1 per phase (least recently used
    out first), which bounds the memory kept alive.  Thread-safe (a
    thread-pool optimizer schedules from several threads)."""

    def __init__(self, max_weight: int) -> None:
        self.max_weight = max_weight
        self.weight = 0
        self._data: OrderedDict[int, tuple[Phase, str, tuple[Vertex, ...], Xfers, V]] = (
            OrderedDict())
        self._lock = threading.Lock()

    def get(self, phase: Phase) -> V | None:
        with self._lock:
            hit = self._data.get(id(phase))
            if hit is None:
                return None
            self._data.move_to_end(id(phase))
        ph, kind, vertices, transfers, value = hit
        if ph is not phase or kind != phase.kind or transfers is not phase.transfers:
            return None
        if len(vertices) != len(phase.vertices) or not all(map(is_, vertices, phase.vertices)):
            return None
        return value

    def put(self, phase: Phase, value: V) -> None:
        entry = (phase, phase.kind, tuple(phase.vertices), phase.transfers, value)
        with self._lock:
            old = self._data.pop(id(phase), None)
            if old is not None:
                self.weight -= _weight(old)
            self._data[id(phase)] = entry
            self.weight += _weight(entry)
            while self.weight > self.max_weight and len(self._data) > 1:
                self.weight -= _weight(self._data.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._data)


def _weight(entry: tuple[Phase, str, tuple[Vertex, ...], Xfers, object]) -> int:
    return len(entry[2]) + len(entry[3]) + 1


@dataclass(frozen=True, eq=False)
class BufColumns:
    """The buffers of a Program as read-only int64 arrays [B]: `tile`,
    `nbytes`, `align` (bytes), `persistent` (0/1) and `kind` (index into
    TENSOR_KINDS); `names` the buffer names."""

    tile: np.ndarray
    nbytes: np.ndarray
    align: np.ndarray
    persistent: np.ndarray
    kind: np.ndarray
    names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.names)


_KIND_CODE = {k: i for i, k in enumerate(TENSOR_KINDS)}
_PREFIX_CHUNK = 1024  # list slices compared at once when finding a common prefix


def _read_bufs(bufs: Sequence[Buf]) -> BufColumns:
    """`bufs` into columns (one pass per field).  Raises ValueError on a kind
    not in TENSOR_KINDS (a builder bug)."""
    n = len(bufs)
    kinds = list(map(attrgetter("kind"), bufs))
    bad = set(kinds) - _KIND_CODE.keys()
    if bad:
        b = next(b for b in bufs if b.kind in bad)
        raise ValueError(f"tile {b.tile}: buffer {b.name} has kind {b.kind!r}, "
                         f"not one of {TENSOR_KINDS} (a builder bug)")
    return BufColumns(
        tile=_ints(map(attrgetter("tile"), bufs), n),
        nbytes=_ints(map(attrgetter("nbytes"), bufs), n),
        align=_ints(map(attrgetter("align"), bufs), n),
        persistent=_ints(map(attrgetter("persistent"), bufs), n),
        kind=_ints(map(_KIND_CODE.__getitem__, kinds), n),
        names=tuple(map(attrgetter("name"), bufs)),
    )


def _common_prefix(a: list[Buf], b: list[Buf]) -> int:
    """Length of the longest common prefix of `a` and `b` (by `==`; Bufs are
    frozen values).  Whole chunks compare as list slices (one C loop)."""
    n = min(len(a), len(b))
    k = 0
    while k < n:
        j = min(k + _PREFIX_CHUNK, n)
        x, y = a[k:j], b[k:j]
        if x != y:
            return next(compress(count(k), map(ne, x, y)))
        k = j
    return n


def _join(head: BufColumns, k: int, tail: BufColumns) -> BufColumns:
    """The first `k` rows of `head` followed by `tail`."""
    def cat(name: str) -> np.ndarray:
        return _frozen(np.concatenate((getattr(head, name)[:k], getattr(tail, name))))

    return BufColumns(tile=cat("tile"), nbytes=cat("nbytes"), align=cat("align"),
                      persistent=cat("persistent"), kind=cat("kind"),
                      names=head.names[:k] + tail.names)


class BufMemo:
    """The `BufColumns` of the last `size` buffer lists read, each with a
    copy of its list: a list equal to a remembered one gets its columns; any
    other is read past its longest common prefix with a remembered list.
    Thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._data: list[tuple[list[Buf], BufColumns]] = []  # least recently used first
        self._lock = threading.Lock()

    def columns(self, bufs: list[Buf]) -> BufColumns:
        with self._lock:
            entries = list(reversed(self._data))
        best, k = None, 0
        for snap, cols in entries:
            if len(snap) == len(bufs) and snap == bufs:
                best, k = (snap, cols), len(bufs)
                break
            p = _common_prefix(snap, bufs)
            if p > k:
                best, k = (snap, cols), p
        if best is not None and k == len(bufs) == len(best[0]):
            snap, out = best
        else:
            snap = list(bufs)
            tail = _read_bufs(snap[k:])
            out = tail if best is None else _join(best[1], k, tail)
        with self._lock:
            data = [e for e in self._data if e[0] is not snap] + [(snap, out)]
            self._data = data[max(0, len(data) - self.size):]
        return out

    def __len__(self) -> int:
        return len(self._data)


def buf_columns(program: Program, memo: BufMemo | None = None) -> BufColumns:
    """The buffer columns of `program` as its `bufs` list holds now, read
    through `memo` when given (a build state's: reserve, allocate and link
    of one program, and trial programs sharing a prefix, read buffers once)."""
    return (memo if memo is not None else BufMemo(1)).columns(program.bufs)
