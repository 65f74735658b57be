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

from dataclasses import dataclass, field

# buffer kinds a builder may create; code / exchange-table / support buffers are
# created by the linker, never by expand.
TENSOR_KINDS = ("parameter", "activation", "scratch", "exchange-landing")

NARGS = 16


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


@dataclass(slots=True)
class Phase:
    """A group of vertices (kind "compute") or transfers (kind "exchange") that
    may run in one superstep: no byte is written by one member and touched by
    another.  `label` says which op or conversion produced it (for reports)."""

    kind: str
    label: str
    vertices: list[Vertex] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)

    def reads(self) -> set[int]:
        if self.kind == "compute":
            return {b for v in self.vertices for b in v.reads}
        return {b for t in self.transfers for b in t.src.buffers()}

    def writes(self) -> set[int]:
        if self.kind == "compute":
            return {b for v in self.vertices for b in v.writes}
        return {b for t in self.transfers for b in t.dst.buffers()}


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
