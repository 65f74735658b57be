"""Python side of a simulation: memory image, inputs, engine, outputs.

`run(pkg, params, inputs, numerics, engine)`:

1. checks the package's structure (`verify.check_structure`; the full static
   `verify` is separate and not repeated here);
2. with `numerics=True`, builds one uint8 image row per tile that holds a
   tensor buffer, covering the span of its tensor buffers (parameter,
   activation, scratch, exchange-landing; code, exchange-table and support
   memory hold nothing a vertex or transfer may touch, so an access there is
   out of range), and writes every input/parameter block: the logical float32
   slice is divided by 2**scale_exp and encoded to the block's dtype
   (kernels.dtypes), rows placed at `addr + a*ld0 + b*ld1`; the image's
   mappings come from and go back to `simulator.image_pool`, so a run after
   a run does not fault its pages in again;
3. runs the chosen engine (simulator.engines: "numba", the jitted superstep
   loop, or "simpy", the event-level twin for small packages);
4. reads each output's blocks back, decodes them and multiplies by
   2**scale_exp into a float32 array of the logical shape.  An output byte that
   was never written is a fault (F_OUTPUT) and its element reads as NaN.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numba
import numpy as np

from kernels import status
from kernels.abi import IO_DIMS, PATCH_VERTEX_ARG, STEP_COMPUTE, STEP_KIND_NAMES, TENSOR_KINDS
from kernels.dtypes import DTYPE_BYTES, dtype_code, fp8_decode, fp8_encode, fp16_decode, fp16_encode
from simulator import image_pool
from simulator.access import bits_set
from simulator.engines.base import (
    ENGINES,
    F_ARGS,
    F_DST_BUFFER,
    F_NO_BUFFER,
    F_OUTPUT,
    F_PATCH,
    F_RACE,
    F_SRC_BUFFER,
    FAULT_NAMES,
    MemoryImage,
)
from simulator.engines.base import engine as engine_named
from simulator.engines.numba_data import PARTS, part_of
from simulator.package import IoTensor, Package, forget_derived
from simulator.verify import check_structure, patch_collisions
from tilecommon.errors import PackageInvalid, SimulationFault
from tilecommon.jit import kjit, kjit_inline, kjit_parallel

__all__ = ["ENGINES", "Fault", "SimResult", "run"]


@dataclass(frozen=True)
class Fault:
    """One recorded fault.  `loop` is the REPEAT_BEGIN step of the innermost open
    loop (-1 outside loops) and `iteration` its counter; `item` the vertex or
    transfer index (by the step's kind); `detail` a code-specific number (bytes,
    alignment, kernel status, or the other racing item)."""

    code: int
    kind: str
    step: int
    tile: int
    address: int
    loop: int
    iteration: int
    item: int
    detail: int
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class SimResult:
    """Result of one run.  Cycles are device cycles; bytes are exchange bytes."""

    cycles: int
    cycles_per_step: np.ndarray  # int64 [S], summed over Repeat iterations
    tile_busy: np.ndarray  # int64 [tiles], summed vertex cycles
    tile_bytes_in: np.ndarray  # int64 [tiles]
    tile_bytes_out: np.ndarray  # int64 [tiles], each send of the schedule once per step
    tile_send_busy: np.ndarray  # int64 [tiles], exchange cycles its send lane is booked
    tile_receive_busy: np.ndarray  # int64 [tiles], ... its receive port
    outputs: dict[str, np.ndarray]  # logical float32 arrays (empty without numerics)
    faults: tuple[Fault, ...]  # at most engine.MAX_FAULTS (+ output faults)
    n_faults: int  # all faults, including those not kept
    vertex_invocations: int
    clock_hz: float
    # host seconds per phase of this run (the engine's profile, where it keeps
    # one, plus the structure check, "image: build" and "outputs: read"): where
    # simulation time goes
    profile: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Simulated time at the device clock."""
        return self.cycles / self.clock_hz

    @property
    def ok(self) -> bool:
        return self.n_faults == 0

    def raise_on_fault(self) -> None:
        """Raise SimulationFault listing the first faults, if any were recorded."""
        if self.n_faults:
            shown = "; ".join(str(f) for f in self.faults[:3])
            more = f" (+{self.n_faults - 3} more)" if self.n_faults > 3 else ""
            raise SimulationFault(f"{self.n_faults} fault(s): {shown}{more}", list(self.faults))


