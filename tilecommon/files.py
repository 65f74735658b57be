"""Result directories on disk: written atomically, npz arrays read strictly.

A package (`simulator.package`) and a hardware result (`simulator.hardware`)
are each a directory of a JSON file and an `arrays.npz`.  `atomic_dir`
writes such a directory so that nothing half-written is ever at its path;
`read_npz` reads the arrays without pickles and turns every way a file can
be unreadable into the caller's typed error.  `check_output_file` and
`check_output_dir` refuse, before any work, an output path that cannot be
written (the parent missing or not a directory, a directory where a file
goes, a read-only or full file system: a probe file is created and removed),
and `writing` turns an OSError while writing one into a ConfigError naming it.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tilecommon.errors import ConfigError

_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def shielded() -> Iterator[None]:
    """Hold off Ctrl-C and SIGTERM (in the main thread) while the body runs:
    a file or directory swap and its clean-up finish whole, and the signal
    is delivered right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextmanager
def atomic_dir(target: Path, marker: str, what: str) -> Iterator[Path]:
    """A temporary directory beside `target` to write the files into.  On a
    clean exit it takes `target`'s place with `os.replace` (an existing
    directory holding the file `marker` is replaced); on any failure it is
    removed and `target` is left as it was.  Raises FileExistsError, before
    anything is written, when `target` exists and is not such a directory
    (`what` names the kind in the message)."""
    if target.exists() and not (target / marker).is_file():
        raise FileExistsError(f"{target}: exists and is not a {what} directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    with shielded():
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp",
                                    dir=target.parent))
    old: Path | None = None
    try:
        yield tmp
        with shielded():  # swap and clean up whole: no .tmp or .old left behind
            try:
                if target.exists():
                    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old",
                                                dir=target.parent))
                    os.replace(target, old / "prev")
                os.replace(tmp, target)
            finally:
                if old is not None:
                    if not target.exists():
                        os.replace(old / "prev", target)
                    shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        with shielded():
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_file_atomic(path: str | os.PathLike[str], write: Callable[[Any], None],
                      mode: str = "w") -> Path:
    """Write a file through `write(f)` into a temporary file beside `path`,
    then `os.replace` it into place: `path` holds the old file or the whole
    new one, never a part.  The parent directory must exist (FileNotFoundError
    otherwise); the file is readable by all (0o644)."""
    target = Path(path)
    with shielded():
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        with shielded():
            os.chmod(tmp, 0o644)  # mkstemp makes the file private
            os.replace(tmp, target)
    except BaseException:
        with shielded():
            Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """`write_file_atomic` of a text."""
    return write_file_atomic(path, lambda f: f.write(text))


def read_npz(path: Path, fail: Callable[[str], Exception]) -> dict[str, np.ndarray]:
    """Every array of the npz at `path`, by name (sorted).  A missing,
    truncated or corrupt file (or one holding pickles) raises `fail(reason)`."""
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as z:
            for name in sorted(z.files):
                arrays[name] = z[name]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise fail(str(e)) from None
    return arrays


def _probe(parent: Path, path: str, field: str) -> None:
    """ConfigError unless a file can be created in `parent` (a real probe: a
    read-only file system or a full disk refuses even root)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tileplan-probe.", dir=parent)
    except OSError as e:
        raise ConfigError(path, field, f"cannot be written: {e.strerror}") from None
    os.close(fd)
    os.unlink(tmp)


def check_output_file(path: str | os.PathLike[str], field: str) -> Path:
    """ConfigError (naming `path` and the flag `field`) unless `path` can be
    written as a file: not a directory, not a FIFO or device, its parent an
    existing directory where a file can be created."""
    target = Path(os.path.abspath(path))
    if target.is_dir():
        raise ConfigError(str(path), field, "is a directory")
    if target.exists() and not target.is_file():
        raise ConfigError(str(path), field, "exists and is not a regular file")
    parent = target.parent
    if not parent.exists():
        raise ConfigError(str(path), field, "directory does not exist")
    if not parent.is_dir():
        raise ConfigError(str(path), field, f"{parent} is not a directory")
    _probe(parent, str(path), field)
    return target


def check_output_dir(path: str | os.PathLike[str], field: str, marker: str, what: str) -> Path:
    """ConfigError unless `path` can become an output directory of kind
    `what`: absent (its parent an existing writable directory), empty, or
    one already (it holds the file `marker`)."""
    root = Path(path)
    if root.exists():
        if not root.is_dir():
            raise ConfigError(str(root), field, "exists and is not a directory")
        if not (root / marker).is_file() and any(root.iterdir()):
            raise ConfigError(str(root), field, f"exists and is not a {what} directory "
                              f"(no {marker}); refusing to replace it")
    parent = root.resolve().parent
    if not parent.exists():
        raise ConfigError(str(root), field, "parent directory does not exist")
    if not parent.is_dir():
        raise ConfigError(str(root), field, f"{parent} is not a directory")
    _probe(root if root.is_dir() else parent, str(root), field)
    return root


@contextmanager
def writing(path: str | os.PathLike[str], field: str) -> Iterator[None]:
    """An OSError while writing output `path` becomes a ConfigError naming
    it and the flag `field` (a disk that fills up, a path removed meanwhile)."""
    try:
        yield
    except OSError as e:
        raise ConfigError(str(path), field, f"cannot be written: {e.strerror or e}") from None
