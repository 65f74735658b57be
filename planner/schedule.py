"""Schedule: a Program's phases and loop marks → an ordered list of supersteps.

Every phase becomes (part of) one step; every loop mark one REPEAT_BEGIN or
REPEAT_END step.  Step indices are what allocation liveness and the package's
`buf_first`/`buf_last` count in.

Merging.  Adjacent phases of the same kind merge into one step when they are
independent: no buffer written by one is read or written by the other (a
phase's own members are independent by the Program contract).  With
`lookahead` > 1 a step may also absorb a later phase of its kind that is
independent of every phase it jumps over (up to `lookahead` phases past the
last one it could not take).  The default is 1 (adjacent only): on the
front end's programs lookahead 8 saves about 1% of cycles (siglip-so400m,
1 layer: 683597 → 677536) but raises peak tile bytes by 5%, which the
27-layer model cannot afford.  A merged
compute step costs the max over tiles of the summed vertex cycles instead of a
sum of maxima; a merged exchange step pays one sync instead of two.

Reductions (phases whose vertices are all REDUCE) merge only when the plan's
`reduction_overlap` flag is set.  With the flag a reduction may also be
delayed past the exchange phases that follow it, when none of them touches
what the reduction reads or writes, to run in the same superstep as the next
independent compute phase, and every step looks OVERLAP_LOOKAHEAD phases
ahead for independent work of its kind (so a K-split reduction overlaps the
next matmul's partial products).  That overlap lengthens live ranges, which
is why it is a plan decision and not a default.

Nothing crosses a loop mark: the body of a Repeat is scheduled on its own.
Empty phases are dropped (an empty exchange would still pay a sync).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain
from operator import attrgetter

import numpy as np

from kernels.exceptions import BuildFailure
from planner.program import NARGS, LoopMark, Phase, Program, Ref, Seq, Vertex, Xfers

COMPUTE = "compute"
EXCHANGE = "exchange"
REPEAT_BEGIN = "repeat_begin"
REPEAT_END = "repeat_end"

Effects = tuple[frozenset[int], frozenset[int]]  # (reads, writes)

# phases a step may look past for more work of its kind (1 = adjacent only)
LOOKAHEAD = 1
# the window under `reduction_overlap`: reductions then overlap independent
# work found up to this many phases later (not only adjacent phases)
OVERLAP_LOOKAHEAD = 8

# kernel id of REDUCE in the kernel ABI (docs/contracts.md §2)
REDUCE_KERNEL = 3


_NO_TRANSFERS = Xfers.empty()  # immutable: every step without transfers shares it


@dataclass(frozen=True, slots=True)
class Step:
    """One superstep.  `match` is the index of the partner loop mark (at
    REPEAT_BEGIN / REPEAT_END), -1 otherwise; `trips` is set at REPEAT_BEGIN.
    `labels` name the phases merged into the step, in program order;
    `transfers` holds the rows of the merged exchange phases in that order."""

    kind: str
    labels: tuple[str, ...]
    vertices: tuple[Vertex, ...] = ()
    transfers: Xfers = _NO_TRANSFERS
    trips: int = 0
    match: int = -1


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


def transfer_arrays(steps: tuple[Step, ...]) -> XferArrays:
    """Concatenate the transfer columns of `steps` (the back end's hot lists)."""
    counts = np.fromiter((len(st.transfers) for st in steps), dtype=np.int64, count=len(steps))
    return _xfer_arrays(Xfers.concat([st.transfers for st in steps]), counts)


def _xfer_arrays(x: Xfers, counts: np.ndarray) -> XferArrays:
    """`x`: the rows of all steps in order, `counts[s]` of them in step s."""
    step = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    step.flags.writeable = False
    seq = np.asarray([i for i, _, _ in x.seq], dtype=np.int64)
    seq.flags.writeable = False
    return XferArrays(step=step, src_buf=x.src_buf, src_off=x.src_off, dst_buf=x.dst_buf,
                      dst_off=x.dst_off, nbytes=x.nbytes, src_stride=x.src_stride,
                      dst_stride=x.dst_stride, seq=seq,
                      seq_refs=tuple((a, b) for _, a, b in x.seq))


@dataclass(frozen=True, eq=False)
class VertexArrays:
    """All vertices of a schedule in step order as int64 arrays [V]: owning
    `step`, `tile`, `kernel`, and `args` [V, NARGS] (`Vertex.args`: address
    args 0).  Their refs flattened in (vertex, ref) order [R]: `ref_vertex`
    (index into the vertex arrays), `ref_arg`, `ref_buf`, `ref_off`;
    `iterated` the indices (ascending) of the refs with an `iter_stride` or a
    `seq`, and `iter_refs` those `Ref`s."""

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


def _ints(values: object, n: int) -> np.ndarray:
    a = np.fromiter(values, dtype=np.int64, count=n)  # type: ignore[call-overload]
    a.flags.writeable = False
    return a


def _distinct_rows(rows: list[tuple[int, ...]]) -> np.ndarray:
    """int64 [len(rows), NARGS] from NARGS-tuples; vertices share few distinct
    args tuples (one per kernel shape), so convert each distinct one once."""
    code = {r: i for i, r in enumerate(dict.fromkeys(rows))}
    index = np.fromiter(map(code.__getitem__, rows), dtype=np.int64, count=len(rows))
    table = np.asarray(list(code), dtype=np.int64).reshape(len(code), NARGS)
    out = table[index]
    out.flags.writeable = False
    return out


def vertex_arrays(steps: tuple[Step, ...]) -> VertexArrays:
    """Flatten the vertices of `steps` and their refs (one pass per field).
    Raises ValueError on a vertex without NARGS args."""
    counts = np.fromiter((len(st.vertices) for st in steps), dtype=np.int64, count=len(steps))
    verts = list(chain.from_iterable(st.vertices for st in steps))
    n = len(verts)
    args = list(map(attrgetter("args"), verts))
    if set(map(len, args)) - {NARGS}:
        bad = next(v for v in verts if len(v.args) != NARGS)
        raise ValueError(f"tile {bad.tile}: vertex of kernel {bad.kernel} has "
                         f"{len(bad.args)} args, not {NARGS} (a builder bug)")
    per = list(map(attrgetter("refs"), verts))
    nref = np.fromiter(map(len, per), dtype=np.int64, count=n)
    refs = list(chain.from_iterable(per))
    r = len(refs)
    stride = np.fromiter(map(attrgetter("iter_stride"), refs), dtype=np.int64, count=r)
    has_seq = np.fromiter(map(bool, map(attrgetter("seq"), refs)), dtype=bool, count=r)
    iterated = np.flatnonzero((stride != 0) | has_seq)
    step = np.repeat(np.arange(len(steps), dtype=np.int64), counts)
    ref_vertex = np.repeat(np.arange(n, dtype=np.int64), nref)
    for a in (step, ref_vertex, iterated):
        a.flags.writeable = False
    return VertexArrays(
        step=step,
        tile=_ints(map(attrgetter("tile"), verts), n),
        kernel=_ints(map(attrgetter("kernel"), verts), n),
        args=_distinct_rows(args),
        ref_vertex=ref_vertex,
        ref_arg=_ints(map(attrgetter("arg"), refs), r),
        ref_buf=_ints(map(attrgetter("buf"), refs), r),
        ref_off=_ints(map(attrgetter("offset"), refs), r),
        iterated=iterated,
        iter_refs=tuple(refs[i] for i in iterated.tolist()),
    )


@dataclass(frozen=True, slots=True)
class Schedule:
    """Ordered steps.  `loop_of[s]` is the index of the innermost REPEAT_BEGIN
    enclosing step s (-1 outside every loop; a BEGIN/END step belongs to the
    enclosing loop, not its own).  `merged` counts phases that joined an
    earlier phase's step; `delayed` counts reductions moved past exchanges;
    `xfers` and `verts` the flat transfer and vertex arrays."""

    steps: tuple[Step, ...]
    loop_of: tuple[int, ...]
    merged: int = 0
    delayed: int = 0
    xfers: XferArrays | None = None
    verts: VertexArrays | None = None

    def transfers(self) -> XferArrays:
        """The flat transfer arrays (computed by `schedule`; else on demand)."""
        return self.xfers if self.xfers is not None else transfer_arrays(self.steps)

    def vertex_arrays(self) -> VertexArrays:
        """The flat vertex arrays (computed by `schedule`; else on demand)."""
        return self.verts if self.verts is not None else vertex_arrays(self.steps)

    def loops(self) -> list[tuple[int, int, int]]:
        """(begin, end, trips) of every Repeat, ordered by begin index."""
        return [
            (s, st.match, st.trips) for s, st in enumerate(self.steps) if st.kind == REPEAT_BEGIN
        ]


class _Group:
    """A step under construction: phases of one kind merged so far."""

    def __init__(self, phase: Phase, reads: frozenset[int], writes: frozenset[int]) -> None:
        self.kind = phase.kind
        self.labels = [phase.label]
        self.vertices = list(phase.vertices)
        self.transfers = [phase.transfers]
        self.reads = set(reads)
        self.writes = set(writes)
        self.reduction = _is_reduction(phase)

    def absorbs(self, kind: str, reads: frozenset[int], writes: frozenset[int]) -> bool:
        if kind != self.kind:
            return False
        return (writes.isdisjoint(self.reads) and writes.isdisjoint(self.writes)
            and reads.isdisjoint(self.writes))

    def add(self, phase: Phase, reads: frozenset[int], writes: frozenset[int]) -> None:
        self.labels.append(phase.label)
        self.vertices.extend(phase.vertices)
        self.transfers.append(phase.transfers)
        self.reads |= reads
        self.writes |= writes
        self.reduction = self.reduction and _is_reduction(phase)

    def step(self) -> Step:
        """The step without its transfers (`schedule` attaches them)."""
        return Step(self.kind, tuple(self.labels), tuple(self.vertices))


def _is_reduction(phase: Phase) -> bool:
    return phase.kind == COMPUTE and all(
        map(REDUCE_KERNEL.__eq__, map(attrgetter("kernel"), phase.vertices)))


class _Effects:
    """(reads, writes) buffer sets of phases, as `Phase.reads/writes` define
    them, computed once per phase object during one `schedule` call
    (reduction delay and merging ask again for the same phases).  An
    exchange phase's buffers are found with a mask over the `nbufs` buffer
    ids (10^5 transfer rows, a few thousand distinct buffers)."""

    def __init__(self, nbufs: int) -> None:
        self._memo: dict[int, tuple[Phase, Effects]] = {}
        self._seen = np.zeros(nbufs, dtype=bool)  # scratch: all False between calls

    def __call__(self, phase: Phase) -> Effects:
        hit = self._memo.get(id(phase))
        if hit is not None and hit[0] is phase:
            return hit[1]
        if phase.kind == COMPUTE:
            eff = frozenset(phase.reads()), frozenset(phase.writes())
        else:
            x = phase.transfers
            eff = (self._distinct(x.src_buf, [b for _, s, _ in x.seq for b, _ in s]),
                   self._distinct(x.dst_buf, [b for _, _, d in x.seq for b, _ in d]))
        self._memo[id(phase)] = (phase, eff)  # holding the phase keeps its id unique
        return eff

    def _distinct(self, bufs: np.ndarray, more: list[int]) -> frozenset[int]:
        seen = self._seen
        seen[bufs] = True
        seen[np.asarray(more, dtype=np.int64)] = True
        found = np.flatnonzero(seen)
        seen[found] = False
        return frozenset(found.tolist())


def _independent(a: Effects, b: Effects) -> bool:
    (ra, wa), (rb, wb) = a, b
    return not (wa & (rb | wb) or wb & ra)


def _delay_reductions(segment: list[Phase], effects: _Effects) -> tuple[list[Phase], int]:
    """Move each reduction phase forward past independent exchange phases to
    sit just before the next compute phase it is independent of."""
    phases = list(segment)
    moved = 0
    i = 0
    while i < len(phases):
        p = phases[i]
        if not _is_reduction(p):
            i += 1
            continue
        eff = effects(p)
        j = i + 1
        while (j < len(phases) and phases[j].kind == EXCHANGE
               and _independent(eff, effects(phases[j]))):
            j += 1
        if j > i + 1 and j < len(phases) and phases[j].kind == COMPUTE:
            if _independent(eff, effects(phases[j])):
                phases.insert(j - 1, phases.pop(i))
                moved += 1
                i = j  # continue after the moved reduction
                continue
        i += 1
    return phases, moved


def _merge(segment: list[Phase], reduction_overlap: bool, lookahead: int,
           effects_of: _Effects) -> tuple[list[_Group], int]:
    """Greedy superstep packing: each step starts with the first pending
    phase and absorbs later pending phases of its kind, looking at most
    `lookahead` phases past the last one it could not take, provided the
    absorbed phase is independent of the step and of every pending phase it
    jumps over (so every dependency still runs in an earlier step)."""
    pending = [ph for ph in segment if ph.vertices or ph.transfers]
    effects = [effects_of(ph) for ph in pending]
    groups: list[_Group] = []
    merged = 0
    while pending:
        head = pending.pop(0)
        r0, w0 = effects.pop(0)
        group = _Group(head, r0, w0)
        skipped_r: set[int] = set()
        skipped_w: set[int] = set()
        j = 0
        misses = 0
        while j < len(pending) and misses < lookahead:
            ph = pending[j]
            reads, writes = effects[j]
            ok = group.absorbs(ph.kind, reads, writes) and (
                reduction_overlap or not (group.reduction or _is_reduction(ph)))
            ok = ok and (writes.isdisjoint(skipped_r) and writes.isdisjoint(skipped_w)
                         and reads.isdisjoint(skipped_w))
            if ok:
                group.add(ph, reads, writes)
                pending.pop(j)
                effects.pop(j)
                merged += 1
                continue
            j += 1
            misses += 1
            if misses < lookahead:  # else the scan ends and the skipped sets go unread
                skipped_r |= reads
                skipped_w |= writes
        groups.append(group)
    return groups, merged


def schedule(program: Program, reduction_overlap: bool = False,
             lookahead: int = LOOKAHEAD) -> Schedule:
    """Turn `program.items` into supersteps.

    Raises BuildFailure("schedule", ...) on unbalanced loop marks, a phase of
    unknown kind, or an iterated ref outside every Repeat; ValueError on a
    vertex without NARGS args (a builder bug).
    """
    steps: list[Step] = []
    parts: list[list[Xfers]] = []  # each step's transfers, one part per merged phase
    loop_of: list[int] = []
    open_loops: list[int] = []
    merged_total = 0
    delayed_total = 0
    segment: list[Phase] = []
    effects = _Effects(len(program.bufs))

    def flush() -> None:
        nonlocal merged_total, delayed_total
        phases = segment
        if reduction_overlap:
            phases, moved = _delay_reductions(phases, effects)
            delayed_total += moved
        window = max(lookahead, OVERLAP_LOOKAHEAD) if reduction_overlap else lookahead
        new, merged = _merge(phases, reduction_overlap, window, effects)
        merged_total += merged
        enclosing = open_loops[-1] if open_loops else -1
        for group in new:
            st = group.step()
            if enclosing < 0 and _has_iterated(st.vertices, group.transfers):
                raise BuildFailure(
                    "schedule", _first_tile(st), 0, 0,
                    f"step {len(steps)} ({st.labels[0]}) has an iterated ref outside any Repeat",
                )
            steps.append(st)
            parts.append(group.transfers)
            loop_of.append(enclosing)
        segment.clear()

    for item in program.items:
        if isinstance(item, Phase):
            if item.kind not in (COMPUTE, EXCHANGE):
                raise BuildFailure("schedule", -1, 0, 0, f"phase {item.label}: kind {item.kind!r}")
            segment.append(item)
            continue
        assert isinstance(item, LoopMark)
        flush()
        enclosing = open_loops[-1] if open_loops else -1
        if item.begin:
            if item.trips < 1:
                raise BuildFailure("schedule", -1, 0, 0, f"loop {item.label}: trips {item.trips}")
            open_loops.append(len(steps))
            steps.append(Step(REPEAT_BEGIN, (item.label,), trips=item.trips))
            parts.append([])
            loop_of.append(enclosing)
            continue
        if not open_loops:
            raise BuildFailure("schedule", -1, 0, 0, f"loop end {item.label} without a begin")
        begin = open_loops.pop()
        end = len(steps)
        b = steps[begin]
        steps[begin] = Step(REPEAT_BEGIN, b.labels, trips=b.trips, match=end)
        steps.append(Step(REPEAT_END, (item.label,), trips=0, match=begin))
        parts.append([])
        loop_of.append(open_loops[-1] if open_loops else -1)
    flush()
    if open_loops:
        label = steps[open_loops[-1]].labels[0]
        raise BuildFailure("schedule", -1, 0, 0, f"loop {label} never ends")
    frozen, xfers = _attach_transfers(steps, parts)
    return Schedule(frozen, tuple(loop_of), merged_total, delayed_total, xfers,
                    vertex_arrays(frozen))


def _attach_transfers(steps: list[Step],
                      parts: list[list[Xfers]]) -> tuple[tuple[Step, ...], XferArrays]:
    """Concatenate every step's transfer parts once, in step order; each
    step's `transfers` is then a view of its rows."""
    counts = np.fromiter((sum(map(len, ps)) for ps in parts), dtype=np.int64, count=len(parts))
    x = Xfers.concat([p for ps in parts for p in ps])
    out = []
    lo = 0
    for st, n in zip(steps, counts.tolist(), strict=True):
        out.append(replace(st, transfers=x.rows(lo, lo + n)) if n else st)
        lo += n
    return tuple(out), _xfer_arrays(x, counts)


def _has_iterated(vertices: tuple[Vertex, ...], transfers: list[Xfers]) -> bool:
    refs = list(chain.from_iterable(map(attrgetter("refs"), vertices)))
    if any(map(attrgetter("iter_stride"), refs)) or any(map(attrgetter("seq"), refs)):
        return True
    return any(x.iterated for x in transfers)


def _first_tile(st: Step) -> int:
    return st.vertices[0].tile if st.vertices else -1