def run(
    pkg: Package,
    params: Mapping[str, np.ndarray] | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
    numerics: bool = True,
    engine: str = "numba",
) -> SimResult:
    """Simulate `pkg`; see the module docstring.

    Raises ValueError for an unknown engine (naming the engines), a missing,
    unknown or wrongly shaped param/input when `numerics`; PackageInvalid when
    the package's structure is broken.
    """
    execute = engine_named(engine)  # an unknown name fails before any work
    t0 = time.perf_counter()
    check_structure(pkg)
    t_check = time.perf_counter() - t0
    image = None
    t0 = time.perf_counter()
    if numerics:
        image = build_image(pkg, dict(params or {}), dict(inputs or {}))
    t_image = time.perf_counter() - t0
    out = execute(pkg, image)
    t0 = time.perf_counter()
    faults = [*_patch_faults(pkg), *(describe_fault(pkg, row) for row in out.faults)]
    outputs: dict[str, np.ndarray] = {}
    n_faults = out.n_faults + len(faults) - len(out.faults)
    if image is not None:
        for t in pkg.io:
            if t.role == "output":
                arr, bad = read_output(pkg, image, t)
                outputs[t.name] = arr
                faults += bad
                n_faults += len(bad)
        _give_back(image, out.n_faults == 0)
        image = None
    profile = {"package: structure check": t_check, "image: build": t_image, **out.profile,
               "outputs: read": time.perf_counter() - t0}
    return SimResult(
        cycles=out.cycles, cycles_per_step=out.cycles_per_step, tile_busy=out.tile_busy,
        tile_bytes_in=out.tile_bytes_in, tile_bytes_out=out.tile_bytes_out,
        tile_send_busy=out.tile_send_busy, tile_receive_busy=out.tile_receive_busy,
        outputs=outputs,
        faults=tuple(faults), n_faults=n_faults, vertex_invocations=out.vertex_invocations,
        clock_hz=pkg.device.clock_hz, profile=profile,
    )


def release(pkg: Package) -> None:
    """Drop the Numba engine's program of `pkg` (its patch and access
    indexes and per-transfer busy cycles: 74 MB for a batch-2 27-layer
    siglip-so400m-map package; 0.1 s to rebuild on the next run).  The
    optimizer releases each incumbent once it is simulated, so that the
    next trial's build does not share the memory with it."""
    from simulator.engines.numba import program_arrays

    forget_derived(pkg, program_arrays)


# ---- memory image ----------------------------------------------------------------


def build_image(pkg: Package, params: dict[str, np.ndarray],
                inputs: dict[str, np.ndarray]) -> MemoryImage:
    """Zeroed image rows for every tile holding a tensor buffer, each covering the
    span of the tile's tensor buffers, with params/inputs written."""
    given = {"parameter": params, "input": inputs}
    wanted = {role: {t.name for t in pkg.io if t.role == role} for role in given}
    for role, values in given.items():
        unknown = sorted(set(values) - wanted[role])
        if unknown:
            raise ValueError(f"unknown {role}(s) {unknown}; the package has {sorted(wanted[role])}")
    for t in pkg.io:
        if t.role == "output":
            continue
        if t.name not in given[t.role]:
            raise ValueError(f"{t.role} {t.name!r} missing (numerics=True needs every "
                             f"input and parameter)")
        shape = np.shape(given[t.role][t.name])
        if shape != t.shape:
            raise ValueError(f"{t.role} {t.name!r}: shape {shape}, package expects {t.shape}")
    image = _empty_image(pkg)
    for k, t in enumerate(pkg.io):
        if t.role == "output":
            continue
        x = np.asarray(given[t.role][t.name], dtype=np.float32).reshape(_padded(t.shape))
        if t.scale_exp:
            x = x * np.float32(2.0 ** -t.scale_exp)  # exact: a power of two
        codes = _encode(x, t.dtype).reshape(-1)
        ids = np.flatnonzero(pkg.arrays["io_tensor"] == k)
        rows, geo, bad = _block_geometry(pkg, image, ids, t)
        if bad.any():
            raise _outside(pkg, int(ids[np.argmax(bad)]), t)
        if threading.current_thread() is threading.main_thread():
            _scatter_parallel(image.mem, image.written, rows, geo, codes)
        else:  # the thread pool is entered from the main thread only (tilecommon.jit)
            _scatter(image.mem, image.written, rows, geo, codes)
    return image


