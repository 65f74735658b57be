"""The package format: the only thing the planner hands the simulator.

A `Package` is plain data — a JSON-able manifest plus a dict of int64 numpy
arrays laid out exactly as docs/contracts.md §3 lists them (struct-of-arrays,
CSR offsets).  Construction checks the *shape* of the data (every array present,
int64, consistent lengths, monotone CSR offsets, a well-formed I/O list) and
raises `PackageInvalid` naming the array or field; the *meaning* (addresses,
liveness, races, loops) is checked by `simulator.verify`.

The arrays are stored as read-only views: a package never changes after it is
built.  Use `Package.with_arrays(...)` to derive a changed copy.

On disk a package is a directory holding `package.json` (manifest + content
hash) and `arrays.npz`.  `save_package` writes a temporary directory beside the
target and moves it into place with `os.replace`, so a failed save leaves
nothing half-written.  `load_package` raises `PackageInvalid` for a missing
file, a wrong version, a truncated or unreadable npz, an array of the wrong
dtype or shape, or content whose hash differs from the recorded one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kernels.abi import (
    BUFFER_KIND_NAMES,
    DTYPE_NAMES,
    IO_DIMS,
    IO_ROLES,
    N_ARGS,
    STEP_REPEAT_BEGIN,
)
from simulator.device import Device
from simulator.xschedule import SCHEDULE_ARRAYS, schedule_arrays
from tilecommon.errors import PackageInvalid
from tilecommon.files import atomic_dir, read_npz

VERSION = 2  # 2: the exchange schedule (x_send, step_piece, q_*, step_xcycles)
MANIFEST_FILE = "package.json"
ARRAYS_FILE = "arrays.npz"

IO_DTYPES = DTYPE_NAMES

# array name -> (length symbol, trailing shape).  Symbols: S steps, V vertices,
# X transfers, B buffers, P patches, T table entries, I io blocks, tiles;
# a "+1" suffix marks CSR offsets.
ARRAY_SPEC: dict[str, tuple[str, tuple[int, ...]]] = {
    "step_kind": ("S", ()),
    "step_vtx": ("S+1", ()),
    "step_xfer": ("S+1", ()),
    "step_trips": ("S", ()),
    "step_match": ("S", ()),
    "v_tile": ("V", ()),
    "v_kernel": ("V", ()),
    "v_args": ("V", (N_ARGS,)),
    "x_src_tile": ("X", ()),
    "x_src_addr": ("X", ()),
    "x_dst_tile": ("X", ()),
    "x_dst_addr": ("X", ()),
    "x_bytes": ("X", ()),
    "x_send": ("X", ()),
    "step_piece": ("S+1", ()),
    "step_xcycles": ("S", ()),
    "q_send": ("Q", ()),
    "q_offset": ("Q", ()),
    "q_bytes": ("Q", ()),
    "q_start": ("Q", ()),
    "buf_tile": ("B", ()),
    "buf_addr": ("B", ()),
    "buf_bytes": ("B", ()),
    "buf_kind": ("B", ()),
    "buf_first": ("B", ()),
    "buf_last": ("B", ()),
    "p_target": ("P", ()),
    "p_index": ("P", ()),
    "p_arg": ("P", ()),
    "p_loop": ("P", ()),
    "p_mode": ("P", ()),
    "p_base": ("P", ()),
    "p_stride": ("P", ()),
    "p_table": ("P+1", ()),
    "table_values": ("T", ()),
    "p_table_tile": ("P", ()),
    "p_table_addr": ("P", ()),
    "io_tensor": ("I", ()),
    "io_tile": ("I", ()),
    "io_addr": ("I", ()),
    "io_lo": ("I", (IO_DIMS,)),
    "io_hi": ("I", (IO_DIMS,)),
    "io_ld0": ("I", ()),
    "io_ld1": ("I", ()),
    "fp_code": ("tiles", ()),
    "fp_xtable": ("tiles", ()),
    "fp_support": ("tiles", ()),
    "fp_tensor": ("tiles", ()),
    "fp_tensor_lo": ("tiles", ()),
    "fp_tensor_hi": ("tiles", ()),
}
# the array whose length defines each symbol
_SYMBOL_SOURCE = {
    "S": "step_kind",
    "V": "v_tile",
    "X": "x_src_tile",
    "Q": "q_send",
    "B": "buf_tile",
    "P": "p_target",
    "T": "table_values",
    "I": "io_tensor",
}
_CSR = (("step_vtx", "V"), ("step_xfer", "X"), ("step_piece", "Q"), ("p_table", "T"))
# the schedule's index and range rules, checked at construction so that an
# engine never indexes out of range (what they mean: simulator.verify)
_SCHEDULE_RANGES = (("x_send", 0, "X"), ("q_send", 0, "X"), ("q_offset", 0, 1 << 40),
                    ("q_bytes", 1, 1 << 40), ("q_start", 0, 1 << 40),
                    ("step_xcycles", 0, 1 << 40))


@dataclass(frozen=True)
class IoTensor:
    """One model input, parameter or output as the manifest lists it.

    `scale_exp`: a stored code q means the value q * 2**scale_exp.
    """

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    scale_exp: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "scale_exp": self.scale_exp,
        }


def _io_from(item: Any, where: str) -> IoTensor:
    if isinstance(item, IoTensor):
        item = item.to_dict()
    if not isinstance(item, dict):
        raise PackageInvalid(f"{where}: must be an object, got {type(item).__name__}")
    keys = {"name", "role", "shape", "dtype", "scale_exp"}
    if set(item) != keys:
        raise PackageInvalid(f"{where}: fields must be {sorted(keys)}, got {sorted(item)}")
    name, role, shape = item["name"], item["role"], item["shape"]
    if not isinstance(name, str) or not name:
        raise PackageInvalid(f"{where}.name: must be a non-empty string, got {name!r}")
    if role not in IO_ROLES:
        raise PackageInvalid(f"{where} ({name}).role: must be one of {IO_ROLES}, got {role!r}")
    if item["dtype"] not in IO_DTYPES:
        raise PackageInvalid(f"{where} ({name}).dtype: one of {IO_DTYPES}, got {item['dtype']!r}")
    ok_shape = isinstance(shape, (list, tuple)) and 1 <= len(shape) <= IO_DIMS
    if not ok_shape or not all(isinstance(d, int) and d >= 1 for d in shape):
        raise PackageInvalid(f"{where} ({name}).shape: 1..{IO_DIMS} positive ints, got {shape!r}")
    if not isinstance(item["scale_exp"], int) or isinstance(item["scale_exp"], bool):
        raise PackageInvalid(f"{where} ({name}).scale_exp: must be an int")
    return IoTensor(name, role, tuple(int(d) for d in shape), item["dtype"], item["scale_exp"])


@dataclass(frozen=True, eq=False)
class Package:
    """A complete executable program for one device.

    `arrays` maps each name of `ARRAY_SPEC` to a read-only int64 array (shapes
    in docs/contracts.md §3).  `io` lists the model tensors the `io_*` blocks
    refer to by index; `buffer_names[b]` names buffer b.  Equality is by
    `content_hash()`.
    """

    name: str
    device: Device
    io: tuple[IoTensor, ...]
    buffer_names: tuple[str, ...]
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION
    # per step, the (graph op, op family, role) of each phase it serves (the
    # planner's provenance; () for a hand-built package)
    provenance: tuple[tuple[tuple[str, str, str], ...], ...] = ()
    _hash: list[str] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise PackageInvalid(f"version: expected {VERSION}, got {self.version!r}")
        dev: Any = self.device
        if isinstance(dev, dict):
            dev = Device.from_dict(dev, source="package.device")
        if not isinstance(dev, Device):
            raise PackageInvalid(f"device: must be a Device or dict, got {type(dev).__name__}")
        io = tuple(_io_from(t, f"io[{i}]") for i, t in enumerate(self.io))
        names = [t.name for t in io]
        if len(set(names)) != len(names):
            dup = sorted(n for n in set(names) if names.count(n) > 1)
            raise PackageInvalid(f"io: duplicate tensor names {dup}")
        try:
            json.dumps(self.meta, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise PackageInvalid(f"meta: not JSON-serialisable: {e}") from None
        object.__setattr__(self, "device", dev)
        object.__setattr__(self, "io", io)
        object.__setattr__(self, "buffer_names", _names(self.buffer_names))
        arrays = self.arrays
        if isinstance(arrays, dict) and not set(SCHEDULE_ARRAYS) & set(arrays):
            # built by hand: the transfers get the scheduler's schedule
            unscheduled = {k: v for k, v in ARRAY_SPEC.items() if k not in SCHEDULE_ARRAYS}
            arrays = _checked_arrays(arrays, dev.tiles, unscheduled)
            arrays = {**arrays, **schedule_arrays(dev, arrays)}
        object.__setattr__(self, "arrays", _checked_arrays(arrays, dev.tiles))
        object.__setattr__(self, "_hash", [])
        object.__setattr__(self, "provenance", _provenance(self.provenance, self.n_steps))
        if len(self.buffer_names) != self.n_buffers:
            raise PackageInvalid(
                f"buffer_names: {len(self.buffer_names)} names for {self.n_buffers} buffers"
            )
        io_t = self.arrays["io_tensor"]
        if io_t.size and (io_t.min() < 0 or io_t.max() >= len(io)):
            bad = int(np.flatnonzero((io_t < 0) | (io_t >= len(io)))[0])
            raise PackageInvalid(
                f"io_tensor[{bad}] = {int(io_t[bad])}: not an index into {len(io)} io tensors"
            )

    # ---- sizes -------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        return int(self.arrays["step_kind"].shape[0])

    @property
    def n_vertices(self) -> int:
        return int(self.arrays["v_tile"].shape[0])

    @property
    def n_transfers(self) -> int:
        return int(self.arrays["x_src_tile"].shape[0])

    @property
    def n_buffers(self) -> int:
        return int(self.arrays["buf_tile"].shape[0])

    @property
    def n_patches(self) -> int:
        return int(self.arrays["p_target"].shape[0])

    @property
    def tiles(self) -> int:
        return self.device.tiles

    # ---- accessors ---------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def io_index(self, name: str) -> int:
        """Index of io tensor `name`; KeyError naming the known tensors."""
        for i, t in enumerate(self.io):
            if t.name == name:
                return i
        raise KeyError(f"no io tensor {name!r}; known: {[t.name for t in self.io]}")

    def io_blocks(self, name: str) -> np.ndarray:
        """Indices of the io blocks of tensor `name`, ascending."""
        return np.flatnonzero(self.arrays["io_tensor"] == self.io_index(name))

    def buffer_label(self, b: int) -> str:
        """`name` (kind, tile t, addr+bytes) of buffer b, for messages."""
        a = self.arrays
        kind = int(a["buf_kind"][b])
        kname = BUFFER_KIND_NAMES[kind] if 0 <= kind < len(BUFFER_KIND_NAMES) else f"kind {kind}"
        return (
            f"buffer {self.buffer_names[b]!r} ({kname}, tile {int(a['buf_tile'][b])}, "
            f"{int(a['buf_addr'][b]):#x}+{int(a['buf_bytes'][b])})"
        )

    def vertex_invocations(self) -> int:
        """Number of vertex executions one run performs (Repeat bodies × trips)."""
        a = self.arrays
        per_step = np.diff(a["step_vtx"])
        mult = np.ones(self.n_steps, dtype=np.int64)
        for b in np.flatnonzero(a["step_kind"] == STEP_REPEAT_BEGIN):
            e = int(a["step_match"][b])
            if b < e:
                mult[b + 1 : e] *= int(a["step_trips"][b])
        return int((per_step * mult).sum())

    def manifest(self) -> dict[str, Any]:
        """The JSON-able manifest (without the content hash)."""
        return {
            "version": self.version,
            "name": self.name,
            "device": self.device.to_dict(),
            "io": [t.to_dict() for t in self.io],
            "buffer_names": list(self.buffer_names),
            "meta": self.meta,
            "provenance": [[list(e) for e in step] for step in self.provenance],
        }

    def with_arrays(self, **changes: np.ndarray) -> Package:
        """A new package with some arrays replaced (checked like any package)."""
        unknown = sorted(set(changes) - set(ARRAY_SPEC))
        if unknown:
            raise KeyError(f"unknown arrays {unknown}")
        arrays = dict(self.arrays)
        arrays.update(changes)
        return dataclasses.replace(self, arrays=arrays)

    def content_hash(self) -> str:
        """sha256 hex of canonical manifest JSON + arrays in sorted name order.

        Identical across processes and PYTHONHASHSEED: it depends only on the
        sorted-key JSON text and on each array's name, dtype, shape and bytes.
        """
        if not self._hash:
            self._hash.append(_hash_content(self.manifest(), self.arrays))
        return self._hash[0]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Package):
            return NotImplemented
        return self.content_hash() == other.content_hash()

    def __hash__(self) -> int:
        return int(self.content_hash()[:16], 16)


T = TypeVar("T")
_derived: dict[tuple[int, str], tuple[weakref.ref[Package], Any]] = {}
_derived_lock = threading.Lock()


def per_package(fn: Callable[[Package], T]) -> Callable[[Package], T]:
    """`fn(pkg)` computed once per Package object while it lives, like its
    content hash: for what a pure function of the (read-only) package
    derives, such as the structure check and the engine's indexes, which a
    build's verification and the runs of one package would otherwise each
    redo (siglip-so400m 1 layer: 23 ms a run; 27 layers: 0.35 s).  A call
    that raises caches nothing."""
    name = f"{fn.__module__}.{fn.__qualname__}"

    def forget(key: tuple[int, str]) -> None:
        with _derived_lock:
            _derived.pop(key, None)

    @functools.wraps(fn)
    def cached(pkg: Package) -> T:
        key = (id(pkg), name)
        with _derived_lock:
            hit = _derived.get(key)
        if hit is not None and hit[0]() is pkg:
            return hit[1]  # type: ignore[no-any-return]
        value = fn(pkg)
        ref = weakref.ref(pkg, lambda _ref: forget(key))
        with _derived_lock:
            _derived[key] = (ref, value)
        return value

    return cached


def forget_derived(pkg: Package, fn: Callable[[Package], Any]) -> None:
    """Drop what the `per_package` function `fn` keeps for `pkg` (its next
    call computes it again): for a package that stays alive but whose
    derived indexes are not needed for a while."""
    with _derived_lock:
        _derived.pop((id(pkg), f"{fn.__module__}.{fn.__qualname__}"), None)


def _provenance(prov: Any, n_steps: int) -> tuple[tuple[tuple[str, str, str], ...], ...]:
    """`prov` checked: () or, per step, a list of (op, family, role) strings."""
    if not isinstance(prov, (list, tuple)):
        raise PackageInvalid(f"provenance: must be a list, got {type(prov).__name__}")
    if prov and len(prov) != n_steps:
        raise PackageInvalid(f"provenance: {len(prov)} entries for {n_steps} steps")
    out = []
    for s, step in enumerate(prov):
        if not isinstance(step, (list, tuple)) or not all(
                isinstance(e, (list, tuple)) and len(e) == 3
                and all(isinstance(x, str) for x in e) for e in step):
            raise PackageInvalid(f"provenance[{s}]: must be a list of [op, family, role]")
        out.append(tuple((str(e[0]), str(e[1]), str(e[2])) for e in step))
    return tuple(out)


def _names(names: Any) -> tuple[str, ...]:
    """`names` as a tuple of str; a tuple of exact str (what the linker
    hands over: ~10⁵ names) is taken as is, in one C-level pass over types."""
    if type(names) is tuple and set(map(type, names)) <= {str}:
        return names
    return tuple(str(n) for n in names)


def _hash_content(manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"\n{name}|{a.dtype.str}|{list(a.shape)}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _checked_arrays(arrays: dict[str, Any], tiles: int,
                   spec: dict[str, tuple[str, tuple[int, ...]]] = ARRAY_SPEC,
                   ) -> dict[str, np.ndarray]:
    if not isinstance(arrays, dict):
        raise PackageInvalid(f"arrays: must be a dict, got {type(arrays).__name__}")
    missing = sorted(set(spec) - set(arrays))
    extra = sorted(set(arrays) - set(ARRAY_SPEC))
    if missing:
        raise PackageInvalid(f"arrays: missing {missing}")
    if extra:
        raise PackageInvalid(f"arrays: unknown {extra}")
    out: dict[str, np.ndarray] = {}
    for name in spec:
        a = arrays[name]
        if not isinstance(a, np.ndarray):
            raise PackageInvalid(f"array {name}: must be a numpy array, got {type(a).__name__}")
        if a.dtype != np.int64:
            raise PackageInvalid(f"array {name}: dtype must be int64, got {a.dtype}")
        view = np.ascontiguousarray(a).view()
        view.flags.writeable = False
        out[name] = view
    sizes = {sym: int(out[src].shape[0]) if out[src].ndim else -1
             for sym, src in _SYMBOL_SOURCE.items() if src in out}
    sizes["tiles"] = tiles
    for name, (sym, tail) in spec.items():
        base = sym.removesuffix("+1")
        n = sizes[base] + (1 if sym.endswith("+1") else 0)
        want = (n, *tail)
        if out[name].shape != want:
            raise PackageInvalid(
                f"array {name}: shape must be {want} ({sym} = {n}), got {out[name].shape}"
            )
    for name, sym in _CSR:
        if name not in spec:
            continue
        offs = out[name]
        if offs[0] != 0 or offs[-1] != sizes[sym] or np.any(np.diff(offs) < 0):
            raise PackageInvalid(
                f"array {name}: CSR offsets must rise from 0 to {sym} = {sizes[sym]}"
            )
    for name, lo, hi in _SCHEDULE_RANGES if "q_send" in spec else ():
        top = sizes[hi] if isinstance(hi, str) else hi
        bad = np.flatnonzero((out[name] < lo) | (out[name] >= top))
        if bad.size:
            i = int(bad[0])
            raise PackageInvalid(f"array {name}[{i}] = {int(out[name][i])}: must lie in "
                                 f"[{lo}, {top})")
    return out


# ---- files ---------------------------------------------------------------------


def save_package(pkg: Package, path: str | os.PathLike[str]) -> Path:
    """Write `pkg` as directory `path` (package.json + arrays.npz), atomically.

    The files are written into a temporary directory beside `path` and moved
    into place with `os.replace`; an existing package at `path` is replaced.
    On any failure the temporary directory is removed and `path` is untouched.
    Returns the path.
    """
    target = Path(path)
    with atomic_dir(target, MANIFEST_FILE, "package") as tmp:
        manifest = pkg.manifest()
        manifest["content_hash"] = pkg.content_hash()
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, sort_keys=True, indent=1))
        with open(tmp / ARRAYS_FILE, "wb") as f:
            np.savez(f, **dict(sorted(pkg.arrays.items())))  # type: ignore[arg-type]
    return target


def load_package(path: str | os.PathLike[str]) -> Package:
    """Read a package directory written by `save_package`.

    Raises PackageInvalid naming the file and what is wrong: missing files,
    unparsable JSON, wrong version, truncated/corrupt npz, missing or extra
    arrays, wrong dtype or shape, or a content hash that does not match.
    """
    root = Path(path)
    mpath, apath = root / MANIFEST_FILE, root / ARRAYS_FILE
    for p in (mpath, apath):
        if not p.is_file():
            raise PackageInvalid(f"{p}: missing")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageInvalid(f"{mpath}: not valid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise PackageInvalid(f"{mpath}: must hold a JSON object")
    if manifest.get("version") != VERSION:
        raise PackageInvalid(
            f"{mpath}: field 'version': expected {VERSION}, got {manifest.get('version')!r}"
        )
    keys = {"version", "name", "device", "io", "buffer_names", "meta", "content_hash",
            "provenance"}
    if set(manifest) != keys:
        raise PackageInvalid(f"{mpath}: fields must be {sorted(keys)}, got {sorted(manifest)}")
    arrays = read_npz(apath, lambda why: PackageInvalid(
        f"{apath}: unreadable or truncated npz: {why}"))
    try:
        pkg = Package(
            name=manifest["name"],
            device=Device.from_dict(manifest["device"], source=f"{mpath}: device"),
            io=tuple(_io_from(t, f"io[{i}]") for i, t in enumerate(manifest["io"])),
            buffer_names=tuple(manifest["buffer_names"]),
            arrays=arrays,
            meta=manifest["meta"],
            version=manifest["version"],
            provenance=manifest["provenance"],
        )
    except PackageInvalid as e:
        raise PackageInvalid(f"{root}: {e}") from None
    except Exception as e:  # a ConfigError from the device, a TypeError from bad fields
        raise PackageInvalid(f"{mpath}: {e}") from None
    if pkg.content_hash() != manifest["content_hash"]:
        raise PackageInvalid(
            f"{root}: content hash mismatch: recorded {manifest['content_hash']!r}, "
            f"content gives {pkg.content_hash()!r} (file tampered or corrupt)"
        )
    return pkg
