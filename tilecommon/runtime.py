"""The process's numeric runtime: BLAS threads, Numba's cache directory and
how large arrays get their memory.

`configure()` is the one place tileplan sets them; the CLI, the test suite
and the experiments call it first, before any jitted module is imported
(Numba fixes a function's cache location when it is decorated); the public
APIs call it on first use too (`import simulator`, the first name taken from
`planner`), so a library user gets the same cache and BLAS without asking, and
one warning on the `tileplan` logger before a first-run compile.  Importing a
submodule directly configures nothing (the one import-time setting is Numba's
threading layer, in tilecommon.jit).

- BLAS: the jitted kernels' `np.dot` calls scipy's OpenBLAS (a library
  separate from numpy's).  Kernels run many small gemms, one per vertex, often
  from several simulations at once; OpenBLAS worker threads spinning on a busy
  machine made a 128x256x128 gemm 7-10x slower than one thread on the shared
  2-core machine.  `configure` loads scipy's BLAS with `blas_threads` threads
  unless it is loaded already or OPENBLAS_NUM_THREADS is set (the user wins).
- Cache: under NUMBA_CACHE_DIR when it is set (make and CI set it), else under
  `default_cache_root()` (~/.cache/tileplan/numba), Numba's cache goes to a
  subdirectory named by a hash of the sources of SHARED_JIT_PACKAGES.
  Numba keys a cached function on its own source file only, so a jitted caller
  in another file (the engine compiles kernels.dispatch and simulator.access
  helpers into its loop) would keep running old helper code after an edit of
  the helper's file; with the hash in the directory any such change starts a
  fresh cache.  `Runtime.cold` says that the directory was empty: the first
  plan or simulation then compiles everything (COMPILE_NOTE: about 5 minutes
  on a 2-core machine, measured from a fresh clone).
- Memory: a build allocates and frees arrays of tens of MB many times (a
  27-layer plan holds about 3.5 M transfers; every stage makes per-transfer
  columns).  NumPy asks the kernel for transparent huge pages on every array
  over 4 MB, and glibc maps each allocation over its threshold fresh and
  unmaps it on free, so every such array was zeroed anew by the kernel, 2 MB
  at a time: a quarter of a 27-layer plan's time was the kernel clearing
  pages (perf), 11-13 s of system time in a 43 s plan.  `configure` turns
  NumPy's huge-page advice off and raises glibc's mmap threshold to its
  maximum (32 MB) with trimming off, so freed blocks are reused: the same
  plan took 33.8 s with 2.2 s of system time, peak RSS unchanged (2.49 GB
  against 2.47 GB; `/usr/bin/time -v tileplan plan siglip-so400m-map`).  It
  also keeps one malloc arena for all threads (unless MALLOC_ARENA_MAX is
  set): the optimizer re-verifies an accepted package on a thread of its
  own while the next build runs, and in an arena of its own that thread's
  arrays took fresh memory instead of what the build thread had freed
  (batch-2 plan: peak RSS 2.61-2.67 GB, one arena 2.50-2.54 GB; a numerics
  run of 2 layers took the same time either way).  Skipped where the user
  set NUMPY_MADVISE_HUGEPAGE or MALLOC_MMAP_THRESHOLD_, or the C library is
  not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

BLAS_THREADS = 1
CACHE_TAG_PREFIX = "kernels-"
# packages whose jitted functions are compiled into jitted callers in other
# files (kernels.dispatch into the engine; simulator.access into the engine and
# the verifier's scan); planner's jitted functions call only their own file's
SHARED_JIT_PACKAGES = ("tilecommon", "kernels", "simulator")
_CYTHON_BLAS = "scipy.linalg.cython_blas"
# glibc mallopt parameters (malloc.h) and the largest mmap threshold it takes
# on a 64-bit system (4 x 1024 x 1024 x sizeof(long))
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 32 * 1024 * 1024


@dataclass
class Runtime:
    """What `configure` set: the Numba cache directory (None: Numba's
    default) and whether it held no compiled code yet (`cold`)."""

    cache_dir: str | None = None
    cold: bool = False
    configured: bool = False
    malloc_tuned: bool = False  # glibc took the memory settings


RUNTIME = Runtime()  # the process's runtime, filled by configure()


def source_digest(root: Path) -> str:
    """16 hex digits of sha256 over the path and bytes of every module of
    SHARED_JIT_PACKAGES under `root` (sorted, subpackages included)."""
    digest = hashlib.sha256()
    for path in sorted(p for pkg in SHARED_JIT_PACKAGES for p in (root / pkg).rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _pin_blas(threads: int) -> None:
    if _CYTHON_BLAS in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    try:
        __import__(_CYTHON_BLAS)
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def _tune_memory() -> bool:
    """NumPy's huge-page advice off and glibc's mmap threshold at its maximum,
    trimming off (module docstring); True when glibc took both."""
    if "NUMPY_MADVISE_HUGEPAGE" not in os.environ:
        import numpy as np

        core = getattr(np, "_core", None) or np.core  # numpy < 2: np.core
        core.multiarray._set_madvise_hugepage(False)
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, 1)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def default_cache_root() -> str | None:
    """Where the cache goes when nobody chose: `$XDG_CACHE_HOME/tileplan/numba`
    (~/.cache/tileplan/numba), or None when that cannot be created (Numba then
    caches beside the sources)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = os.path.join(home, "tileplan", "numba")
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        return None
    return root if os.access(root, os.W_OK) else None


def _cache_dir() -> tuple[str | None, bool]:
    base = os.environ.get("NUMBA_CACHE_DIR")
    if "numba" in sys.modules:
        import numba

        base = numba.config.CACHE_DIR or base  # type: ignore[attr-defined]
    if not base:
        base = default_cache_root()
    if not base:
        return None, False
    if Path(base).name.startswith(CACHE_TAG_PREFIX):  # configured already
        return base, RUNTIME.cold
    tagged = os.path.join(base, CACHE_TAG_PREFIX + source_digest(Path(__file__).parent.parent))
    os.environ["NUMBA_CACHE_DIR"] = tagged
    if "numba" in sys.modules:
        import numba

        numba.config.CACHE_DIR = tagged  # type: ignore[attr-defined]
    cold = not os.path.isdir(tagged) or not any(os.scandir(tagged))
    return tagged, cold


def pin_blas_env(threads: int = BLAS_THREADS) -> None:
    """Ask every BLAS that loads later (numpy's own included) for `threads`
    threads, unless the user set them: for benchmarks that time numpy beside
    the kernels.  Call it before numpy is imported; it does nothing to a BLAS
    already loaded."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


COMPILE_NOTE = ("first run of this code: Numba compiles the kernel, simulator and planner "
                "loops into {dir} (about 5 minutes on a 2-core machine; later runs load them)")


def configure(blas_threads: int = BLAS_THREADS, announce: bool = False) -> Runtime:
    """Pin scipy's BLAS, key Numba's cache directory by the sources and set
    how large arrays get memory (module docstring).  Idempotent; returns the
    process's `Runtime`.  With `announce`, a cold cache is said once on the
    `tileplan` logger (a warning: Python prints it to stderr unless the
    application configured logging)."""
    if not RUNTIME.configured:
        _pin_blas(blas_threads)
        RUNTIME.malloc_tuned = _tune_memory()
        RUNTIME.cache_dir, RUNTIME.cold = _cache_dir()
        RUNTIME.configured = True
        if announce and RUNTIME.cold:
            import logging

            logging.getLogger("tileplan").warning(COMPILE_NOTE.format(dir=RUNTIME.cache_dir))
    return RUNTIME
