"""What the families' expanders build vertices with (kernel ABI:
docs/contracts.md §2): the expander they work on (`ExpandContext`), argument
slots from names (`scalars`) and `make_vertex`.

Each family's `expand` (planner.lowering.families) takes the expander and one
lowered compute step and appends phases; operand cells are found through the
values' layouts, so the grid → tile map chosen by lower is never recomputed.
A vit-tiny build makes ~2·10⁴ vertices, so they are built by `make_vertex`
from a ready args tuple (each family's argument builders are memoised: the
cells of one op share a few shapes) and (arg, loc) operand pairs (tests
compare it with an obvious dict-based twin, tests/handprog.py `dict_vertex`).
"""

from __future__ import annotations

import struct
from typing import Protocol

from kernels import abi
from planner.lowering.expand_redist import Loc, loc_bufs, ref
from planner.lowering.lowered import Step, Value
from planner.lowering.program import NARGS, LoopMark, Phase, Program, Ref, Vertex

DT = {name: code for code, name in enumerate(abi.DTYPE_NAMES)}

Operands = tuple[tuple[int, Loc], ...]  # (vertex arg index, loc), in any order


class ExpandContext(Protocol):
    """What the per-family expanders need of the expander
    (planner.lowering.expand.Expander): the program being built, the placed
    values and their locations, phase emission and buffer materialisation."""

    prog: Program

    def value(self, name: str) -> Value: ...

    def locs(self, name: str) -> list[list[Loc]]: ...

    def emit(self, item: Phase | LoopMark) -> None: ...

    def materialise(self, v: Value, kind: str | None = None,
                    skip: dict[tuple[int, int], Loc] | None = None) -> None: ...

    def params(self, step: Step) -> None: ...

    def redistribute(self, src: str, dst: str, segments: tuple, label: str,
                     row_moves: int = 0) -> None: ...



def f32_bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", float(x)))[0])


def scalars(kernel: str, **named: int) -> tuple[int, ...]:
    """The NARGS vertex args of `kernel` with the `named` arguments set (the
    slot names of kernels.abi.KERNEL_ARGS), the others 0."""
    names = abi.KERNEL_ARGS[kernel]
    a = [0] * NARGS
    for k, v in named.items():
        a[names.index(k)] = int(v)
    return tuple(a)


def _bufs(ops: Operands) -> tuple[int, ...]:
    """Sorted unique buffers of the operand locs (every iteration's)."""
    if len(ops) == 1:
        return loc_bufs(ops[0][1])
    bufs = {loc[0] for _, loc in ops if not loc[3]}
    for _, loc in ops:
        if loc[3]:
            bufs.update(b for b, _ in loc[3])
    return tuple(sorted(bufs))


def make_vertex(tile: int, kid: int, args: tuple[int, ...], reads: Operands,
                writes: Operands) -> Vertex:
    """A vertex from its args as a ready NARGS tuple (address slots 0) and
    its address operands as (arg index, loc) pairs, arg indices distinct:
    refs in arg order, reads/writes the buffers of the read/written locs."""
    refs = tuple([ref(k, loc) if loc[3] else Ref(k, loc[0], loc[1], loc[2])
                  for k, loc in sorted(reads + writes)])
    return Vertex(tile, kid, args, refs, _bufs(reads), _bufs(writes))