def _empty_image(pkg: Package) -> MemoryImage:
    a = pkg.arrays
    tens = np.isin(a["buf_kind"], TENSOR_KINDS)
    bt, lo_b = a["buf_tile"][tens], a["buf_addr"][tens]
    hi_b = (a["buf_addr"] + a["buf_bytes"])[tens]
    # per tile the lowest start and highest end of its tensor buffers (one
    # sort: ufunc.at took longer than the rest of the image together)
    order = np.argsort(bt, kind="stable")
    bts = bt[order]
    first = np.flatnonzero(np.r_[True, bts[1:] != bts[:-1]]) if bts.size else bts
    tiles = bts[first]
    lo = np.full(pkg.tiles, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.zeros(pkg.tiles, dtype=np.int64)
    if tiles.size:
        lo[tiles] = np.minimum.reduceat(lo_b[order], first)
        hi[tiles] = np.maximum.reduceat(hi_b[order], first)
    tile_row = np.full(pkg.tiles, -1, dtype=np.int64)
    tile_row[tiles] = np.arange(tiles.size)
    tile_base = np.where(tile_row >= 0, lo, -1)
    tile_size = np.where(tile_row >= 0, hi - lo, 0)
    width = int(-(-max(int(tile_size.max(initial=0)), 1) // 8) * 8)
    mem, written = image_pool.take(tiles.size, width)
    return MemoryImage(mem, written, tile_row, tile_base, tile_size)


def _give_back(image: MemoryImage, marked: bool) -> None:
    """Hand a run's own image to simulator.image_pool for the next run
    (`marked`: the run had no fault, so its bitmap marks every byte written)."""
    sizes = np.zeros(image.mem.shape[0], dtype=np.int64)
    used = image.tile_row >= 0
    sizes[image.tile_row[used]] = image.tile_size[used]
    image_pool.give(image.mem, image.written, sizes, marked)


def read_output(pkg: Package, image: MemoryImage, t: IoTensor) -> tuple[np.ndarray, list[Fault]]:
    """Assemble output `t` from its blocks.  Bytes never written become F_OUTPUT
    faults (one per block) and their elements read as NaN."""
    esize = DTYPE_BYTES[dtype_code(t.dtype)]
    shape = _padded(t.shape)
    raw = np.zeros(int(np.prod(shape)) * esize, dtype=np.uint8)
    ok = np.zeros_like(raw)
    faults: list[Fault] = []
    ids = np.flatnonzero(pkg.arrays["io_tensor"] == pkg.io_index(t.name))
    rows, geos, outside = _block_geometry(pkg, image, ids, t)
    reported = 0  # bytes already in a block's fault
    for i, row, geo, out in zip(ids.tolist(), rows.tolist(), geos, outside.tolist(), strict=True):
        if out:  # outside the image: nothing there was ever written
            nbytes = int(np.prod(pkg.arrays["io_hi"][i] - pkg.arrays["io_lo"][i])) * esize
            faults.append(_output_fault(pkg, t, i, int(pkg.arrays["io_addr"][i]), nbytes))
            reported += nbytes
            continue
        n_bad, first = _gather(image.mem, image.written, row, geo, raw, ok)
        if n_bad:
            addr = int(first) + int(image.tile_base[int(pkg.arrays["io_tile"][i])])
            faults.append(_output_fault(pkg, t, i, addr, int(n_bad)))
            reported += int(n_bad)
    uncovered = int((ok == 0).sum()) - reported
    if uncovered > 0:  # elements no io block covers: a gap in the output map
        first = int(np.flatnonzero(ok == 0)[0]) // esize
        at = ", ".join(str(int(x)) for x in np.unravel_index(first, t.shape))
        row = np.array([F_OUTPUT, max(pkg.n_steps - 1, 0), -1, 0, -1, 0, -1, uncovered],
                       dtype=np.int64)
        f = describe_fault(pkg, row, output=t.name)
        faults.append(dataclasses.replace(f, message=(
            f"{f.kind}: output {t.name!r}: {uncovered} byte(s) that no io block covers "
            f"(first at element [{at}])")))
    vals = _decode(raw, t.dtype)
    if t.scale_exp:
        vals = vals * np.float32(2.0 ** t.scale_exp)
    if (ok == 0).any():  # a gap between blocks, or a block with unwritten bytes
        missing = (ok.reshape(-1, esize) == 0).any(axis=1)
        vals[missing] = np.nan  # never a stale or zero value for an unwritten element
    return vals.reshape(t.shape), faults


def _patch_faults(pkg: Package) -> list[Fault]:
    """F_PATCH for every patch that rewrites an argument an earlier patch
    rewrites too (verify rejects such a package; with verification skipped
    the engines apply both, so the argument's value is not the package's)."""
    a = pkg.arrays
    out = []
    for first, later in patch_collisions(pkg).tolist():
        tgt, idx, arg = (int(a[k][later]) for k in ("p_target", "p_index", "p_arg"))
        ptr = a["step_vtx"] if tgt == PATCH_VERTEX_ARG else a["step_xfer"]
        step = int(np.searchsorted(ptr, idx, side="right")) - 1
        tile = int(a["v_tile"][idx]) if tgt == PATCH_VERTEX_ARG else int(a["x_src_tile"][idx])
        what = (f"vertex {idx} arg {arg}" if tgt == PATCH_VERTEX_ARG else
                f"transfer {idx} {'source' if tgt == 1 else 'destination'} address")
        row = np.array([F_PATCH, step, tile, 0, int(a["p_loop"][later]), 0, later, first],
                       dtype=np.int64)
        f = describe_fault(pkg, row)
        out.append(dataclasses.replace(f, message=(
            f"{f.kind} at step {step}, tile {tile}: patches {first} and {later} both rewrite "
            f"{what}")))
    return out


def _output_fault(pkg: Package, t: IoTensor, i: int, addr: int, nbytes: int) -> Fault:
    """F_OUTPUT: `nbytes` of io block i of output t, from `addr`, never written."""
    row = np.array([F_OUTPUT, max(pkg.n_steps - 1, 0), int(pkg.arrays["io_tile"][i]), addr,
                    -1, 0, i, nbytes], dtype=np.int64)
    return describe_fault(pkg, row, output=t.name)


def _padded(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (IO_DIMS - len(shape)) + shape


def _block_geometry(pkg: Package, image: MemoryImage, ids: np.ndarray,
                    t: IoTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image rows, geometry, outside) of io blocks `ids` of tensor t: the
    geometry rows are (offset, ld0, ld1, ext0, ext1, row bytes, logical
    offset, logical ld0, logical ld1), all in bytes; `outside` marks blocks
    that do not lie inside their tile's image row."""
    a = pkg.arrays
    tile = a["io_tile"][ids]
    rows = image.tile_row[tile]
    lo, hi = a["io_lo"][ids], a["io_hi"][ids]
    esize = DTYPE_BYTES[dtype_code(t.dtype)]
    _, s1, s2 = _padded(t.shape)
    ld0, ld1 = a["io_ld0"][ids], a["io_ld1"][ids]
    ext0, ext1, rb = hi[:, 0] - lo[:, 0], hi[:, 1] - lo[:, 1], (hi[:, 2] - lo[:, 2]) * esize
    off = a["io_addr"][ids] - image.tile_base[tile]
    end = off + (ext0 - 1) * ld0 + (ext1 - 1) * ld1 + rb
    outside = (rows < 0) | (off < 0) | (ld0 < 0) | (ld1 < 0) | (end > image.tile_size[tile])
    logical = ((lo[:, 0] * s1 + lo[:, 1]) * s2 + lo[:, 2]) * esize
    geo = np.stack([off, ld0, ld1, ext0, ext1, rb, logical, np.full_like(off, s1 * s2 * esize),
                    np.full_like(off, s2 * esize)], axis=1).astype(np.int64)
    return rows.astype(np.int64), geo, outside


def _outside(pkg: Package, i: int, t: IoTensor) -> PackageInvalid:
    a = pkg.arrays
    return PackageInvalid(f"io block {i} of {t.name!r}: tile {int(a['io_tile'][i])} address "
                          f"{int(a['io_addr'][i]):#x} is outside the tile's tensor buffers "
                          f"(run simulator.verify)")


@kjit
def _scatter(mem, written, rows, geo, src):  # type: ignore[no-untyped-def]
    """Copy the blocks of logical bytes `src` (geometry rows of
    `_block_geometry`) into their image rows and mark them written."""
    _scatter_part(mem, written, rows, geo, src, 0, 1)


@kjit_parallel
def _scatter_parallel(mem, written, rows, geo, src):  # type: ignore[no-untyped-def]
    """`_scatter` over the cores by classes of rows (`part_of`: blocks on one
    row may share bitmap words)."""
    for p in numba.prange(PARTS):
        _scatter_part(mem, written, rows, geo, src, p, PARTS)


@kjit_inline
def _scatter_part(mem, written, rows, geo, src, p, parts):  # type: ignore[no-untyped-def]
    """The blocks of `_scatter` on rows of class p of `parts` (all if 1)."""
    for i in range(rows.shape[0]):
        row = rows[i]
        if parts > 1 and part_of(row) != p:
            continue
        off, ld0, ld1, ext0, ext1, rb = geo[i, 0], geo[i, 1], geo[i, 2], geo[i, 3], geo[i, 4], \
            geo[i, 5]
        src_off, s_ld0, s_ld1 = geo[i, 6], geo[i, 7], geo[i, 8]
        # a block whose rows lie back to back is marked written in one go
        dense = (ext1 == 1 or ld1 == rb) and (ext0 == 1 or ld0 == ext1 * rb)
        for a in range(ext0):
            for b in range(ext1):
                d = off + a * ld0 + b * ld1
                q = src_off + a * s_ld0 + b * s_ld1
                mem[row, d:d + rb] = src[q:q + rb]
                if not dense:
                    bits_set(written, row, d, rb)
        if dense:
            bits_set(written, row, off, ext0 * ext1 * rb)


@kjit
def _gather(mem, written, row, geo, dst, ok):  # type: ignore[no-untyped-def]
    """Copy a block (one geometry row of `_block_geometry`) out of image row
    `row` into logical bytes `dst`, copying the written mask into `ok`.
    Returns (unwritten bytes, image offset of the first)."""
    off, ld0, ld1, ext0, ext1, rb = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    dst_off, d_ld0, d_ld1 = geo[6], geo[7], geo[8]
    n_bad = 0
    first = -1
    for a in range(ext0):
        for b in range(ext1):
            d = off + a * ld0 + b * ld1
            q = dst_off + a * d_ld0 + b * d_ld1
            for c in range(rb):
                dst[q + c] = mem[row, d + c]
                bit = (written[row, (d + c) >> 6] >> np.uint64((d + c) & 63)) & np.uint64(1)
                ok[q + c] = bit
                if bit == np.uint64(0):
                    n_bad += 1
                    if first < 0:
                        first = d + c
    return n_bad, first


def _encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values -> little-endian bytes per element, shape x.shape + (esize,)."""
    if dtype == "fp8":
        codes = fp8_encode(x)
    elif dtype == "fp16":
        codes = fp16_encode(x)
    else:
        codes = x.astype("<f4")
    codes = np.ascontiguousarray(codes)
    return codes.view(np.uint8).reshape(*x.shape, -1)


def _decode(raw: np.ndarray, dtype: str) -> np.ndarray:
    raw = np.ascontiguousarray(raw)
    if dtype == "fp8":
        return fp8_decode(raw)
    if dtype == "fp16":
        return fp16_decode(raw.view("<u2"))
    return raw.view("<f4").astype(np.float32)


# ---- faults -----------------------------------------------------------------------


def buffer_at(pkg: Package, tile: int, addr: int, step: int) -> str:
    """What holds byte `addr` of `tile`, for a fault message: the buffer (any
    kind, live or not) and whether it is live at `step`, or "no buffer"."""
    a = pkg.arrays
    hit = np.flatnonzero((a["buf_tile"] == tile) & (a["buf_addr"] <= addr)
                         & (addr < a["buf_addr"] + a["buf_bytes"]))
    if not hit.size:
        return "no buffer holds that address"
    b = int(hit[0])
    first, last = int(a["buf_first"][b]), int(a["buf_last"][b])
    state = "live" if first <= step <= last else "dead"
    return (f"it starts in {pkg.buffer_label(b)}, {int(a['buf_bytes'][b])} bytes, live steps "
            f"{first}..{last} ({state} here)")


def describe_fault(pkg: Package, row: np.ndarray, output: str | None = None) -> Fault:
    """A readable Fault from an engine fault row (engine.FAULT_COLS values)."""
    code, step, tile, addr, loop, it, item, detail = (int(v) for v in row)
    kind = FAULT_NAMES.get(code, f"fault code {code}")
    sk = int(pkg.arrays["step_kind"][step]) if 0 <= step < pkg.n_steps else -1
    where = f"step {step}"
    if sk >= 0:
        where += f" ({STEP_KIND_NAMES[sk]})"
    where += f", tile {tile}, address {addr:#x}"
    if loop >= 0:
        where += f", iteration {it} of loop at step {loop}"

    def who(k: int) -> str:
        if sk == STEP_COMPUTE:
            return f"vertex {k} (kernel {int(pkg.arrays['v_kernel'][k])})"
        return f"transfer {k}"

    if code == F_OUTPUT:
        what = f"output {output!r} io block {item}: {detail} byte(s) never written"
    elif code == F_RACE:
        what = f"{who(detail)} and {who(item)} touch the same byte and one of them writes"
    elif code == F_ARGS:
        what = f"{who(item)}: {status.describe(detail)}"
    elif code in (F_NO_BUFFER, F_SRC_BUFFER, F_DST_BUFFER):
        what = f"{who(item)}, {detail} bytes; {buffer_at(pkg, tile, addr, step)}"
    else:
        what = f"{who(item)} (detail {detail})"
    return Fault(code, kind, step, tile, addr, loop, it, item, detail, f"{kind} at {where}: {what}")
