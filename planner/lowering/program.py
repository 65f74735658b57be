"""The symbolic program: what expand and schedule hand to allocate and link.

Between "which tile computes what" (expand) and "at which address" (allocate,
link) the build works on *logical buffers*: per-tile byte ranges with a kind and
a name but no address yet.  Vertex operands and transfer endpoints refer to a
buffer plus a byte offset; the linker turns those into absolute addresses and,
inside a Repeat body, into Repeat patches.

Iterated bindings (a parameter sequence: layer i's block of a weight) are refs
whose address changes with the loop counter: either `iter_stride` bytes per
iteration inside one buffer, or an explicit per-iteration `seq` of
(buffer, offset).  The linker emits an arithmetic patch when the resolved
addresses are exactly `base + i*stride`, and a table patch otherwise.

Everything here is plain data; builders append to lists and the scheduler and
allocator read them.  Buffer ids are dense indices into `Program.bufs`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kernels.abi import N_ARGS, TENSOR_KIND_NAMES

# buffer kinds a builder may create (kernels.abi); code / exchange-table /
# support buffers are created by the linker, never by expand.
TENSOR_KINDS = TENSOR_KIND_NAMES
NARGS = N_ARGS


@dataclass(frozen=True, slots=True)
class Buf:
    """One logical buffer on one physical tile.

    `persistent` buffers (parameters, model inputs and outputs) are live for the
    whole program; the others from their first to their last referencing step.
    `align` is the required address alignment in bytes.
    """

    id: int
    tile: int
    nbytes: int
    kind: str
    name: str
    persistent: bool = False
    align: int = 8


@dataclass(frozen=True, slots=True)
class Ref:
    """An address operand: `buf` + `offset` bytes.

    `arg` is the vertex arg index it fills (for a transfer: 0 = source,
    1 = destination).  Inside a Repeat body, the address at iteration i is
    `addr(buf) + offset + i * iter_stride`, or, when `seq` is non-empty,
    `addr(seq[i][0]) + seq[i][1]` (len(seq) == trips of the enclosing loop).
    """

    arg: int
    buf: int
    offset: int = 0
    iter_stride: int = 0
    seq: tuple[tuple[int, int], ...] = ()

    @property
    def iterated(self) -> bool:
        return self.iter_stride != 0 or bool(self.seq)

    def buffers(self) -> tuple[int, ...]:
        """Every buffer this ref touches over all iterations (sorted, unique)."""
        if self.seq:
            return tuple(sorted({b for b, _ in self.seq}))
        return (self.buf,)


@dataclass(frozen=True, slots=True)
class Vertex:
    """One kernel invocation on one tile.

    `args` has NARGS ints; address args hold 0 and are filled from `refs` by
    the linker.  `reads`/`writes` name the buffers for liveness and scheduling
    (derived from refs by the builder that knows the kernel's operand roles).
    """

    tile: int
    kernel: int
    args: tuple[int, ...]
    refs: tuple[Ref, ...]
    reads: tuple[int, ...]
    writes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Transfer:
    """`nbytes` bytes from src (tile of src.buf) to dst (tile of dst.buf)."""

    src: Ref
    dst: Ref
    nbytes: int


Seq = tuple[tuple[int, int], ...]
_COLUMNS = ("src_buf", "src_off", "src_stride", "dst_buf", "dst_off", "dst_stride", "nbytes")


def _seq_row(entry: tuple[int, Seq, Seq]) -> int:
    return entry[0]


def _column(values: object, n: int | None = None) -> np.ndarray:
    a = np.ascontiguousarray(values, dtype=np.int64).reshape(-1 if n is None else n)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Xfers:
    """Transfers as columns (one int64 array per `Ref`/`Transfer` field, all
    of one length): row i moves `nbytes[i]` bytes from `src_buf[i]` +
    `src_off[i]` (+ i·`src_stride[i]` at Repeat iteration i) to the `dst_*`
    side.  Exchange phases hold 10⁴–10⁶ transfers; as columns, schedule,
    allocate and link work on them with numpy instead of per-object Python.

    `seq` lists the rows whose source or destination has a per-iteration
    `seq` (ping-pong loop carries): (row, src seq, dst seq), rows ascending,
    `()` for a side without one; such a row's `*_buf`/`*_off` hold iteration
    0 (as `Ref.buf`/`Ref.offset` do).  Arrays are read-only.  Iterating
    yields equivalent `Transfer` objects (source `arg` 0, destination 1)."""

    src_buf: np.ndarray
    src_off: np.ndarray
    src_stride: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray
    dst_stride: np.ndarray
    nbytes: np.ndarray
    seq: tuple[tuple[int, Seq, Seq], ...] = ()

    @staticmethod
    def columns(src_buf: object, src_off: object, dst_buf: object, dst_off: object,
                nbytes: object, src_stride: object = 0, dst_stride: object = 0,
                seq: tuple[tuple[int, Seq, Seq], ...] = ()) -> Xfers:
        """From array-likes (scalars broadcast to the length of `nbytes`)."""
        nb = _column(nbytes)
        n = nb.shape[0]
        cols = [_column(np.broadcast_to(np.asarray(c, dtype=np.int64), (n,)), n)
                for c in (src_buf, src_off, src_stride, dst_buf, dst_off, dst_stride)]
        return Xfers._make(cols + [nb], tuple(seq))

    @staticmethod
    def _make(cols: list[np.ndarray], seq: tuple[tuple[int, Seq, Seq], ...]) -> Xfers:
        sb, so, ss, db, do, ds, nb = cols
        return Xfers(sb, so, ss, db, do, ds, nb, seq)

    @staticmethod
    def empty() -> Xfers:
        return Xfers.columns([], [], [], [], [])

    @staticmethod
    def of(transfers: Iterable[Transfer]) -> Xfers:
        """From Transfer objects (tests, small hand-built programs)."""
        items = list(transfers)
        seq = tuple((i, t.src.seq, t.dst.seq) for i, t in enumerate(items)
                    if t.src.seq or t.dst.seq)
        return Xfers.columns(
            [t.src.buf for t in items], [t.src.offset for t in items],
            [t.dst.buf for t in items], [t.dst.offset for t in items],
            [t.nbytes for t in items], [t.src.iter_stride for t in items],
            [t.dst.iter_stride for t in items], seq)

    @staticmethod
    def concat(parts: Sequence[Xfers]) -> Xfers:
        """The rows of `parts` in order (seq rows renumbered)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return Xfers.empty()
        if len(parts) == 1:
            return parts[0]
        cols = [_column(np.concatenate([getattr(p, c) for p in parts])) for c in _COLUMNS]
        seq: list[tuple[int, Seq, Seq]] = []
        base = 0
        for p in parts:
            seq += [(i + base, s, d) for i, s, d in p.seq]
            base += len(p)
        return Xfers._make(cols, tuple(seq))

    def __len__(self) -> int:
        return int(self.nbytes.shape[0])

    def __iter__(self) -> Iterator[Transfer]:
        seqs = {i: (s, d) for i, s, d in self.seq}
        cols = [getattr(self, c).tolist() for c in _COLUMNS]
        for i, (sb, so, ss, db, do, ds, nb) in enumerate(zip(*cols, strict=True)):
            s, d = seqs.get(i, ((), ()))
            yield Transfer(Ref(0, sb, so, ss, s), Ref(1, db, do, ds, d), nb)

    def __getitem__(self, i: int) -> Transfer:
        return next(iter(self.take(np.asarray([i]))))

    def rows(self, lo: int, hi: int) -> Xfers:
        """Rows `lo`..`hi`-1 as views of these columns (no copy; seq rows
        renumbered from 0)."""
        a = bisect_left(self.seq, lo, key=_seq_row)
        b = bisect_left(self.seq, hi, key=_seq_row)
        seq = tuple((i - lo, s, d) for i, s, d in self.seq[a:b])
        return Xfers._make([getattr(self, c)[lo:hi] for c in _COLUMNS], seq)

    def take(self, rows: np.ndarray) -> Xfers:
        """The rows `rows` (int indices, in the given order)."""
        rows = np.asarray(rows, dtype=np.int64)
        where = {int(r): k for k, r in enumerate(rows.tolist())}
        seq = tuple(sorted((where[i], s, d) for i, s, d in self.seq if i in where))
        return Xfers._make([_column(getattr(self, c)[rows]) for c in _COLUMNS], seq)

    def reads(self) -> set[int]:
        """Every buffer read over all iterations (a seq row's `src_buf` is
        its iteration-0 buffer, itself in the seq)."""
        out = set(np.unique(self.src_buf).tolist())
        for _, s, _ in self.seq:
            out.update(b for b, _ in s)
        return out

    def writes(self) -> set[int]:
        """Every buffer written over all iterations."""
        out = set(np.unique(self.dst_buf).tolist())
        for _, _, d in self.seq:
            out.update(b for b, _ in d)
        return out

    @property
    def iterated(self) -> bool:
        """True when any row's address changes with the Repeat iteration."""
        return bool(self.seq) or bool(self.src_stride.any()) or bool(self.dst_stride.any())


# parts of a lowered step that expand emits as phases of their own (Phase.part)
PARTS = ("partials", "partial sums", "reduce", "pack", "unpack")


@dataclass(slots=True)
class Phase:
    """A group of vertices (kind "compute") or transfers (kind "exchange") that
    may run in one superstep: no byte is written by one member and touched by
    another.  `label` says which op or conversion produced it (for reports);
    `source` is the lowered step it expands (its label; "" = `label`) and
    `part` which part of that step it is ("" = the step itself, or one of
    PARTS: a K-split's partials, partial sums and reduce, a move's pack and
    unpack), so nothing downstream has to parse labels; `group` the fused
    sibling group (planner.decide.fusion) it is part of.  `transfers` may be
    given as Transfer objects; it is stored as `Xfers`."""

    kind: str
    label: str
    vertices: list[Vertex] = field(default_factory=list)
    transfers: Xfers = field(default_factory=Xfers.empty)
    source: str = ""
    part: str = ""
    group: str = ""  # a fused sibling group's key (its reductions share a step)

    def __post_init__(self) -> None:
        if not isinstance(self.transfers, Xfers):
            self.transfers = Xfers.of(self.transfers)

    @property
    def base(self) -> str:
        """The lowered step this phase expands (its label)."""
        return self.source or self.label

    def reads(self) -> set[int]:
        if self.kind == "compute":
            return {b for v in self.vertices for b in v.reads}
        return self.transfers.reads()

    def writes(self) -> set[int]:
        if self.kind == "compute":
            return {b for v in self.vertices for b in v.writes}
        return self.transfers.writes()


@dataclass(frozen=True, slots=True)
class LoopMark:
    """Start (`begin=True`, with `trips`) or end of a hardware Repeat."""

    begin: bool
    trips: int
    label: str


@dataclass(frozen=True, slots=True)
class IOBlock:
    """Where one block of a model input, parameter or output lives.

    `lo`/`hi` are the slice of the logical tensor (padded to 3 dims with 0..1
    on the left); the block is stored at `buf`+`offset` with byte strides
    `ld0` (dim 0) and `ld1` (dim 1), dim 2 contiguous.
    """

    tensor: str
    role: str
    buf: int
    offset: int
    lo: tuple[int, int, int]
    hi: tuple[int, int, int]
    ld0: int
    ld1: int


@dataclass
class Program:
    """Logical buffers + an ordered list of phases and loop marks + I/O blocks.

    expand appends phases in dependency order; schedule may merge adjacent
    independent phases; allocate gives every buffer an address; link lowers
    the result to a `simulator.Package`.
    """

    bufs: list[Buf] = field(default_factory=list)
    items: list[Phase | LoopMark] = field(default_factory=list)
    io: list[IOBlock] = field(default_factory=list)
    io_tensors: list[dict] = field(default_factory=list)

    def new_buf(
        self,
        tile: int,
        nbytes: int,
        kind: str,
        name: str,
        persistent: bool = False,
        align: int = 8,
    ) -> int:
        """Append a buffer and return its id.  Raises ValueError on a bad kind
        or size (an internal error: builders never take these from users)."""
        if kind not in TENSOR_KINDS:
            raise ValueError(f"buffer {name}: kind {kind!r} not in {TENSOR_KINDS}")
        if nbytes <= 0:
            raise ValueError(f"buffer {name} on tile {tile}: size {nbytes} must be positive")
        bid = len(self.bufs)
        self.bufs.append(Buf(bid, tile, nbytes, kind, name, persistent, align))
        return bid
