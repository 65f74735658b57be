"""Package format: construction checks, save/load round trip, corrupt files, hash."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from simulator import load_device, load_package, save_package
from simulator.package import ARRAYS_FILE, MANIFEST_FILE, Package, _derived, per_package
from simulator.testing import ksplit_matmul, repeat_program
from tilecommon.errors import PackageInvalid

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pkg() -> Package:
    return repeat_program(load_device("tiny"), 3)


def test_round_trip_keeps_everything(pkg: Package, tmp_path: Path) -> None:
    path = save_package(pkg, tmp_path / "p")
    back = load_package(path)
    assert back == pkg
    assert back.content_hash() == pkg.content_hash()
    assert back.buffer_names == pkg.buffer_names and back.io == pkg.io
    for name, arr in pkg.arrays.items():
        np.testing.assert_array_equal(back.arrays[name], arr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # no temp dirs left


def test_save_replaces_existing_package_atomically(pkg: Package, tmp_path: Path) -> None:
    other = ksplit_matmul(load_device("tiny"))[0]
    save_package(other, tmp_path / "p")
    save_package(pkg, tmp_path / "p")
    assert load_package(tmp_path / "p") == pkg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_failed_save_leaves_nothing(pkg: Package, tmp_path: Path) -> None:
    (tmp_path / "notapkg").mkdir()
    (tmp_path / "notapkg" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        save_package(pkg, tmp_path / "notapkg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notapkg"]
    assert (tmp_path / "notapkg" / "keep.txt").read_text() == "x"


def test_per_package_computes_once_per_package_object(pkg: Package) -> None:
    calls: list[int] = []

    @per_package
    def steps(p: Package) -> int:
        calls.append(p.n_steps)
        if p.n_steps > 100:
            raise PackageInvalid("too many steps")
        return p.n_steps

    assert steps(pkg) == steps(pkg) == pkg.n_steps and len(calls) == 1
    other = pkg.with_arrays(step_trips=pkg.arrays["step_trips"])  # equal, another object
    assert steps(other) == pkg.n_steps and len(calls) == 2
    big = repeat_program(load_device("tiny"), 3)
    object.__setattr__(big, "arrays", dict(big.arrays, step_kind=np.zeros(101, np.int64)))
    for _ in range(2):  # a call that raises caches nothing
        with pytest.raises(PackageInvalid):
            steps(big)
    assert len(calls) == 4
    keys = [k for k in _derived if k[1].endswith("steps")]
    assert len(keys) == 2
    del other
    gc.collect()  # a dropped package's entry goes with it
    assert [k for k in _derived if k[1].endswith("steps")] == [(id(pkg), keys[0][1])]


def test_a_released_program_is_built_again_by_the_next_run() -> None:
    """simulator.run.release drops the engine's program of a package; the
    next run builds a new one and simulates the same cycles."""
    from simulator.engines.numba import program_arrays
    from simulator.run import release, run

    p = repeat_program(load_device("tiny"), 3)
    first = run(p, numerics=False).cycles
    held = program_arrays(p)
    assert program_arrays(p) is held  # kept while the package lives
    release(p)
    assert not [k for k in _derived if k[0] == id(p) and k[1].endswith("program_arrays")]
    assert run(p, numerics=False).cycles == first
    assert program_arrays(p) is not held


def test_arrays_are_read_only(pkg: Package) -> None:
    with pytest.raises(ValueError):
        pkg.arrays["buf_addr"][0] = 1


def test_with_arrays_changes_hash(pkg: Package) -> None:
    addr = pkg["buf_addr"].copy()
    addr[0] += 8
    changed = pkg.with_arrays(buf_addr=addr)
    assert changed.content_hash() != pkg.content_hash()
    assert int(changed["buf_addr"][0]) == int(pkg["buf_addr"][0]) + 8


def test_vertex_invocations_counts_loop_trips() -> None:
    dev = load_device("tiny")
    # 2 COPY outside the loop + 1 ADD per iteration
    assert repeat_program(dev, 5).vertex_invocations() == 7
    assert repeat_program(dev, 5, unrolled=True).vertex_invocations() == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step_vtx": np.array([0, 1], dtype=np.int64)}, "array step_vtx: shape"),
        ({"buf_addr": np.zeros(3, dtype=np.int32)}, "array buf_addr: dtype must be int64"),
        ({"v_args": np.zeros((4, 15), dtype=np.int64)}, "array v_args: shape"),
    ],
)
def test_constructor_rejects_bad_arrays(pkg: Package, change: dict, message: str) -> None:
    with pytest.raises(PackageInvalid, match=message):
        pkg.with_arrays(**change)


def test_constructor_rejects_bad_csr(pkg: Package) -> None:
    offs = pkg["step_vtx"].copy()
    offs[1], offs[2] = offs[2], offs[1] - 1 if offs[1] else 5
    with pytest.raises(PackageInvalid, match="step_vtx: CSR offsets"):
        pkg.with_arrays(step_vtx=offs)


def test_constructor_rejects_missing_array(pkg: Package) -> None:
    arrays = dict(pkg.arrays)
    del arrays["x_bytes"]
    with pytest.raises(PackageInvalid, match=r"missing \['x_bytes'\]"):
        Package(pkg.name, pkg.device, pkg.io, pkg.buffer_names, arrays)


# ---- corrupt files --------------------------------------------------------------------


def _saved(pkg: Package, tmp_path: Path) -> Path:
    return save_package(pkg, tmp_path / "p")


def test_wrong_version_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    m = json.loads((path / MANIFEST_FILE).read_text())
    m["version"] = 99
    (path / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(PackageInvalid, match="'version': expected 2, got 99"):
        load_package(path)


def test_missing_file_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    (path / ARRAYS_FILE).unlink()
    with pytest.raises(PackageInvalid, match=r"arrays\.npz: missing"):
        load_package(path)


def test_truncated_npz_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    data = (path / ARRAYS_FILE).read_bytes()
    (path / ARRAYS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(PackageInvalid, match="unreadable or truncated npz"):
        load_package(path)


def test_tampered_content_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    arrays = dict(np.load(path / ARRAYS_FILE))
    arrays["x_bytes"] = arrays["x_bytes"] - 8
    np.savez(path / ARRAYS_FILE, **arrays)
    with pytest.raises(PackageInvalid, match="content hash mismatch"):
        load_package(path)


def test_tampered_manifest_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    m = json.loads((path / MANIFEST_FILE).read_text())
    m["buffer_names"][0] = "renamed"
    (path / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(PackageInvalid, match="content hash mismatch"):
        load_package(path)


def test_wrong_dtype_in_file_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    arrays = dict(np.load(path / ARRAYS_FILE))
    arrays["buf_bytes"] = arrays["buf_bytes"].astype(np.float64)
    np.savez(path / ARRAYS_FILE, **arrays)
    with pytest.raises(PackageInvalid, match="array buf_bytes: dtype must be int64, got float64"):
        load_package(path)


def test_wrong_shape_in_file_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    arrays = dict(np.load(path / ARRAYS_FILE))
    arrays["fp_code"] = arrays["fp_code"][:-1]
    np.savez(path / ARRAYS_FILE, **arrays)
    with pytest.raises(PackageInvalid, match=r"array fp_code: shape must be \(16,\)"):
        load_package(path)


def test_garbage_zip_member_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    arrays = dict(np.load(path / ARRAYS_FILE))
    np.savez(path / ARRAYS_FILE, **{k: v for k, v in arrays.items() if k != "step_kind"})
    with zipfile.ZipFile(path / ARRAYS_FILE, "a") as z:
        z.writestr("step_kind.npy", b"not an npy file")
    with pytest.raises(PackageInvalid, match="array step_kind: must be a numpy array"):
        load_package(path)


def test_bad_manifest_json_is_rejected(pkg: Package, tmp_path: Path) -> None:
    path = _saved(pkg, tmp_path)
    (path / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(PackageInvalid, match="package.json: not valid JSON"):
        load_package(path)


# ---- hash stability ---------------------------------------------------------------------

_HASH_SCRIPT = """
import sys
sys.path.insert(0, "tests")
from simulator import load_device
from simulator.testing import repeat_program
print(repeat_program(load_device("tiny"), 3, unrolled=False).content_hash())
"""


def test_hash_is_identical_across_processes_and_hash_seeds(pkg: Package) -> None:
    hashes = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _HASH_SCRIPT], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
        hashes.append(out.stdout.strip())
    assert hashes[0] == hashes[1] == pkg.content_hash()
    assert len(hashes[0]) == 64


def test_buffer_names_become_a_tuple_of_str_with_the_same_hash(pkg: Package) -> None:
    class Label(str):
        pass

    names = pkg.buffer_names
    as_list = Package(pkg.name, pkg.device, pkg.io, list(names), dict(pkg.arrays), pkg.meta)
    sub = Package(pkg.name, pkg.device, pkg.io, (Label(names[0]),) + names[1:],
                  dict(pkg.arrays), pkg.meta)
    assert type(as_list.buffer_names) is tuple and as_list.buffer_names == names
    assert type(sub.buffer_names[0]) is str
    assert as_list.content_hash() == sub.content_hash() == pkg.content_hash()
    ints = Package(pkg.name, pkg.device, pkg.io, (7,) + names[1:], dict(pkg.arrays), pkg.meta)
    assert ints.buffer_names[0] == "7"
