"""Schedule: a Program's phases and loop marks → an ordered list of supersteps.

Every phase becomes (part of) one step; every loop mark one REPEAT_BEGIN or
REPEAT_END step.  Step indices are what allocation liveness and the package's
`buf_first`/`buf_last` count in.

Merging.  Adjacent phases of the same kind merge into one step when they are
independent: no buffer written by one is read or written by the other (a
phase's own members are independent by the Program contract).  With
`lookahead` > 1 a step may also absorb a later phase of its kind that is
independent of every phase it jumps over (up to `lookahead` phases past the
last one it could not take).  The default is 1 (adjacent only): a longer
lookahead saves little on the front end's programs and keeps buffers live
across the phases it jumps, which raises the peak tile bytes that the
27-layer model cannot afford.  A merged
compute step costs the max over tiles of the summed vertex cycles instead of a
sum of maxima; a merged exchange step pays one sync instead of two.

Reductions (phases whose vertices are all REDUCE) merge only when the plan's
`reduction_overlap` flag is set, or with each other when they are one fused
sibling group's (`Phase.group`: the group's members run as one recipe).
With the flag a reduction may also be delayed past the exchange phases that
follow it, when none of them touches what the reduction reads or writes, to
run in the same superstep as the next independent compute phase, and every
step looks OVERLAP_LOOKAHEAD phases ahead for independent work of its kind
(so a K-split reduction overlaps the next matmul's partial products).  That
overlap lengthens live ranges, which is why it is a plan decision and not a
default.

Nothing crosses a loop mark: the body of a Repeat is scheduled on its own.
Empty phases are dropped (an empty exchange would still pay a sync).

The schedule carries its transfers and vertices as flat columns
(`planner.lowering.columns`): all transfer rows are concatenated once in step order
(each `Step.transfers` is a view of its rows), and the vertex columns are
read per compute phase, remembered with the phase's other facts (a build
state's `PhaseMemo`)
across calls while the phase is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from planner.lowering.columns import (
    PhaseColumns,
    PhaseMemo,
    VertexArrays,
    XferArrays,
    concat_columns,
    phase_columns,
    xfer_arrays,
)
from planner.lowering.program import LoopMark, Phase, Program, Vertex, Xfers
from tilecommon.errors import BuildFailure

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
    `labels` name the phases merged into the step, in program order, and
    `phases` says what each is: (the lowered step it expands, its part;
    Phase.source / Phase.part).  `transfers` holds the rows of the merged
    exchange phases in that order."""

    kind: str
    labels: tuple[str, ...]
    vertices: tuple[Vertex, ...] = ()
    transfers: Xfers = _NO_TRANSFERS
    trips: int = 0
    match: int = -1
    phases: tuple[tuple[str, str], ...] = ()


def transfer_arrays(steps: tuple[Step, ...]) -> XferArrays:
    """Concatenate the transfer columns of `steps` (the back end's hot lists)."""
    counts = np.fromiter((len(st.transfers) for st in steps), dtype=np.int64, count=len(steps))
    return xfer_arrays(Xfers.concat([st.transfers for st in steps]), counts)


def vertex_arrays(steps: tuple[Step, ...]) -> VertexArrays:
    """Flatten the vertices of `steps` and their refs, reads and writes.
    Raises ValueError on a vertex without NARGS args."""
    blocks = [(s, phase_columns(st.vertices)) for s, st in enumerate(steps) if st.vertices]
    return concat_columns([b for _, b in blocks], [s for s, _ in blocks])


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

    def outline(self) -> Schedule:
        """The steps without their vertices and transfers (kinds, labels,
        phases, loops: what a step profile reads), for a build kept after
        its package is made: a 27-layer schedule's rows are ~10⁶ objects."""
        return Schedule(tuple(replace(st, vertices=(), transfers=_NO_TRANSFERS)
                              for st in self.steps), self.loop_of, self.merged, self.delayed)

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


@dataclass(frozen=True, eq=False)
class _PhaseFacts:
    """What scheduling needs of one phase: its (reads, writes) buffer sets as
    `Phase.reads/writes` define them, whether it is a reduction, whether any
    of its refs is iterated, and (compute phases) its vertex columns."""

    effects: Effects
    reduction: bool
    iterated: bool
    columns: PhaseColumns | None


# the facts of recent programs' compute phases: the optimizer's trial programs
# share most phases (planner.lowering.columns).  Weight = vertices: ~8 vit-tiny 2-layer
# programs' worth (~25k vertices each), ~100 MB at most.  Exchange phases are
# not remembered: their facts cost a mask pass, their rows much memory.


