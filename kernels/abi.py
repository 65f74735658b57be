"""The ABI: every number two parts of tileplan must agree on, defined once.

- dtypes: codes (`DT_*`), names and element bytes;
- kernels: stable ids (`MATMUL` ...), the argument names of each kernel in slot
  order (`KERNEL_ARGS`), and from them `ARGS.<KERNEL>.<name>`, the slot of an
  argument (a named tuple: jitted code reads `args[ARGS.MATMUL.M]`, frozen at
  compile time); `N_ARGS` int64 slots per vertex; matmul flags;
- vertex regions: `MAX_REGIONS` rows of `REGION_COLS` columns;
- packages: step kinds (`STEP_*`), buffer kinds (`BUF_*`), patch targets and
  modes, the table entry size, I/O roles.

docs/contracts.md states the same tables for readers; tests/test_abi.py holds
the two to each other.  Ids and codes never change meaning once a package has
been saved with them.
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

# ---- dtypes -------------------------------------------------------------------------
DT_FP8 = 0
DT_FP16 = 1
DT_FP32 = 2
DTYPE_NAMES = ("fp8", "fp16", "fp32")  # index = code
DTYPE_BYTES = (1, 2, 4)  # index = code
DTYPE_SIZE = dict(zip(DTYPE_NAMES, DTYPE_BYTES, strict=True))  # name -> bytes

# ---- kernels ------------------------------------------------------------------------
MATMUL = 1
BATCH_MATMUL = 2
REDUCE = 3
ADD = 4
BIAS_ADD = 5
LAYERNORM = 6
GELU = 7
SOFTMAX = 8
CAST = 9
COPY = 10
TRANSPOSE = 11
RMSNORM = 12
ROPE = 13

N_ARGS = 16  # int64 args per vertex
MAX_REGIONS = 8  # rows of the vertex_regions `out` array
REGION_COLS = 7  # (addr, outer, outer_stride, rows, ld, row_bytes, is_write)

# matmul flags (MATMUL / BATCH_MATMUL arg `flags`)
FLAG_TRANS_B = 1
FLAG_ACCUMULATE = 2
# BATCH_MATMUL only (its 16 slots are full): bits 8-15 hold the int8 exponent
# the fp32 products are scaled by (2**e; fp8 operands' combined scale)
FLAG_SCALE_SHIFT = 8
FLAG_SCALE_MASK = 0xFF << FLAG_SCALE_SHIFT


def bmm_scale_flags(scale_exp: int) -> int:
    """The BATCH_MATMUL flag bits of product exponent `scale_exp` (-128..127)."""
    if not -128 <= scale_exp <= 127:
        raise ValueError(f"BATCH_MATMUL scale exponent {scale_exp} outside int8")
    return (scale_exp & 0xFF) << FLAG_SCALE_SHIFT

_MM = ("a", "lda", "b", "ldb", "c", "ldc", "M", "K", "N", "in_dtype", "out_dtype", "flags")
# kernel name -> argument names, index = slot (contracts §2)
KERNEL_ARGS: dict[str, tuple[str, ...]] = {
    "MATMUL": _MM + ("scale_exp", "bias"),
    "BATCH_MATMUL": _MM + ("batch", "batch_stride_a", "batch_stride_b", "batch_stride_c"),
    "REDUCE": ("parts", "ld_parts", "part_stride", "k", "out", "ldo", "M", "N", "out_dtype",
               "bias", "parts_fp16"),
    "ADD": ("a", "lda", "b", "ldb", "c", "ldc", "M", "N", "dtype_a", "dtype_b", "dtype_c"),
    "BIAS_ADD": ("x", "ldx", "bias", "y", "ldy", "M", "N", "dtype_x", "dtype_y"),
    "LAYERNORM": ("x", "ldx", "gamma", "beta", "y", "ldy", "M", "N", "eps"),
    "GELU": ("x", "ldx", "y", "ldy", "M", "N", "form", "b", "ldb"),
    "SOFTMAX": ("x", "ldx", "y", "ldy", "M", "N", "scale", "dtype_x", "dtype_y", "path",
                "mask", "ldm", "mask_rep", "mask_rows", "row0", "causal"),
    "CAST": ("x", "ldx", "y", "ldy", "M", "N", "dtype_x", "dtype_y", "shift"),
    "COPY": ("src", "lds", "dst", "ldd", "rows", "row_bytes"),
    "TRANSPOSE": ("src", "lds", "dst", "ldd", "M", "N", "elem_bytes"),
    "RMSNORM": ("x", "ldx", "gamma", "y", "ldy", "M", "N", "eps"),
    "ROPE": ("x", "ldx", "cos", "sin", "ldt", "y", "ldy", "M", "N", "head_dim", "dtype_t"),
}
KERNEL_IDS: dict[str, int] = {name: i + 1 for i, name in enumerate(KERNEL_ARGS)}
# argument names that carry float32 bits
FLOAT_ARGS = ("eps", "scale")


def _slots() -> Any:
    kinds = {name: namedtuple(name, names)(*range(len(names)))  # type: ignore[misc]
             for name, names in KERNEL_ARGS.items()}
    return namedtuple("Args", tuple(kinds))(**kinds)


# ARGS.<KERNEL>.<arg name> -> slot (ARGS.MATMUL.lda == 1)
ARGS = _slots()

# ---- packages -----------------------------------------------------------------------
STEP_COMPUTE = 0
STEP_EXCHANGE = 1
STEP_REPEAT_BEGIN = 2
STEP_REPEAT_END = 3
STEP_KIND_NAMES = ("COMPUTE", "EXCHANGE", "REPEAT_BEGIN", "REPEAT_END")
MAX_REPEAT_DEPTH = 32  # Repeat loops nested deeper than this are an invalid package

BUF_PARAMETER = 0
BUF_ACTIVATION = 1
BUF_SCRATCH = 2
BUF_LANDING = 3
BUF_CODE = 4
BUF_XTABLE = 5
BUF_SUPPORT = 6
BUFFER_KIND_NAMES = ("parameter", "activation", "scratch", "exchange-landing", "code",
                     "exchange-table", "support")
TENSOR_KINDS = (BUF_PARAMETER, BUF_ACTIVATION, BUF_SCRATCH, BUF_LANDING)
# buffer kinds a planner creates (the linker adds code, exchange-table, support)
TENSOR_KIND_NAMES = tuple(BUFFER_KIND_NAMES[k] for k in TENSOR_KINDS)

PATCH_VERTEX_ARG = 0
PATCH_XFER_SRC = 1
PATCH_XFER_DST = 2
PATCH_ARITH = 0
PATCH_TABLE = 1
TABLE_ENTRY_BYTES = 8  # a patch table entry is one little-endian int64 in tile memory

IO_DIMS = 3
IO_ROLES = ("input", "parameter", "output")
