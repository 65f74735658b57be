"""Op kinds: everything about one kind of graph op, declared in one place.

An op kind is a frozen dataclass deriving from `planner.ir.graph.OpBase`,
registered by its class name in `OPS` (`@register_op`), whose declaration
states (planner/ir/ops/ holds the built-in kinds, one module each):

- its fields: the tensors it reads (`READS`, in order) and writes (`WRITES`),
  and its attributes (every other field: `attributes()`);
- `check(g)`: its shape and dtype rule (GraphError naming the op);
- `compute(g, env)`: its reference formula, the unrounded float32 result
  (planner.ir.reference rounds it to the output's dtype);
- `macs(g)`: its multiply-accumulates (the roofline's numerator);
- `param_roles()`: the init role of each parameter it reads (weight, bias,
  gamma, beta, ...; planner.ir.reference.init_params draws by role);
- `FAMILY`: the recipe family that places it on the device — "matmul",
  "bmm", "rows" or "move" (planner.decide.families generates a family's
  recipes, planner.lowering.families lays it out and expands it into
  vertices and transfers);
- the hooks its family asks for: a row op (`RowOp`) names how each operand
  lines up with its rows (`OPERANDS`), whether it may run on column blocks
  (`ELEMENTWISE`) and the kernel call of one block of rows (`row_call`); a
  move op (`MoveOp`) the rows it copies where (`segments`);
- traits the planner asks about instead of the op's class: `CONVERSION` (a
  Cast: redistributions may absorb it) and `NARROW_OPERAND` (the operand
  whose fp8 cast may run before the move, arriving narrow).

`Repeat` (graph.py) is the IR's loop, not an op kind.  A new op kind in an
existing family is one new module: its dataclass with these methods (the
test tests/test_opkind.py defines one inside the test file and plans and
runs it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from kernels.abi import FLOAT_ARGS, KERNEL_ARGS
from planner.ir.graph import DTYPE_BYTES, DTYPES, Graph, OpBase, Tensor
from tilecommon.errors import GraphError
from tilecommon.registry import Registry

OPS: Registry[type[OpBase]] = Registry("op kind", "tileplan.ops", "op")
C = TypeVar("C", bound=type[OpBase])

FAMILIES = ("matmul", "bmm", "rows", "move")
# how a row op's operand lines up with the rows of its leading operand (RowOp.OPERANDS)
ROW, TABLE, VECTOR, WHOLE = "row", "table", "vector", "whole"
OPERAND_KINDS = (ROW, TABLE, VECTOR, WHOLE)
ACT = ("fp16", "fp32")  # activation dtypes of the vector ops
# a redistribution segment (dr0, dr1, dc0, sr0, sc0, ncols): MoveOp.segments
Segment = tuple[int, int, int, int, int, int]


def register_op(cls: C) -> C:
    """Class decorator: register op kind `cls` under its class name (OPS),
    after checking its declaration: a known FAMILY and, for a row op, an
    OPERANDS entry for every tensor field it reads."""
    if cls.FAMILY not in FAMILIES:
        raise ValueError(f"op kind {cls.__name__}: FAMILY {cls.FAMILY!r} not in {FAMILIES}")
    if issubclass(cls, RowOp):
        missing = [f for f in cls.READS if f not in cls.OPERANDS]
        bad = [k for k in cls.OPERANDS.values() if k not in OPERAND_KINDS]
        if missing or bad or cls.OPERANDS.get(cls.READS[0]) != ROW:
            raise ValueError(f"op kind {cls.__name__}: OPERANDS {cls.OPERANDS} must give every "
                             f"read field one of {OPERAND_KINDS}, the first {ROW!r}")
    OPS.register(cls.__name__)(cls)
    return cls


# ---------------------------------------------------------------- shape rules


def same_shape(op: OpBase, what: str, a: Tensor, b: Tensor) -> None:
    if a.shape != b.shape:
        raise GraphError(op.name, f"{what}: {a.name} {a.shape} vs {b.name} {b.shape}")


def dtype_in(op: OpBase, t: Tensor, allowed: tuple[str, ...]) -> None:
    if t.dtype not in allowed:
        raise GraphError(op.name, f"{t.name}: dtype {t.dtype} not in {allowed}")


def rank(op: OpBase, t: Tensor, want: int) -> None:
    if len(t.shape) != want:
        raise GraphError(op.name, f"{t.name}: rank {len(t.shape)} (shape {t.shape}), want {want}")


def positive_float(op: OpBase, what: str, value: object, below: float | None = None) -> None:
    """GraphError unless `value` is a float > 0 (and < `below` when given)."""
    if not (isinstance(value, float) and value > 0.0 and (below is None or value < below)):
        kind = f"a float in (0, {below:g})" if below is not None else "a positive float"
        raise GraphError(op.name, f"{what} {value!r} must be {kind}")


def one_of(op: OpBase, what: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise GraphError(op.name, f"{what} {value!r} not in {allowed}")


# ---------------------------------------------------------------- row family


@dataclass(frozen=True)
class Operand:
    """One operand of a row op's kernel call as it lies on the tile: its
    dtype and fp8 scale, the block's rows and columns and `ld`, the bytes
    from one row to the next (0: one row read by every row)."""

    dtype: str
    scale_exp: int
    rows: int
    cols: int
    ld: int

    @property
    def elem(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class RowCell:
    """One block of a row op: rows [row0, row0 + rows) and columns [col0,
    col0 + cols) of its leading operand seen as a matrix of `total_rows` ×
    `total_cols`, with every operand (read and written fields) as it lies on
    the tile (`Operand`)."""

    rows: int
    cols: int
    row0: int
    col0: int
    total_rows: int
    total_cols: int
    operands: tuple[tuple[str, Operand], ...]

    def __getitem__(self, name: str) -> Operand:
        for k, v in self.operands:
            if k == name:
                return v
        raise KeyError(f"row cell: no operand {name!r}")

    def dt(self, name: str) -> int:
        """The dtype code (kernels.abi) of operand `name`."""
        return DTYPES.index(self[name].dtype)


@dataclass(frozen=True)
class KernelCall:
    """A kernel call of one block: the kernel's name, its scalar arguments by
    name (floats for `eps`/`scale`) and which op field each address argument
    points at (`operands`: kernel argument -> field; written fields are the
    op's WRITES)."""

    kernel: str
    args: tuple[tuple[str, int | float], ...]
    operands: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        names = KERNEL_ARGS.get(self.kernel)
        if names is None:
            raise ValueError(f"kernel call: unknown kernel {self.kernel!r}")
        for k, _ in self.args + self.operands:
            if k not in names:
                raise ValueError(f"kernel call {self.kernel}: unknown argument {k!r}")

    def named(self) -> dict[str, int | float]:
        """The scalar arguments as keywords (floats as floats)."""
        return dict(self.args)

    def scalar_slots(self) -> dict[str, int]:
        """The scalar arguments as int64 slot values (floats as float32 bits)."""
        from kernels.dtypes import f32_as_u32

        return {k: (int(f32_as_u32(v)) if k in FLOAT_ARGS and isinstance(v, float) else int(v))
                for k, v in self.args}


def call(kernel: str, operands: Mapping[str, str], **args: int | float) -> KernelCall:
    """A KernelCall from keyword arguments (sorted, so equal calls are equal)."""
    return KernelCall(kernel, tuple(sorted(args.items())), tuple(sorted(operands.items())))


@dataclass(frozen=True)
class RowOp(OpBase):
    """An op of the "rows" family: it runs on blocks of whole rows of its
    leading operand (its first read field; column blocks too when
    ELEMENTWISE), every block one kernel call (`row_call`).  OPERANDS says
    how each read field lines up with the leading operand:

    - "row": the same rows and columns (a tensor with fewer rows is read
      row-periodically: row r is its row r mod rows, the position embedding);
    - "table": the same rows, periodically as for "row", but its own full
      width (RoPE's cos/sin tables);
    - "vector": a [N] vector whose columns line up with the columns (gamma,
      beta), one row read by every row;
    - "whole": the whole tensor on every tile of the op (an attention mask
      the kernel indexes itself).

    Parameters read as "vector" get chunked rotating homes, the others
    whole rows over as many tiles as possible (planner.lowering)."""

    FAMILY: ClassVar[str] = "rows"
    OPERANDS: ClassVar[dict[str, str]] = {}
    ELEMENTWISE: ClassVar[bool] = False

    def row_call(self, cell: RowCell) -> KernelCall:
        """The kernel call of one block (`cell`)."""
        raise NotImplementedError(f"op kind {self.kind} has no row_call")

    def positional(self) -> bool:
        """True when the kernel call of a block depends on where the block
        is (`cell.row0`, `cell.col0`: a causal softmax); otherwise blocks are
        asked for at (0, 0), so blocks of one shape share one call."""
        return False


@dataclass(frozen=True)
class MoveOp(OpBase):
    """An op of the "move" family: pure data movement between canonical
    layouts, lowered as one redistribution (SplitHeads, MergeHeads,
    Broadcast, Rows).  Codes are copied, so an fp8 output keeps its input's
    scale."""

    FAMILY: ClassVar[str] = "move"

    def segments(self, g: Graph) -> tuple[Segment, ...]:
        """The rows and columns it copies, as redistribution segments
        (dr0, dr1, dc0, sr0, sc0, ncols): output rows [dr0, dr1), columns
        [dc0, dc0 + ncols) come from input rows [sr0, sr0 + dr1 - dr0),
        columns [sc0, ...) (the 2-D views of `view2d`)."""
        raise NotImplementedError(f"op kind {self.kind} has no segments")


def attribute_items(op: OpBase) -> tuple[tuple[str, Any], ...]:
    """(field, value) of the op's attributes: every field but its name and
    the tensor fields it reads and writes."""
    tensor_fields = set(op.READS) | set(op.WRITES) | {"name"}
    return tuple((f.name, getattr(op, f.name)) for f in fields(op)
                 if f.name not in tensor_fields)