class _Facts:
    """`_PhaseFacts` of one `schedule` call's phases, read once per call
    (reduction delay and merging ask again) and for compute phases once
    while `memo` (a build state's) remembers them.  Buffer sets are found with
    a mask over the program's `nbufs` buffer ids (an exchange phase holds up to
    10^5 transfer rows but a few thousand distinct buffers)."""

    def __init__(self, nbufs: int, memo: PhaseMemo[_PhaseFacts] | None) -> None:
        self.memo = memo
        self._seen = np.zeros(nbufs, dtype=bool)  # scratch: all False between calls
        self._known: dict[int, tuple[Phase, _PhaseFacts]] = {}  # holds its phases

    def __call__(self, phase: Phase) -> _PhaseFacts:
        hit = self._known.get(id(phase))
        if hit is not None and hit[0] is phase:
            return hit[1]
        facts = self.memo.get(phase) if phase.kind == COMPUTE and self.memo else None
        if facts is None:
            facts = self._read(phase)
            if phase.kind == COMPUTE:
                if self.memo is not None:
                    self.memo.put(phase, facts)
        self._known[id(phase)] = (phase, facts)
        return facts

    def _read(self, phase: Phase) -> _PhaseFacts:
        if phase.kind == COMPUTE:
            cols = phase_columns(phase.vertices)
            effects = self._distinct(cols.read_buf, []), self._distinct(cols.write_buf, [])
            return _PhaseFacts(effects, _is_reduction(phase), bool(cols.iterated.size), cols)
        x = phase.transfers
        effects = (self._distinct(x.src_buf, [b for _, s, _ in x.seq for b, _ in s]),
                   self._distinct(x.dst_buf, [b for _, _, d in x.seq for b, _ in d]))
        return _PhaseFacts(effects, False, x.iterated, None)

    def _distinct(self, bufs: np.ndarray, more: list[int]) -> frozenset[int]:
        seen = self._seen
        seen[bufs] = True
        seen[np.asarray(more, dtype=np.int64)] = True
        found = np.flatnonzero(seen)
        seen[found] = False
        return frozenset(found.tolist())


class _Group:
    """A step under construction: phases of one kind merged so far."""

    def __init__(self, phase: Phase, facts: _PhaseFacts) -> None:
        self.kind = phase.kind
        self.labels = [phase.label]
        self.phases = [(phase.base, phase.part)]
        self.vertices = list(phase.vertices)
        self.transfers = [phase.transfers]
        self.facts = [facts]
        self.reads, self.writes = facts.effects  # copied only when a phase joins
        self.reduction = facts.reduction
        self.group = phase.group  # "" once phases of different fused groups join

    def absorbs(self, kind: str, reads: frozenset[int], writes: frozenset[int]) -> bool:
        if kind != self.kind:
            return False
        return (writes.isdisjoint(self.reads) and writes.isdisjoint(self.writes)
                and reads.isdisjoint(self.writes))

    def add(self, phase: Phase, facts: _PhaseFacts) -> None:
        self.labels.append(phase.label)
        self.phases.append((phase.base, phase.part))
        self.vertices.extend(phase.vertices)
        self.transfers.append(phase.transfers)
        self.facts.append(facts)
        self.reads = self.reads | facts.effects[0]
        self.writes = self.writes | facts.effects[1]
        self.reduction = self.reduction and facts.reduction
        self.group = self.group if phase.group == self.group else ""

    def step(self) -> Step:
        """The step without its transfers (`schedule` attaches them)."""
        return Step(self.kind, tuple(self.labels), tuple(self.vertices),
                    phases=tuple(self.phases))


def _same_group(group: _Group, phase: Phase) -> bool:
    """`phase` and every phase of `group` belong to one fused sibling group."""
    return bool(phase.group) and group.group == phase.group


def _is_reduction(phase: Phase) -> bool:
    return phase.kind == COMPUTE and all(
        map(REDUCE_KERNEL.__eq__, map(attrgetter("kernel"), phase.vertices)))


def _independent(a: Effects, b: Effects) -> bool:
    (ra, wa), (rb, wb) = a, b
    return not (wa & (rb | wb) or wb & ra)


