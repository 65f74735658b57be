"""Kernel id <-> name, argument names, code bytes and jitted functions (contracts §2).

`KERNELS[id]` is a frozen `KernelSpec`; `by_name("MATMUL")` finds one by name.
`spec.make_args(**named)` builds the int64[16] argument vector from the names
of contracts §2 (floats for `eps`/`scale` become float32 bits), and
`spec.cycles(args, desc)` is the full cycle count (kernels.dispatch).

`code_bytes` is the kernel image a tile stores once per kernel it uses: sizes
of the compiled codelets (worker loops plus supervisor entry), estimated from
the instruction counts of comparable Poplar library vertices, in multiples of
8 bytes (the tile alignment).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import dispatch, ids
from kernels.cast import cast_execute, cast_stream
from kernels.copy import copy_execute, copy_stream, transpose_execute, transpose_stream
from kernels.dtypes import f32_as_u32
from kernels.elementwise import (
    add_execute,
    add_stream,
    bias_add_execute,
    bias_add_stream,
    gelu_execute,
    gelu_stream,
)
from kernels.layernorm import layernorm_execute, layernorm_stream
from kernels.matmul import (
    batch_matmul_execute,
    batch_matmul_stream,
    matmul_execute,
    matmul_stream,
)
from kernels.reduce import reduce_execute, reduce_stream
from kernels.softmax import softmax_execute, softmax_stream

FLOAT_ARGS = ("eps", "scale")  # args passed as float32 bits


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: stable id, name, arg names (index = arg slot), kernel image
    bytes, jitted numeric body `execute(mem, base, args) -> status` and
    streaming model `stream(args, desc) -> cycles` (no overhead/conflict)."""

    id: int
    name: str
    arg_names: tuple[str, ...]
    code_bytes: int
    execute: Callable[..., Any]
    stream: Callable[..., Any]

    def make_args(self, **named: float | int) -> np.ndarray:
        """int64[N_ARGS] args from names; unknown names raise ValueError."""
        args = np.zeros(ids.N_ARGS, dtype=np.int64)
        for key in sorted(named):
            if key not in self.arg_names:
                raise ValueError(f"kernel {self.name}: unknown arg {key!r}; "
                                 f"expected one of {self.arg_names}")
            value = named[key]
            if key in FLOAT_ARGS and isinstance(value, float):
                args[self.arg_names.index(key)] = f32_as_u32(value)
            else:
                args[self.arg_names.index(key)] = int(value)
        return args

    def cycles(self, args: Sequence[int] | np.ndarray, desc: np.ndarray) -> int:
        """Total cycles of one vertex (overhead + stream, conflict included)."""
        a = np.zeros(ids.N_ARGS, dtype=np.int64)
        a[: len(args)] = np.asarray(args, dtype=np.int64)
        return int(dispatch.vertex_cycles(self.id, a, np.ascontiguousarray(desc, np.int64)))


_MM = ("a", "lda", "b", "ldb", "c", "ldc", "M", "K", "N", "in_dtype", "out_dtype", "flags")

KERNELS: Mapping[int, KernelSpec] = {
    spec.id: spec
    for spec in (
        KernelSpec(ids.MATMUL, "MATMUL", _MM + ("scale_exp", "bias"), 2048,
                   matmul_execute, matmul_stream),
        KernelSpec(ids.BATCH_MATMUL, "BATCH_MATMUL",
                   _MM + ("batch", "batch_stride_a", "batch_stride_b", "batch_stride_c"),
                   2560, batch_matmul_execute, batch_matmul_stream),
        KernelSpec(ids.REDUCE, "REDUCE",
                   ("parts", "ld_parts", "part_stride", "k", "out", "ldo", "M", "N",
                    "out_dtype", "bias"), 512, reduce_execute, reduce_stream),
        KernelSpec(ids.ADD, "ADD",
                   ("a", "lda", "b", "ldb", "c", "ldc", "M", "N", "dtype_a", "dtype_b",
                    "dtype_c"), 384, add_execute, add_stream),
        KernelSpec(ids.BIAS_ADD, "BIAS_ADD",
                   ("x", "ldx", "bias", "y", "ldy", "M", "N", "dtype_x", "dtype_y"), 384,
                   bias_add_execute, bias_add_stream),
        KernelSpec(ids.LAYERNORM, "LAYERNORM",
                   ("x", "ldx", "gamma", "beta", "y", "ldy", "M", "N", "eps"), 1024,
                   layernorm_execute, layernorm_stream),
        KernelSpec(ids.GELU, "GELU", ("x", "ldx", "y", "ldy", "M", "N"), 768,
                   gelu_execute, gelu_stream),
        KernelSpec(ids.SOFTMAX, "SOFTMAX",
                   ("x", "ldx", "y", "ldy", "M", "N", "scale", "dtype_x", "dtype_y"), 1024,
                   softmax_execute, softmax_stream),
        KernelSpec(ids.CAST, "CAST",
                   ("x", "ldx", "y", "ldy", "M", "N", "dtype_x", "dtype_y", "shift"), 512,
                   cast_execute, cast_stream),
        KernelSpec(ids.COPY, "COPY", ("src", "lds", "dst", "ldd", "rows", "row_bytes"), 256,
                   copy_execute, copy_stream),
        KernelSpec(ids.TRANSPOSE, "TRANSPOSE",
                   ("src", "lds", "dst", "ldd", "M", "N", "elem_bytes"), 512,
                   transpose_execute, transpose_stream),
    )
}

_BY_NAME = {spec.name: spec for spec in KERNELS.values()}


def by_name(name: str) -> KernelSpec:
    """The KernelSpec called `name`; raises ValueError naming the known names."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(_BY_NAME)}")
    return _BY_NAME[name]
