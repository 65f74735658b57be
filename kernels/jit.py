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
threads BLAS runs are set by `kernels.runtime.configure`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])

JIT_OPTIONS: dict[str, Any] = {
    "cache": True,
    "nogil": True,
    "error_model": "numpy",
}


def kjit(fn: F) -> F:
    """Compile `fn` lazily with the project's jit options."""
    return numba.njit(**JIT_OPTIONS)(fn)  # type: ignore[no-any-return]


def kjit_inline(fn: F) -> F:
    """`kjit` plus inline="always": Numba inlines `fn` into its jitted callers.

    For the small leaf functions of the cycle models and region tables, which
    run once per simulated vertex: a real call passing arrays costs reference-
    count updates that dominate their few integer operations."""
    return numba.njit(inline="always", **JIT_OPTIONS)(fn)  # type: ignore[no-any-return]
