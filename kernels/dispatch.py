"""The jitted entry points the simulator engine calls for every vertex (contracts §2).

All three take the kernel id first and branch to the family module:

- `vertex_cycles(kid, args, desc) -> int64`: the kernel's call cost + its
  work cycles, the work slowed to desc[D_CONFLICT_PERCENT] percent when two
  operand regions share a memory element (kernels.cost); -1 for an unknown
  kernel id.
- `vertex_check(kid, args) -> int64`: the kernel's argument check (a
  kernels.status code); the engine and the verifier call it on every vertex.
- `vertex_execute(kid, mem, base, args) -> int64`: runs the numeric body on the
  tile image `mem` (uint8, index 0 = address `base`); returns a kernels.status
  code (0 ok).  The caller has checked that every region lies inside `mem`.
- `vertex_regions(kid, args, out) -> int64`: fills out[:n] (int64
  [MAX_REGIONS, REGION_COLS]) with the regions the vertex reads and writes;
  -1 for an unknown kernel id.
- `vertex_call_work(kid, args, desc) -> (call, work)`: the two parts of the
  cycle count before the conflict penalty.
- `vertex_cost(kid, args, desc, out) -> (cycles, n)`: both of the above in one
  call on the caller's scratch `out` (no allocation: the engine's hot path).

Expected argument types, one compiled signature each: kid int64, args int64[::1]
(a row of the package's v_args), desc int64[::1] (TileDesc.as_array()), mem
uint8[::1], base int64, out int64[:, ::1].
"""

from __future__ import annotations

import numpy as np

from kernels import abi
from kernels.cast import cast_check, cast_cost, cast_execute, cast_regions
from kernels.copy import (
    copy_check,
    copy_cost,
    copy_execute,
    copy_regions,
    transpose_check,
    transpose_cost,
    transpose_execute,
    transpose_regions,
)
from kernels.cost import conflicted, has_conflict
from kernels.elementwise import (
    add_check,
    add_cost,
    add_execute,
    add_regions,
    bias_add_check,
    bias_add_cost,
    bias_add_execute,
    bias_add_regions,
    gelu_check,
    gelu_cost,
    gelu_execute,
    gelu_regions,
)
from kernels.layernorm import (
    layernorm_check,
    layernorm_cost,
    layernorm_execute,
    layernorm_regions,
    rmsnorm_check,
    rmsnorm_cost,
    rmsnorm_execute,
    rmsnorm_regions,
)
from kernels.matmul import (
    batch_matmul_check,
    batch_matmul_cost,
    batch_matmul_execute,
    batch_matmul_regions,
    matmul_check,
    matmul_cost,
    matmul_execute,
    matmul_regions,
)
from kernels.reduce import reduce_check, reduce_cost, reduce_execute, reduce_regions
from kernels.rope import rope_check, rope_cost, rope_execute, rope_regions
from kernels.softmax import softmax_check, softmax_cost, softmax_execute, softmax_regions
from kernels.status import BAD_KERNEL
from tilecommon.jit import kjit, kjit_inline


@kjit_inline
def vertex_call_work(kid, args, desc):  # type: ignore[no-untyped-def]
    """(call, work) cycles before any conflict penalty; (-1, -1) if unknown."""
    if kid == abi.MATMUL:
        return matmul_cost(args, desc)
    if kid == abi.BATCH_MATMUL:
        return batch_matmul_cost(args, desc)
    if kid == abi.REDUCE:
        return reduce_cost(args, desc)
    if kid == abi.ADD:
        return add_cost(args, desc)
    if kid == abi.BIAS_ADD:
        return bias_add_cost(args, desc)
    if kid == abi.LAYERNORM:
        return layernorm_cost(args, desc)
    if kid == abi.GELU:
        return gelu_cost(args, desc)
    if kid == abi.SOFTMAX:
        return softmax_cost(args, desc)
    if kid == abi.CAST:
        return cast_cost(args, desc)
    if kid == abi.COPY:
        return copy_cost(args, desc)
    if kid == abi.TRANSPOSE:
        return transpose_cost(args, desc)
    if kid == abi.RMSNORM:
        return rmsnorm_cost(args, desc)
    if kid == abi.ROPE:
        return rope_cost(args, desc)
    return np.int64(-1), np.int64(-1)


