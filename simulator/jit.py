"""The one place where `simulator` chooses its Numba options.

`sjit` is used by every jitted function in the simulator (the engine loop and
the region/race checks).  Options: `cache=True` (no jitted function reads a
changeable global; constants are module-level ints frozen at compile time),
`nogil` (planner threads may simulate concurrently), `error_model="numpy"`
(no per-division exception checks in the hot loop).  Bounds checking stays
off: the engine guards every index itself and records a fault instead.
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


def sjit(fn: F) -> F:
    """Compile `fn` lazily with the simulator's jit options."""
    return numba.njit(**JIT_OPTIONS)(fn)  # type: ignore[no-any-return]
