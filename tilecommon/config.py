"""Reading and validating the flat TOML tables of devices and models.

Both the device presets (simulator/devices) and the model zoo (planner/ir/zoo)
are flat tables of a non-empty `name` plus numeric fields with a type and a
range.  Every problem raises `ConfigError` naming the file and the field.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from tilecommon.errors import ConfigError

# field -> (type, minimum, maximum); int fields must be ints, float fields accept ints.
Limits = dict[str, tuple[type, float, float]]
MAX_TOML_BYTES = 1 << 20  # a device or model TOML is a few KiB


def is_path(name_or_path: str | Path) -> bool:
    """A name is a preset (or zoo) name unless it is a Path, contains a path
    separator or ends in `.toml`: a file called `vit-tiny` in the current
    directory never shadows the zoo model."""
    text = str(name_or_path)
    return (isinstance(name_or_path, Path) or text.endswith(".toml") or "/" in text
            or os.sep in text)


def check_regular_file(path: Path, what: str, max_bytes: int) -> None:
    """ConfigError unless `path` is a regular file of at most `max_bytes`
    (a FIFO, a device or a directory is refused before anything reads it)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(str(path), what, "file not found") from None
    except OSError as e:
        raise ConfigError(str(path), what, f"cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(str(path), what, "not a regular file")
    if st.st_size > max_bytes:
        raise ConfigError(str(path), what, f"larger than {max_bytes} bytes", st.st_size)


def read_document(path: Path, what: str, fmt: str = "toml",
                  max_bytes: int = MAX_TOML_BYTES) -> Any:
    """The parsed text of file `path`, `fmt` "toml" or "json"; ConfigError
    naming the file: `what` when it is missing or not a regular file of at
    most `max_bytes`, `fmt` when it is not text or does not parse."""
    import json

    check_regular_file(path, what, max_bytes)
    try:
        text = path.read_text()
        return tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(str(path), what, "file not found") from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), fmt, f"not a text file: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), fmt, f"not valid TOML: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), fmt, f"not valid JSON: {e}") from None


def read_toml(
    name_or_path: str | Path, preset_dir: Path, what: str, preset: str = "preset",
    shelf: str = "presets",
) -> tuple[dict, str]:
    """The table of a preset name (`<preset_dir>/<name>.toml`) or a TOML path.

    Returns (table, source) where source names the file for later errors.
    `what` ("device", "model") names the field of a missing preset or file;
    `preset`/`shelf` word the message ("no such zoo model or file; zoo: [...]").
    """
    text = str(name_or_path)
    path = Path(text)
    if not is_path(name_or_path):
        path = preset_dir / f"{text}.toml"
        if not path.exists():
            shipped = sorted(p.stem for p in preset_dir.glob("*.toml"))
            raise ConfigError(text, what, f"no such {preset}; {shelf}: {shipped} (a file "
                              "path needs a '/' or the .toml suffix)")
    return read_document(path, what), str(path)


def check_fields(
    data: Any, source: str, limits: Limits, defaults: dict[str, Any] | None = None,
    prefix: str = "", named: bool = True,
) -> dict[str, Any]:
    """Validate `name` (when `named`) + the numeric `limits` fields of a flat table.

    Unknown, missing (after `defaults`), mistyped and out-of-range fields
    raise ConfigError(source, prefix + field, ...).  Returns the values
    converted to their declared types, `name` first.
    """
    if not isinstance(data, dict):
        raise ConfigError(source, prefix.rstrip(".") or "table", "must be a table",
                          type(data).__name__)
    known = {*(("name",) if named else ()), *limits}
    for key in sorted(data):
        if key not in known:
            raise ConfigError(source, prefix + key,
                              f"unknown field; expected one of {sorted(known)}")
    merged = {**(defaults or {}), **data}
    for key in [*(("name",) if named else ()), *limits]:
        if key not in merged:
            raise ConfigError(source, prefix + key, "missing")
    values: dict[str, Any] = {}
    if named:
        name = merged["name"]
        if not isinstance(name, str) or not name:
            raise ConfigError(source, prefix + "name", "must be a non-empty string", name)
        values["name"] = name
    for key, (kind, lo, hi) in limits.items():
        v = merged[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(source, prefix + key, f"must be {kind.__name__}", v)
        if kind is int and not isinstance(v, int):
            raise ConfigError(source, prefix + key, "must be an integer", v)
        if not lo <= v <= hi:
            raise ConfigError(source, prefix + key, f"out of range [{kind(lo)}, {kind(hi)}]", v)
        values[key] = kind(v)
    return values
