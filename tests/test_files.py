"""tilecommon.files: atomic result directories and strict npz reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tilecommon.files import atomic_dir, read_npz


def test_atomic_dir_replaces_only_on_success(tmp_path: Path) -> None:
    target = tmp_path / "run"
    with atomic_dir(target, "m.json", "run") as d:
        (d / "m.json").write_text("1")
    assert (target / "m.json").read_text() == "1"
    with pytest.raises(RuntimeError), atomic_dir(target, "m.json", "run") as d:
        (d / "m.json").write_text("2")
        raise RuntimeError("half-written")
    assert (target / "m.json").read_text() == "1"  # untouched
    with atomic_dir(target, "m.json", "run") as d:
        (d / "m.json").write_text("3")
    assert (target / "m.json").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporaries left
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FileExistsError, match="other: exists and is not a run directory"):
        with atomic_dir(other, "m.json", "run"):
            pass


def test_read_npz_raises_the_callers_error(tmp_path: Path) -> None:
    good = tmp_path / "a.npz"
    np.savez(good, b=np.arange(3), a=np.ones(2))
    arrays = read_npz(good, ValueError)
    assert list(arrays) == ["a", "b"] and arrays["b"].tolist() == [0, 1, 2]
    bad = tmp_path / "bad.npz"
    bad.write_bytes(good.read_bytes()[:40])
    with pytest.raises(KeyError, match="bad"):
        read_npz(bad, lambda why: KeyError(f"bad: {why}"))
