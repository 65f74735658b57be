"""The one place where tileplan chooses its Numba options: `kjit` and
`kjit_inline` decorate every jitted function of kernels, simulator and planner.

Options (njit is always nopython): `cache=True` (no jitted function reads a
changeable global: lookup tables and ABI constants are module constants frozen
at compile time), `nogil` (planner threads may evaluate cycle models and
simulate concurrently), `error_model="numpy"` (division by zero gives inf/nan
like numpy instead of a Python exception; it also drops the per-division check
from hot loops).  `fastmath` stays off: every kernel must round exactly where
the numpy reference rounds.  Bounds checking stays off: the engine guards every
index itself and records a fault instead.  Where the cache lives and how many
threads BLAS runs are set by `tilecommon.runtime.configure`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import numba

# Numba's thread pool for `kjit_parallel`: the workqueue layer, unless the
# user chose one (NUMBA_THREADING_LAYER).  GNU OpenMP, the usual default,
# kills a process that forks after using it, and the planner forks its
# speculative build workers after simulating the baseline; workqueue is
# fork-safe but may not be entered by two threads at once, so the engine
# enters it only from the main thread (simulator.engines.numba).  Set here,
# before anything can launch a parallel loop.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"  # type: ignore[attr-defined]

F = TypeVar("F", bound=Callable[..., Any])

JIT_OPTIONS: dict[str, Any] = {
    "cache": True,
    "nogil": True,
    "error_model": "numpy",
}


def kjit(fn: F) -> F:
    """Compile `fn` lazily with the project's jit options."""
    return numba.njit(**JIT_OPTIONS)(fn)  # type: ignore[no-any-return]


def kjit_parallel(fn: F) -> F:
    """`kjit` with parallel=True: `numba.prange` loops run on the machine's
    cores (about 1.7x on two).  For loops over many independent items only:
    waking the threads costs microseconds per call."""
    return numba.njit(parallel=True, **JIT_OPTIONS)(fn)  # type: ignore[no-any-return]


# parallel=True with only `prange` enabled: a function that calls a
# `kjit_parallel` one must itself be compiled by the parallel pipeline, or
# Numba links the callee's thread-pool launch as a dynamic global and
# refuses to cache the caller.  With only prange on, nothing in the caller
# is parallelised behind its back.
PRANGE_ONLY = {"prange": True, "numpy": False, "setitem": False, "reduction": False,
               "comprehension": False, "stencil": False, "fusion": False, "inplace_binop": False}


def kjit_host(fn: F) -> F:
    """`kjit` for a function that calls `kjit_parallel` functions (see
    PRANGE_ONLY): it stays cacheable.  It should hold a prange loop of its
    own, or Numba warns that parallel=True found nothing to parallelise.  (Numba pops
    the options dict, so each call gets a copy.)"""
    return numba.njit(parallel=dict(PRANGE_ONLY), **JIT_OPTIONS)(fn)  # type: ignore[call-overload,no-any-return]


def kjit_inline(fn: F) -> F:
    """`kjit` plus inline="always": Numba inlines `fn` into its jitted callers.

    For the small leaf functions of the cycle models and region tables, which
    run once per simulated vertex: a real call passing arrays costs reference-
    count updates that dominate their few integer operations."""
    return numba.njit(inline="always", **JIT_OPTIONS)(fn)  # type: ignore[no-any-return]