def _delay_reductions(segment: list[Phase], facts: _Facts) -> tuple[list[Phase], int]:
    """Move each reduction phase forward past independent exchange phases to
    sit just before the next compute phase it is independent of."""
    phases = list(segment)
    moved = 0
    i = 0
    while i < len(phases):
        p = phases[i]
        if not facts(p).reduction:
            i += 1
            continue
        eff = facts(p).effects
        j = i + 1
        while (j < len(phases) and phases[j].kind == EXCHANGE
               and _independent(eff, facts(phases[j]).effects)):
            j += 1
        if j > i + 1 and j < len(phases) and phases[j].kind == COMPUTE:
            if _independent(eff, facts(phases[j]).effects):
                phases.insert(j - 1, phases.pop(i))
                moved += 1
                i = j  # continue after the moved reduction
                continue
        i += 1
    return phases, moved


def _merge(segment: list[Phase], reduction_overlap: bool, lookahead: int,
           facts_of: _Facts) -> tuple[list[_Group], int]:
    """Greedy superstep packing: each step starts with the first pending
    phase and absorbs later pending phases of its kind, looking at most
    `lookahead` phases past the last one it could not take, provided the
    absorbed phase is independent of the step and of every pending phase it
    jumps over (so every dependency still runs in an earlier step)."""
    pending = [ph for ph in segment if ph.vertices or ph.transfers]
    facts = [facts_of(ph) for ph in pending]
    groups: list[_Group] = []
    merged = 0
    while pending:
        group = _Group(pending.pop(0), facts.pop(0))
        skipped_r: set[int] = set()
        skipped_w: set[int] = set()
        j = 0
        misses = 0
        while j < len(pending) and misses < lookahead:
            ph, f = pending[j], facts[j]
            reads, writes = f.effects
            ok = group.absorbs(ph.kind, reads, writes) and (
                reduction_overlap or not (group.reduction or f.reduction)
                or (group.reduction and f.reduction and _same_group(group, ph)))
            ok = ok and (writes.isdisjoint(skipped_r) and writes.isdisjoint(skipped_w)
                         and reads.isdisjoint(skipped_w))
            if ok:
                group.add(ph, f)
                pending.pop(j)
                facts.pop(j)
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
             lookahead: int = LOOKAHEAD, memo: PhaseMemo | None = None) -> Schedule:
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
    facts = _Facts(len(program.bufs), memo)
    blocks: list[tuple[int, PhaseColumns]] = []  # (step, vertex columns) of compute phases

    def flush() -> None:
        nonlocal merged_total, delayed_total
        phases = segment
        if reduction_overlap:
            phases, moved = _delay_reductions(phases, facts)
            delayed_total += moved
        window = max(lookahead, OVERLAP_LOOKAHEAD) if reduction_overlap else lookahead
        new, merged = _merge(phases, reduction_overlap, window, facts)
        merged_total += merged
        enclosing = open_loops[-1] if open_loops else -1
        for group in new:
            st = group.step()
            if enclosing < 0 and any(f.iterated for f in group.facts):
                raise BuildFailure(
                    "schedule", _first_tile(st), 0, 0,
                    f"step {len(steps)} ({st.labels[0]}) has an iterated ref outside any Repeat",
                )
            blocks.extend((len(steps), f.columns) for f in group.facts
                          if f.columns is not None and f.columns.tile.size)
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
            steps.append(Step(REPEAT_BEGIN, (item.label,), trips=item.trips,
                              phases=((item.label, ""),)))
            parts.append([])
            loop_of.append(enclosing)
            continue
        if not open_loops:
            raise BuildFailure("schedule", -1, 0, 0, f"loop end {item.label} without a begin")
        begin = open_loops.pop()
        end = len(steps)
        b = steps[begin]
        steps[begin] = replace(b, match=end)
        steps.append(Step(REPEAT_END, (item.label,), trips=0, match=begin,
                          phases=((item.label, ""),)))
        parts.append([])
        loop_of.append(open_loops[-1] if open_loops else -1)
    flush()
    if open_loops:
        label = steps[open_loops[-1]].labels[0]
        raise BuildFailure("schedule", -1, 0, 0, f"loop {label} never ends")
    frozen, xfers = _attach_transfers(steps, parts)
    verts = concat_columns([b for _, b in blocks], [s for s, _ in blocks])
    return Schedule(frozen, tuple(loop_of), merged_total, delayed_total, xfers, verts)


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
    return tuple(out), xfer_arrays(x, counts)


def _first_tile(st: Step) -> int:
    return st.vertices[0].tile if st.vertices else -1
