"""The cycles of one vertex call from its named arguments: `kernel_cycles`.

One cost model, three entry points: the simulator runs every vertex of a
package through `kernels.dispatch.vertex_cost`; `kernel_cycles` (Python) and
`tileplan cost` (CLI) price one call the same way, and the planner's catalogue
prices its recipes through `kernel_cycles` too.

`call_args(device, kernel, **named)` builds the int64 argument vector of
contracts §2 from argument names: extents (`M`, `K`, `N`, `k`, `batch`,
`rows`, `row_bytes`, ...), dtypes by name (`"fp8"`, `"fp16"`, `"fp32"`) or
code, and flags.  What is not given gets a default: dtypes as the planner uses
them (MATMUL fp8 -> fp16, vector kernels fp16, CAST fp16 -> fp8), row strides
dense, and every operand its own memory elements (no conflict penalty; pass
addresses to place operands yourself).  Pseudo-arguments: `bias=1` gives a
MATMUL / REDUCE a bias operand, `broadcast=1` makes ADD's b one row read by
every row, `transpose_b=1` / `accumulate=1` set the MATMUL flags, `gate=1`
gives GELU its gate operand b (the gated MLP).  An unknown
kernel or argument raises ValueError naming the choices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels import abi, dispatch
from kernels.registry import by_name
from simulator.device import Device

DTYPE_CODES = {name: code for code, name in enumerate(abi.DTYPE_NAMES)}
DTYPE_BYTES = dict(enumerate(abi.DTYPE_BYTES))
PSEUDO = ("bias", "broadcast", "transpose_b", "accumulate", "gate")
_DEFAULT_DTYPES = {
    "MATMUL": {"in_dtype": 0, "out_dtype": 1},
    "BATCH_MATMUL": {"in_dtype": 0, "out_dtype": 1},
    "REDUCE": {"out_dtype": 1},
    "ADD": {"dtype_a": 1, "dtype_b": 1, "dtype_c": 1},
    "BIAS_ADD": {"dtype_x": 1, "dtype_y": 1},
    "SOFTMAX": {"dtype_x": 1, "dtype_y": 1},
    "CAST": {"dtype_x": 1, "dtype_y": 0},
    "ROPE": {"dtype_t": 1},
    "TRANSPOSE": {"elem_bytes": 2},
}
_FLOAT_DEFAULTS: dict[str, dict[str, float]] = {"LAYERNORM": {"eps": 1e-6},
                                                "RMSNORM": {"eps": 1e-6},
                                                "SOFTMAX": {"scale": 1.0}}


def _code(kernel: str, name: str, value: Any) -> int:
    if isinstance(value, str):
        if value not in DTYPE_CODES:
            raise ValueError(f"kernel {kernel}: {name}={value!r}: dtype must be one of "
                             f"{sorted(DTYPE_CODES)}")
        return DTYPE_CODES[value]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"kernel {kernel}: {name}={value!r} must be an integer")
    return int(value)


def _operands(kernel: str, v: dict[str, int], pseudo: dict[str, int]) -> list[tuple[str, int]]:
    """(address arg, bytes) of each operand, and sets dense strides in `v`."""
    def eb(k: str) -> int:
        return DTYPE_BYTES.get(v.get(k, 1), 4)

    m, n = max(v.get("M", 1), 1), max(v.get("N", 1), 1)
    if kernel in ("MATMUL", "BATCH_MATMUL"):
        k, ib, ob = max(v.get("K", 1), 1), eb("in_dtype"), eb("out_dtype")
        trans = v.get("flags", 0) & abi.FLAG_TRANS_B
        v.setdefault("lda", k * ib)
        v.setdefault("ldb", (k if trans else n) * ib)
        v.setdefault("ldc", n * ob)
        batch = max(v.get("batch", 1), 1) if kernel == "BATCH_MATMUL" else 1
        if kernel == "BATCH_MATMUL":
            v.setdefault("batch_stride_a", m * k * ib)
            v.setdefault("batch_stride_b", k * n * ib)
            v.setdefault("batch_stride_c", m * n * ob)
        ops = [("a", batch * m * k * ib), ("b", batch * k * n * ib), ("c", batch * m * n * ob)]
        if kernel == "MATMUL" and pseudo.get("bias"):
            ops.append(("bias", n * 2))
        return ops
    if kernel == "REDUCE":
        parts = max(v.get("k", 1), 1)
        pb = 2 if v.get("parts_fp16") else 4
        v.setdefault("ld_parts", n * pb)
        v.setdefault("part_stride", m * n * pb)
        v.setdefault("ldo", n * eb("out_dtype"))
        ops = [("parts", parts * m * n * pb), ("out", m * n * eb("out_dtype"))]
        if pseudo.get("bias"):
            ops.append(("bias", n * 2))
        return ops
    if kernel == "ADD":
        v.setdefault("lda", n * eb("dtype_a"))
        v.setdefault("ldb", 0 if pseudo.get("broadcast") else n * eb("dtype_b"))
        v.setdefault("ldc", n * eb("dtype_c"))
        return [("a", m * n * eb("dtype_a")), ("b", m * n * eb("dtype_b")),
                ("c", m * n * eb("dtype_c"))]
    if kernel == "BIAS_ADD":
        v.setdefault("ldx", n * eb("dtype_x"))
        v.setdefault("ldy", n * eb("dtype_y"))
        return [("x", m * n * eb("dtype_x")), ("bias", n * 2), ("y", m * n * eb("dtype_y"))]
    if kernel == "LAYERNORM":
        v.setdefault("ldx", n * 2)
        v.setdefault("ldy", n * 2)
        return [("x", m * n * 2), ("gamma", n * 2), ("beta", n * 2), ("y", m * n * 2)]
    if kernel == "GELU":
        v.setdefault("ldx", n * 2)
        v.setdefault("ldy", n * 2)
        ops = [("x", m * n * 2), ("y", m * n * 2)]
        if pseudo.get("gate"):
            v.setdefault("ldb", n * 2)
            ops.append(("b", m * n * 2))
        return ops
    if kernel == "RMSNORM":
        v.setdefault("ldx", n * 2)
        v.setdefault("ldy", n * 2)
        return [("x", m * n * 2), ("gamma", n * 2), ("y", m * n * 2)]
    if kernel == "ROPE":
        hd = max(v.setdefault("head_dim", n), 2)
        tb = hd // 2 * eb("dtype_t")
        v.setdefault("ldx", n * 2)
        v.setdefault("ldy", n * 2)
        v.setdefault("ldt", tb)
        return [("x", m * n * 2), ("cos", m * tb), ("sin", m * tb), ("y", m * n * 2)]
    if kernel in ("SOFTMAX", "CAST"):
        v.setdefault("ldx", n * eb("dtype_x"))
        v.setdefault("ldy", n * eb("dtype_y"))
        return [("x", m * n * eb("dtype_x")), ("y", m * n * eb("dtype_y"))]
    if kernel == "COPY":
        rows, nb = max(v.get("rows", 1), 1), max(v.get("row_bytes", 1), 1)
        v.setdefault("lds", nb)
        v.setdefault("ldd", nb)
        return [("src", rows * nb), ("dst", rows * nb)]
    if kernel == "TRANSPOSE":
        e = max(v.get("elem_bytes", 2), 1)
        v.setdefault("lds", n * e)
        v.setdefault("ldd", m * e)
        return [("src", m * n * e), ("dst", m * n * e)]
    raise ValueError(f"unknown kernel {kernel!r}")


def call_args(device: Device, kernel: str, **named: Any) -> np.ndarray:
    """int64[N_ARGS] arguments of one `kernel` call (module docstring)."""
    spec = by_name(kernel)
    known = set(spec.arg_names) | set(PSEUDO)
    for key in sorted(named):
        if key not in known:
            raise ValueError(f"kernel {kernel}: unknown argument {key!r}; expected one of "
                             f"{list(dict.fromkeys([*spec.arg_names, *PSEUDO]))}")
    # bias=0/1 says whether there is one; a larger value is its address
    pseudo = {k: _code(kernel, k, named.pop(k)) for k in PSEUDO
              if k in named and not (k == "bias" and named[k] not in (0, 1, True, False))}
    if kernel not in ("MATMUL", "REDUCE"):
        pseudo.pop("bias", None)
    floats: dict[str, Any] = {k: named.pop(k) for k in ("eps", "scale") if k in named}
    v = {k: _code(kernel, k, val) for k, val in named.items()}
    for k, val in _DEFAULT_DTYPES.get(kernel, {}).items():
        v.setdefault(k, val)
    for k in SIZE_ARGS:  # an extent not given is 1
        if k in spec.arg_names:
            v.setdefault(k, 1)
    if kernel == "MATMUL":
        flags = v.get("flags", 0)
        if pseudo.get("transpose_b"):
            flags |= abi.FLAG_TRANS_B
        if pseudo.get("accumulate"):
            flags |= abi.FLAG_ACCUMULATE
        v["flags"] = flags
    if kernel == "BATCH_MATMUL" and pseudo.get("transpose_b"):
        v["flags"] = v.get("flags", 0) | abi.FLAG_TRANS_B
    # every operand starts on its own element, after the previous one
    slot = 0
    for addr, nbytes in _operands(kernel, v, pseudo):
        if addr not in v:
            v[addr] = device.memory_base + slot * device.element_bytes
        slot += max(1, -(-nbytes // device.element_bytes))
    for k, fv in _FLOAT_DEFAULTS.get(kernel, {}).items():
        floats.setdefault(k, fv)
    return spec.make_args(**v, **{k: float(x) for k, x in floats.items()})


# extents a call may leave out (1 each)
SIZE_ARGS = ("M", "K", "N", "k", "batch", "rows", "row_bytes")
# what a user may call the extents of a call (measurement files say R, K, C)
ALIASES = {"R": "M", "C": "N"}
# no argument of a call that fits a tile exceeds this (extents, strides, addresses)
MAX_ARG = 1 << 40


def checked_call(device: Device, kernel: str, **named: Any
                 ) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(kernel name, arguments by name as the kernel spells them, defaults
    filled in) of one call, validated as the
    simulator validates a vertex: the kernel name case-insensitively,
    R/C as M/N, every number finite and within MAX_ARG, the kernel's own
    argument check (kernels.dispatch.vertex_check) and every operand region
    inside the tile's memory.  ValueError names what is wrong."""
    from kernels import status
    from kernels.registry import KERNELS

    names = {s.name.lower(): s.name for s in KERNELS.values()}
    if kernel.lower() not in names:
        raise ValueError(f"unknown kernel {kernel!r}; known: {sorted(names.values())}")
    kernel = names[kernel.lower()]
    spec = by_name(kernel)
    given: dict[str, Any] = {}
    for key, value in named.items():
        key = ALIASES.get(key, key) if ALIASES.get(key) in spec.arg_names else key
        if key in given:
            raise ValueError(f"kernel {kernel}: {key} given twice")
        if isinstance(value, float) and not np.isfinite(value):
            raise ValueError(f"kernel {kernel}: {key}={value} is not finite")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ARG:
            raise ValueError(f"kernel {kernel}: {key}={value} is beyond any tile "
                             f"(|value| <= {MAX_ARG})")
        given[key] = value
    args = call_args(device, kernel, **given)
    raw = {k: int(args[i]) for i, k in enumerate(spec.arg_names)
           if k not in given and (k in _DEFAULT_DTYPES.get(kernel, {}) or k in SIZE_ARGS
                                  or k in _FLOAT_DEFAULTS.get(kernel, {}))}
    dtype_arg = ("dtype", "in_dtype", "out_dtype")
    defaults: dict[str, Any] = {
        k: (abi.DTYPE_NAMES[v] if k.startswith(dtype_arg) and 0 <= v < len(abi.DTYPE_NAMES)
            else _FLOAT_DEFAULTS.get(kernel, {}).get(k, v)) for k, v in raw.items()}
    st = int(dispatch.vertex_check(spec.id, args))
    if st != status.OK:
        raise ValueError(f"kernel {kernel}: the kernel's argument check fails: "
                         f"{status.describe(st)}")
    regions = np.zeros((abi.MAX_REGIONS, abi.REGION_COLS), dtype=np.int64)
    n = int(dispatch.vertex_regions(spec.id, args, regions))
    lo, hi = device.memory_base, device.memory_end
    for addr, outer, ostride, rows, ld, row_bytes, _ in regions[:n].tolist():
        start = addr
        end = addr + (outer - 1) * ostride + (rows - 1) * ld + row_bytes
        if start < lo or end > hi:
            arg = next((k for k in spec.arg_names if args[spec.arg_names.index(k)] == addr),
                       "an operand")
            raise ValueError(f"kernel {kernel}: operand {arg} spans [{start:#x}, {end:#x}), "
                             f"outside the tile's memory [{lo:#x}, {hi:#x})")
    return kernel, given, defaults


def kernel_cycles(device: Device, kernel: str, **named: Any) -> int:
    """Modelled cycles of one `kernel` call on `device` (module docstring)."""
    args = call_args(device, kernel, **named)
    desc = device.tile_desc().as_array()
    return int(dispatch.vertex_cycles(by_name(kernel).id, args, desc))


def call_parts(device: Device, kernel: str, **named: Any) -> tuple[int, int, bool]:
    """(call, work, conflict) of one call: its fixed cost, its work cycles
    before any conflict penalty, and whether two operands share an element."""
    args = call_args(device, kernel, **named)
    desc = device.tile_desc().as_array()
    kid = by_name(kernel).id
    call, work = dispatch.vertex_call_work(kid, args, desc)
    return int(call), int(work), bool(dispatch.vertex_conflict(kid, args, desc))