@kjit_inline
def vertex_regions(kid, args, out):  # type: ignore[no-untyped-def]
    """Fill out[:n] with the vertex's regions; returns n, or -1 for an unknown id."""
    if kid == abi.MATMUL:
        return matmul_regions(args, out)
    if kid == abi.BATCH_MATMUL:
        return batch_matmul_regions(args, out)
    if kid == abi.REDUCE:
        return reduce_regions(args, out)
    if kid == abi.ADD:
        return add_regions(args, out)
    if kid == abi.BIAS_ADD:
        return bias_add_regions(args, out)
    if kid == abi.LAYERNORM:
        return layernorm_regions(args, out)
    if kid == abi.GELU:
        return gelu_regions(args, out)
    if kid == abi.SOFTMAX:
        return softmax_regions(args, out)
    if kid == abi.CAST:
        return cast_regions(args, out)
    if kid == abi.COPY:
        return copy_regions(args, out)
    if kid == abi.TRANSPOSE:
        return transpose_regions(args, out)
    if kid == abi.RMSNORM:
        return rmsnorm_regions(args, out)
    if kid == abi.ROPE:
        return rope_regions(args, out)
    return -1


@kjit
def vertex_conflict(kid, args, desc):  # type: ignore[no-untyped-def]
    """True if two operand streams of the vertex share a memory element."""
    regions = np.empty((abi.MAX_REGIONS, abi.REGION_COLS), dtype=np.int64)
    n = vertex_regions(kid, args, regions)
    if n < 0:
        return False
    return has_conflict(regions, n, desc)


@kjit
def vertex_cost(kid, args, desc, out):  # type: ignore[no-untyped-def]
    """(cycles, n): vertex_cycles and vertex_regions in one call, the regions left
    in out[:n] (caller's scratch, so nothing is allocated); (-1, -1) if unknown."""
    call, work = vertex_call_work(kid, args, desc)
    n = vertex_regions(kid, args, out)
    if work < 0 or n < 0:
        return np.int64(-1), np.int64(-1)
    if has_conflict(out, n, desc):
        work = conflicted(work, desc)
    return np.int64(call + work), np.int64(n)


@kjit
def vertex_cycles(kid, args, desc):  # type: ignore[no-untyped-def]
    """Cycles of one vertex on one tile, conflict penalty included; -1 if unknown."""
    regions = np.empty((abi.MAX_REGIONS, abi.REGION_COLS), dtype=np.int64)
    cycles, _ = vertex_cost(kid, args, desc, regions)
    return cycles


@kjit
def vertex_check(kid, args):  # type: ignore[no-untyped-def]
    """The kernel's own argument check (kernels.status code; BAD_KERNEL for an
    unknown id): what the engine and the verifier apply to every vertex,
    patched arguments included, before its regions or cycles mean anything."""
    if kid == abi.MATMUL:
        return matmul_check(args)
    if kid == abi.BATCH_MATMUL:
        return batch_matmul_check(args)
    if kid == abi.REDUCE:
        return reduce_check(args)
    if kid == abi.ADD:
        return add_check(args)
    if kid == abi.BIAS_ADD:
        return bias_add_check(args)
    if kid == abi.LAYERNORM:
        return layernorm_check(args)
    if kid == abi.GELU:
        return gelu_check(args)
    if kid == abi.SOFTMAX:
        return softmax_check(args)
    if kid == abi.CAST:
        return cast_check(args)
    if kid == abi.COPY:
        return copy_check(args)
    if kid == abi.TRANSPOSE:
        return transpose_check(args)
    if kid == abi.RMSNORM:
        return rmsnorm_check(args)
    if kid == abi.ROPE:
        return rope_check(args)
    return BAD_KERNEL


@kjit
def vertex_execute(kid, mem, base, args):  # type: ignore[no-untyped-def]
    """Run the vertex's numeric body on `mem`; returns a kernels.status code."""
    if kid == abi.MATMUL:
        return matmul_execute(mem, base, args)
    if kid == abi.BATCH_MATMUL:
        return batch_matmul_execute(mem, base, args)
    if kid == abi.REDUCE:
        return reduce_execute(mem, base, args)
    if kid == abi.ADD:
        return add_execute(mem, base, args)
    if kid == abi.BIAS_ADD:
        return bias_add_execute(mem, base, args)
    if kid == abi.LAYERNORM:
        return layernorm_execute(mem, base, args)
    if kid == abi.GELU:
        return gelu_execute(mem, base, args)
    if kid == abi.SOFTMAX:
        return softmax_execute(mem, base, args)
    if kid == abi.CAST:
        return cast_execute(mem, base, args)
    if kid == abi.COPY:
        return copy_execute(mem, base, args)
    if kid == abi.TRANSPOSE:
        return transpose_execute(mem, base, args)
    if kid == abi.RMSNORM:
        return rmsnorm_execute(mem, base, args)
    if kid == abi.ROPE:
        return rope_execute(mem, base, args)
    return BAD_KERNEL
