"""Kernel id <-> name, argument names, code bytes and jitted functions (contracts §2).

`KERNELS[id]` is a frozen `KernelSpec`; `by_name("MATMUL")` finds one by name.
`spec.make_args(**named)` builds the int64[16] argument vector from the names
of contracts §2 (floats for `eps`/`scale` become float32 bits), and
`spec.cycles(args, desc)` is the full cycle count (kernels.dispatch).  The
bytes of each kernel's executable image are a device constant
(`[costs.kernel_image_bytes]`, keyed by kernel name).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels import abi, dispatch
from kernels.cast import cast_execute
from kernels.copy import copy_execute, transpose_execute
from kernels.dtypes import f32_as_u32
from kernels.elementwise import add_execute, bias_add_execute, gelu_execute
from kernels.layernorm import layernorm_execute, rmsnorm_execute
from kernels.matmul import batch_matmul_execute, matmul_execute
from kernels.reduce import reduce_execute
from kernels.rope import rope_execute
from kernels.softmax import softmax_execute

FLOAT_ARGS = abi.FLOAT_ARGS  # args passed as float32 bits


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: stable id, name, arg names (index = arg slot) and the jitted
    numeric body `execute(mem, base, args) -> status`; its cycle model is
    kernels.dispatch.vertex_cost."""

    id: int
    name: str
    arg_names: tuple[str, ...]
    execute: Callable[..., Any]

    def make_args(self, **named: float | int) -> np.ndarray:
        """int64[N_ARGS] args from names; unknown names raise ValueError."""
        args = np.zeros(abi.N_ARGS, dtype=np.int64)
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
        a = np.zeros(abi.N_ARGS, dtype=np.int64)
        a[: len(args)] = np.asarray(args, dtype=np.int64)
        return int(dispatch.vertex_cycles(self.id, a, np.ascontiguousarray(desc, np.int64)))


_EXECUTE = {
    abi.MATMUL: matmul_execute, abi.BATCH_MATMUL: batch_matmul_execute,
    abi.REDUCE: reduce_execute, abi.ADD: add_execute, abi.BIAS_ADD: bias_add_execute,
    abi.LAYERNORM: layernorm_execute, abi.GELU: gelu_execute, abi.SOFTMAX: softmax_execute,
    abi.CAST: cast_execute, abi.COPY: copy_execute, abi.TRANSPOSE: transpose_execute,
    abi.RMSNORM: rmsnorm_execute, abi.ROPE: rope_execute,
}

KERNELS: Mapping[int, KernelSpec] = {
    kid: KernelSpec(kid, name, abi.KERNEL_ARGS[name], _EXECUTE[kid])
    for name, kid in abi.KERNEL_IDS.items()
}

_BY_NAME = {spec.name: spec for spec in KERNELS.values()}


def by_name(name: str) -> KernelSpec:
    """The KernelSpec called `name`; raises ValueError naming the known names."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(_BY_NAME)}")
    return _BY_NAME[name]
