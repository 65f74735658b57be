"""Result directories on disk: written atomically, npz arrays read strictly.

A package (`simulator.package`) and a hardware result (`simulator.hardware`)
are each a directory of a JSON file and an `arrays.npz`.  `atomic_dir`
writes such a directory so that nothing half-written is ever at its path;
`read_npz` reads the arrays without pickles and turns every way a file can
be unreadable into the caller's typed error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


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
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    old: Path | None = None
    try:
        yield tmp
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old",
                                        dir=target.parent))
            os.replace(target, old / "prev")
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not target.exists():
            os.replace(old / "prev", target)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def write_file_atomic(path: str | os.PathLike[str], write: Callable[[Any], None],
                      mode: str = "w") -> Path:
    """Write a file through `write(f)` into a temporary file beside `path`,
    then `os.replace` it into place: `path` holds the old file or the whole
    new one, never a part.  The parent directory must exist (FileNotFoundError
    otherwise); the file is readable by all (0o644)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.chmod(tmp, 0o644)  # mkstemp makes the file private
        os.replace(tmp, target)
    except BaseException:
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
