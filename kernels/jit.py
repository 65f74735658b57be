"""The one place where `kernels` chooses its Numba options.

Every jitted function in `kernels` is decorated with `kjit`.  Options (njit is
always nopython): `cache=True` (no kernel reads a changeable global:
lookup tables are module constants frozen at compile time), `nogil` (planner
threads may evaluate cycle models concurrently), `error_model="numpy"` (division
by zero gives inf/nan like numpy instead of a Python exception; it also drops
the per-division check from hot loops).  `fastmath` stays off: every kernel must
round exactly where the numpy reference rounds.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])

# Threads of the BLAS that jitted np.dot calls (scipy's OpenBLAS, a library
# separate from numpy's).  Kernels run many small gemms, one per vertex, often
# from several simulations at once; OpenBLAS worker threads spinning on a busy
# machine made a 128x256x128 gemm 7-10x slower than one thread (measured on the
# shared 2-core machine).  An OPENBLAS_NUM_THREADS already set by the user wins.
BLAS_THREADS = 1
_CYTHON_BLAS = "scipy.linalg.cython_blas"


def _load_blas_pinned() -> None:
    """Load scipy's BLAS with BLAS_THREADS threads, unless it is loaded already."""
    if _CYTHON_BLAS in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = str(BLAS_THREADS)
    try:
        __import__(_CYTHON_BLAS)
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


_load_blas_pinned()

CACHE_TAG_PREFIX = "kernels-"


# packages whose jitted functions are compiled into jitted callers in other
# files (kernels.dispatch into the engine; simulator.access into the engine and
# the verifier's scan); planner's jitted functions call only their own file's
SHARED_JIT_PACKAGES = ("kernels", "simulator")


def source_digest(root: Path) -> str:
    """16 hex digits of sha256 over the path and bytes of every module of
    SHARED_JIT_PACKAGES under `root` (sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for pkg in SHARED_JIT_PACKAGES for p in (root / pkg).glob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _source_keyed_cache_dir() -> None:
    """Put Numba's cache under a subdirectory named by a hash of the sources
    of SHARED_JIT_PACKAGES.

    Numba keys a cached function on its own source file only, so a jitted
    caller in another file — the simulator engine, which compiles
    kernels.dispatch and simulator.access helpers into its loop — would keep
    running the old helper code after an edit of the helper's file.  With the
    hash in the directory, any such change starts a fresh cache for every
    function decorated after this import (the simulator and planner import
    kernels before decorating theirs).  Only when NUMBA_CACHE_DIR is set (make
    and CI set it); idempotent on re-import."""
    base = numba.config.CACHE_DIR  # type: ignore[attr-defined]
    if not base or Path(base).name.startswith(CACHE_TAG_PREFIX):
        return
    tagged = os.path.join(base, CACHE_TAG_PREFIX + source_digest(Path(__file__).parent.parent))
    numba.config.CACHE_DIR = tagged  # type: ignore[attr-defined]
    global COLD_CACHE
    COLD_CACHE = not os.path.isdir(tagged) or not any(os.scandir(tagged))


# True when this process starts with no Numba cache for the current sources
# (NUMBA_CACHE_DIR set, its source-keyed subdirectory missing or empty): the
# first plan/simulation then compiles everything (about a minute on 2 cores)
COLD_CACHE = False


_source_keyed_cache_dir()

JIT_OPTIONS: dict[str, Any] = {
    "cache": True,
    "nogil": True,
    "error_model": "numpy",
}


def kjit(fn: F) -> F:
    """Compile `fn` lazily with the package's jit options."""
    return numba.njit(**JIT_OPTIONS)(fn)  # type: ignore[no-any-return]


def kjit_inline(fn: F) -> F:
    """`kjit` plus inline="always": Numba inlines `fn` into its jitted callers.

    For the small leaf functions of the cycle models and region tables, which
    run once per simulated vertex: a real call passing arrays costs reference-
    count updates that dominate their few integer operations."""
    return numba.njit(inline="always", **JIT_OPTIONS)(fn)  # type: ignore[no-any-return]
