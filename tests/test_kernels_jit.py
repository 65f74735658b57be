"""tilecommon.runtime: the Numba cache directory is keyed by the kernels' sources,
and scipy's BLAS is pinned to one thread, once configure() runs (checked in a
fresh interpreter); importing the jitted modules configures nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PROBE = """
import ctypes, glob, os, sys
import kernels.dispatch  # importing jitted modules configures nothing
assert "scipy.linalg.cython_blas" not in sys.modules
from tilecommon.runtime import configure
import numba, scipy
first = configure().cache_dir
configure()  # idempotent
print(first)
print(numba.config.CACHE_DIR)
print(os.environ.get("OPENBLAS_NUM_THREADS"))
libs = glob.glob(os.path.join(os.path.dirname(scipy.__file__) + ".libs", "*openblas*.so*"))
threads = [ctypes.CDLL(p).scipy_openblas_get_num_threads() for p in libs]
print(",".join(str(t) for t in threads) or "no-scipy-openblas")
"""


def test_cache_dir_keyed_by_kernel_sources(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["NUMBA_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert re.fullmatch(re.escape(str(tmp_path)) + r"/kernels-[0-9a-f]{16}", out[0])
    assert out[1] == out[0]  # numba sees it; a second configure does not nest
    assert out[2] == "None"  # the pin is temporary: the environment is restored
    if out[3] != "no-scipy-openblas":  # a scipy built on another BLAS has nothing to pin
        assert set(out[3].split(",")) == {"1"}


def test_source_digest_covers_every_shared_jit_package(tmp_path: Path) -> None:
    """A jitted caller in one file compiles helpers of another (the engine and
    the verifier's scan compile simulator.access and kernels.dispatch), and
    numba's cache only notices edits of the caller's file: any edit in
    tilecommon/ (the jit options), kernels/ or simulator/ must give another
    cache directory; planner/ not."""
    from tilecommon.runtime import SHARED_JIT_PACKAGES, source_digest

    assert SHARED_JIT_PACKAGES == ("tilecommon", "kernels", "simulator")
    for pkg in ("tilecommon", "kernels", "simulator", "planner"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "jit.py").write_text("x = 1\n")
    first = source_digest(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{16}", first) and source_digest(tmp_path) == first
    (tmp_path / "planner" / "jit.py").write_text("x = 2\n")
    assert source_digest(tmp_path) == first
    seen = {first}
    for pkg in SHARED_JIT_PACKAGES:
        (tmp_path / pkg / "jit.py").write_text(f"x = {pkg!r}\n")
        seen.add(source_digest(tmp_path))
    assert len(seen) == 4
    (tmp_path / "simulator" / "jit.py").rename(tmp_path / "simulator" / "access.py")
    assert source_digest(tmp_path) not in seen  # paths count, not only bytes
    seen.add(source_digest(tmp_path))
    (tmp_path / "simulator" / "engines").mkdir()
    (tmp_path / "simulator" / "engines" / "numba.py").write_text("x = 3\n")
    assert source_digest(tmp_path) not in seen  # subpackages count


def test_the_public_api_caches_under_the_user_cache_by_default(tmp_path: Path) -> None:
    """`import simulator` without NUMBA_CACHE_DIR: the keyed cache under
    $XDG_CACHE_HOME/tileplan/numba, and one warning that the first run compiles."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    probe = "import simulator, numba; print(numba.config.CACHE_DIR)"
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, check=True)
    root = tmp_path / "tileplan" / "numba"
    assert re.fullmatch(re.escape(str(root)) + r"/kernels-[0-9a-f]{16}", run.stdout.strip())
    assert run.stderr.count("first run of this code") == 1
    cached = Path(run.stdout.strip())
    cached.mkdir(parents=True, exist_ok=True)
    (cached / "x.nbi").write_text("")  # a warm cache: nothing said
    again = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, check=True)
    assert "first run" not in again.stderr
