"""The process's numeric runtime: BLAS threads and Numba's cache directory.

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
"""

from __future__ import annotations

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


@dataclass
class Runtime:
    """What `configure` set: the Numba cache directory (None: Numba's
    default) and whether it held no compiled code yet (`cold`)."""

    cache_dir: str | None = None
    cold: bool = False
    configured: bool = False


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
    """Pin scipy's BLAS and key Numba's cache directory by the sources
    (module docstring).  Idempotent; returns the process's `Runtime`.  With
    `announce`, a cold cache is said once on the `tileplan` logger (a warning:
    Python prints it to stderr unless the application configured logging)."""
    if not RUNTIME.configured:
        _pin_blas(blas_threads)
        RUNTIME.cache_dir, RUNTIME.cold = _cache_dir()
        RUNTIME.configured = True
        if announce and RUNTIME.cold:
            import logging

            logging.getLogger("tileplan").warning(COMPILE_NOTE.format(dir=RUNTIME.cache_dir))
    return RUNTIME
