"""Python side of a simulation: memory image, inputs, engine, outputs (DESIGN §5).

`run(pkg, params, inputs, numerics, engine)`:

1. checks the package's structure (`verify.check_structure`; the full static
   `verify` is separate and not repeated here);
2. with `numerics=True`, builds one uint8 image row per tile that holds a
   buffer (full `memory_size`, allocated zeroed and lazily by the OS) and
   writes every input/parameter block of the I/O map: the logical float32
   slice is divided by 2**scale_exp and encoded to the block's dtype
   (kernels.dtypes), rows placed at `addr + a*ld0 + b*ld1`;
3. runs the chosen engine (only "numba" for now; an engine is a function
   `(pkg, MemoryImage | None) -> EngineOutput`);
4. reads each output's blocks back, decodes them and multiplies by
   2**scale_exp into a float32 array of the logical shape.  An output byte that
   was never written is a fault (F_OUTPUT) and its element reads as NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from kernels.dtypes import DTYPE_BYTES, dtype_code, fp8_decode, fp8_encode, fp16_decode, fp16_encode
from kernels.exceptions import SimulationFault
from simulator.engine import (
    F_OUTPUT,
    F_RACE,
    FAULT_NAMES,
    EngineOutput,
    MemoryImage,
    execute,
)
from simulator.package import IO_DIMS, STEP_COMPUTE, STEP_KIND_NAMES, IoTensor, Package
from simulator.verify import check_structure

EngineFn = Callable[[Package, MemoryImage | None], EngineOutput]
ENGINES: dict[str, EngineFn] = {"numba": execute}


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
    tile_bytes_out: np.ndarray  # int64 [tiles], multicast counted once per step
    outputs: dict[str, np.ndarray]  # logical float32 arrays (empty without numerics)
    faults: tuple[Fault, ...]  # at most engine.MAX_FAULTS (+ output faults)
    n_faults: int  # all faults, including those not kept
    vertex_invocations: int
    clock_hz: float

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
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; engines: {sorted(ENGINES)}")
    check_structure(pkg)
    image = None
    if numerics:
        image = build_image(pkg, dict(params or {}), dict(inputs or {}))
    out = ENGINES[engine](pkg, image)
    faults = [describe_fault(pkg, row) for row in out.faults]
    outputs: dict[str, np.ndarray] = {}
    n_faults = out.n_faults
    if image is not None:
        for t in pkg.io:
            if t.role == "output":
                arr, bad = read_output(pkg, image, t)
                outputs[t.name] = arr
                faults += bad
                n_faults += len(bad)
    return SimResult(
        cycles=out.cycles, cycles_per_step=out.cycles_per_step, tile_busy=out.tile_busy,
        tile_bytes_in=out.tile_bytes_in, tile_bytes_out=out.tile_bytes_out, outputs=outputs,
        faults=tuple(faults), n_faults=n_faults, vertex_invocations=out.vertex_invocations,
        clock_hz=pkg.device.clock_hz,
    )


# ---- memory image ----------------------------------------------------------------


def build_image(pkg: Package, params: dict[str, np.ndarray],
                inputs: dict[str, np.ndarray]) -> MemoryImage:
    """Zeroed image rows for every tile holding a buffer, with params/inputs written."""
    given = {"parameter": params, "input": inputs}
    wanted = {role: {t.name for t in pkg.io if t.role == role} for role in given}
    for role, values in given.items():
        unknown = sorted(set(values) - wanted[role])
        if unknown:
            raise ValueError(f"unknown {role}(s) {unknown}; the package has {sorted(wanted[role])}")
    tiles = np.unique(pkg.arrays["buf_tile"])
    tile_row = np.full(pkg.tiles, -1, dtype=np.int64)
    tile_row[tiles] = np.arange(tiles.size)
    size = pkg.device.memory_size
    image = MemoryImage(np.zeros((tiles.size, size), np.uint8),
                        np.zeros((tiles.size, size), np.uint8), tile_row)
    for k, t in enumerate(pkg.io):
        if t.role == "output":
            continue
        if t.name not in given[t.role]:
            raise ValueError(f"{t.role} {t.name!r} missing (numerics=True needs every "
                             f"input and parameter)")
        x = np.asarray(given[t.role][t.name], dtype=np.float32)
        if x.shape != t.shape:
            raise ValueError(f"{t.role} {t.name!r}: shape {x.shape}, package expects {t.shape}")
        codes = _encode(x.reshape(_padded(t.shape)) * np.float32(2.0 ** -t.scale_exp), t.dtype)
        for i in np.flatnonzero(pkg.arrays["io_tensor"] == k).tolist():
            row, idx, sl = _block_index(pkg, image, i, t)
            image.mem[row, idx] = codes[sl].reshape(-1)
            image.written[row, idx] = 1
    return image


def read_output(pkg: Package, image: MemoryImage, t: IoTensor) -> tuple[np.ndarray, list[Fault]]:
    """Assemble output `t` from its blocks; unwritten bytes become F_OUTPUT faults."""
    out = np.full(_padded(t.shape), np.nan, dtype=np.float32)
    faults: list[Fault] = []
    k = pkg.io_index(t.name)
    for i in np.flatnonzero(pkg.arrays["io_tensor"] == k).tolist():
        row, idx, sl = _block_index(pkg, image, i, t)
        unwritten = np.flatnonzero(image.written[row, idx] == 0)
        if unwritten.size:
            addr = int(idx[unwritten[0]]) + pkg.device.memory_base
            tile = int(pkg.arrays["io_tile"][i])
            row_fault = np.array([F_OUTPUT, max(pkg.n_steps - 1, 0), tile, addr, -1, 0, i,
                                  unwritten.size], dtype=np.int64)
            faults.append(describe_fault(pkg, row_fault, output=t.name))
        raw = image.mem[row, idx]
        shape = tuple(int(v) for v in pkg.arrays["io_hi"][i] - pkg.arrays["io_lo"][i])
        vals = _decode(raw, t.dtype).reshape(shape) * np.float32(2.0 ** t.scale_exp)
        if unwritten.size:  # elements with an unwritten byte are NaN, never a stale value
            missing = (image.written[row, idx] == 0).reshape(*shape, -1).any(axis=-1)
            vals[missing] = np.nan
        out[sl] = vals
    return out.reshape(t.shape), faults


def _padded(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (IO_DIMS - len(shape)) + shape


def _block_index(pkg: Package, image: MemoryImage, i: int,
                 t: IoTensor) -> tuple[int, np.ndarray, tuple[slice, ...]]:
    """(image row, byte offsets of block i in row order, logical slice)."""
    a = pkg.arrays
    tile = int(a["io_tile"][i])
    row = int(image.tile_row[tile])
    lo, hi = a["io_lo"][i], a["io_hi"][i]
    ext = hi - lo
    esize = DTYPE_BYTES[dtype_code(t.dtype)]
    off = int(a["io_addr"][i]) - pkg.device.memory_base
    idx = (off + np.arange(ext[0])[:, None, None] * int(a["io_ld0"][i])
           + np.arange(ext[1])[None, :, None] * int(a["io_ld1"][i])
           + np.arange(ext[2] * esize)[None, None, :]).reshape(-1)
    if row < 0 or idx.size == 0 or idx.min() < 0 or idx.max() >= pkg.device.memory_size:
        raise ValueError(f"io block {i} of {t.name!r}: tile {tile} address "
                         f"{int(a['io_addr'][i]):#x} is outside the tile's buffers "
                         f"(run simulator.verify)")
    sl = tuple(slice(int(lo[d]), int(hi[d])) for d in range(IO_DIMS))
    return row, idx, sl


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
    else:
        what = f"{who(item)} (detail {detail})"
    return Fault(code, kind, step, tile, addr, loop, it, item, detail, f"{kind} at {where}: {what}")
