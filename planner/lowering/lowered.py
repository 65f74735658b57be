"""The lowered form of a Graph under a Plan (what `planner.lowering.lower` produces and
`planner.lowering.expand` consumes): `Value`s — a tensor in one layout and dtype —
and a flat list of `Step`s over them, with the Repeat's loop-carried values
(`Carry`) and where parameters, inputs and outputs live.  Plain frozen data;
the step kinds and their meaning are described in `planner.lowering.lower`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.decide import catalogue as cat
from planner.decide.layout import Layout
from planner.ir.graph import DTYPE_BYTES, Op


@dataclass(frozen=True)
class Value:
    """A tensor in one layout and dtype.  `trips` > 0: an iterated parameter's
    home (a sequence of `trips` per-layer blocks per cell)."""

    name: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    scale_exp: int
    layout: Layout
    role: str = "activation"  # activation | canonical | parameter | input | output
    trips: int = 0

    @property
    def elem(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Step:
    kind: str  # compute | redistribute | cast | loop_begin | loop_end
    label: str
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    op: Op | None = None
    recipe: cat.Recipe | None = None
    segments: tuple[tuple[int, int, int, int, int, int], ...] = ()
    trips: int = 0
    row_moves: int = 0  # a move's pieces of at most this many rows go row by row (Plan)
    fused: str = ""  # the fused sibling group (Plan.fused key) a matmul step belongs to


@dataclass(frozen=True)
class Carry:
    """Loop-carried value k of a Repeat: `init` lives in buffer set 0,
    iteration i reads `arg` from set i % 2 and writes `yld` to set (i+1) % 2,
    `final` is set trips % 2."""

    init: str
    arg: str
    yld: str
    final: str
    trips: int


@dataclass
class Lowered:
    values: dict[str, Value] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    carries: list[Carry] = field(default_factory=list)
    # outer parameter name -> home value name; graph inputs/outputs -> value
    homes: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    # rotation key (parameterised op / vector parameter) -> logical base tile used
    rotation: dict[str, int] = field(default_factory=dict)

    def runs(self) -> dict[str, int]:
        """How many times each step runs, by label: the product of the trips
        of the Repeats around it (a label's first step)."""
        out: dict[str, int] = {}
        mult = [1]
        for s in self.steps:
            if s.kind == "loop_begin":
                mult.append(mult[-1] * max(s.trips, 1))
            elif s.kind == "loop_end":
                if len(mult) > 1:
                    mult.pop()
            else:
                out.setdefault(s.label, mult[-1])
        return out

    def describe(self) -> str:
        """One line per step (the printable lowered op list)."""
        lines = []
        depth = 0
        for s in self.steps:
            if s.kind == "loop_end":
                depth -= 1
            pad = "  " * depth
            if s.kind == "loop_begin":
                lines.append(f"{pad}repeat x{s.trips} {s.label}")
                depth += 1
                continue
            if s.kind == "loop_end":
                lines.append(f"{pad}end {s.label}")
                continue
            key = f" [{s.recipe.key}]" if s.recipe else ""
            outs = ", ".join(self._fmt(v) for v in s.outputs)
            ins = ", ".join(self._fmt(v) for v in s.inputs)
            lines.append(f"{pad}{s.kind} {s.label}{key}: {ins} -> {outs}")
        return "\n".join(lines)

    def _fmt(self, name: str) -> str:
        v = self.values[name]
        lay = v.layout
        return f"{name}<{v.dtype} {lay.nr}x{lay.nc} cells>"


def identity_segments(rows: int, cols: int) -> tuple[tuple[int, int, int, int, int, int], ...]:
    return ((0, rows, 0, 0, 0, cols),)
