"""Static verification of a package: trust nothing the builder did (DESIGN §5).

`verify(pkg)` raises `PackageInvalid` naming the step, tile, address and
buffer of the first violation found, in this order:

1. structure (`check_structure`, also run before every simulation): step
   kinds, CSR ownership, Repeat BEGIN/END matched and nested with trips >= 1,
   tile and kernel ids, patch targets, loops and table lengths;
2. buffers: inside [memory_base, memory_end), address aligned to
   `device.alignment`, live range inside the program; no two buffers of a
   tile overlap in address while both are live (a live range that crosses a
   Repeat boundary counts as live for the whole loop);
3. patches: the driving loop encloses the patched item, the iteration-0 value
   equals the unpatched argument, tables sit inside a support buffer of their
   tile live over the whole loop, no two patches rewrite the same argument;
4. footprint: fp_code / fp_xtable / fp_support equal the bytes of buffers of
   those kinds; code and exchange-table buffers are big enough
   (`required_bytes`); every tensor buffer lies inside [fp_tensor_lo,
   fp_tensor_hi), fp_tensor = hi - lo, and code + xtable + support + tensor
   <= memory_size;
5. I/O blocks: slices inside the logical shape; input/parameter blocks inside a
   buffer live from step 0, output blocks inside a buffer live at the last
   step; outputs covered exactly (block volumes sum to the tensor size);
6. accesses, for EVERY Repeat iteration's patched values (jitted): each vertex
   operand region (`kernels.dispatch.vertex_regions`) and each transfer
   endpoint lies inside one tensor buffer (parameter, activation, scratch,
   exchange-landing) of its tile live at that step and starts
   on its natural alignment (`access.region_granule`); within a step no byte
   has two writers or a writer and a reader from different vertices/transfers.
"""

from __future__ import annotations

import numpy as np

from kernels.dtypes import DTYPE_BYTES, dtype_code
from kernels.exceptions import PackageInvalid
from kernels.registry import KERNELS
from simulator.access import find_buffer, region_span
from simulator.device import Device
from simulator.jit import sjit
from simulator.package import (
    BUF_CODE,
    BUF_SUPPORT,
    BUF_XTABLE,
    IO_DIMS,
    N_ARGS,
    PATCH_ARITH,
    PATCH_TABLE,
    PATCH_VERTEX_ARG,
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_KIND_NAMES,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TABLE_ENTRY_BYTES,
    TENSOR_KINDS,
    Package,
)
from simulator.verify_scan import (
    E_ALIGN_V,
    E_ALIGN_X,
    E_DST,
    E_KERNEL,
    E_RACE,
    E_REGION,
    E_ROWS,
    E_SRC,
    scan_accesses,
)

MAX_DEPTH = 32



def verify(pkg: Package) -> None:
    """Check every invariant listed in the module docstring; raise PackageInvalid."""
    check_structure(pkg)
    first, last = effective_live(pkg)
    _check_buffers(pkg, first, last)
    _check_patches(pkg, first, last)
    _check_footprint(pkg)
    _check_io(pkg, first, last)
    _check_accesses(pkg, first, last)


# ---- 1. structure ------------------------------------------------------------


def _fail_at(what: str, mask: np.ndarray, values: np.ndarray | None = None) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        shown = "" if values is None else f" (got {int(values[i])})"
        raise PackageInvalid(f"{what} at index {i}{shown}")


def item_steps(offsets: np.ndarray, n: int) -> np.ndarray:
    """Step index owning each of n CSR items."""
    return np.searchsorted(offsets, np.arange(n), side="right") - 1


def check_structure(pkg: Package) -> None:
    """What the engine relies on for memory safety: kinds, ownership, loops,
    tile/kernel ids, patch targets and table lengths.  Raises PackageInvalid."""
    a = pkg.arrays
    kind, trips, match = a["step_kind"], a["step_trips"], a["step_match"]
    _fail_at("step_kind: unknown step kind", (kind < 0) | (kind > STEP_REPEAT_END), kind)
    nv, nx = np.diff(a["step_vtx"]), np.diff(a["step_xfer"])
    _fail_at("step_vtx: a non-COMPUTE step owns vertices, step", (kind != STEP_COMPUTE) & (nv > 0))
    _fail_at("step_xfer: a non-EXCHANGE step owns transfers, step",
             (kind != STEP_EXCHANGE) & (nx > 0))
    begin = kind == STEP_REPEAT_BEGIN
    _fail_at("step_trips: REPEAT_BEGIN trips must be >= 1, step", begin & (trips < 1), trips)
    _fail_at("step_trips: must be 0 outside REPEAT_BEGIN, step", ~begin & (trips != 0), trips)
    stack: list[int] = []
    for s in np.flatnonzero(begin | (kind == STEP_REPEAT_END)).tolist():
        if kind[s] == STEP_REPEAT_BEGIN:
            stack.append(s)
            if len(stack) > MAX_DEPTH:
                raise PackageInvalid(f"step {s}: Repeat nesting deeper than {MAX_DEPTH}")
            continue
        if not stack:
            raise PackageInvalid(f"step {s}: REPEAT_END without an open REPEAT_BEGIN")
        b = stack.pop()
        if match[b] != s or match[s] != b:
            raise PackageInvalid(
                f"step {s}: REPEAT_END matches step_match {int(match[s])}, but the open "
                f"REPEAT_BEGIN is step {b} (its step_match {int(match[b])})"
            )
    if stack:
        raise PackageInvalid(f"step {stack[-1]}: REPEAT_BEGIN never closed")
    other = (kind == STEP_COMPUTE) | (kind == STEP_EXCHANGE)
    _fail_at("step_match: must be -1 on COMPUTE/EXCHANGE steps, step", other & (match != -1), match)
    tiles = pkg.tiles
    for name in ("v_tile", "x_src_tile", "x_dst_tile", "buf_tile", "io_tile"):
        _fail_at(f"{name}: tile outside [0, {tiles})", (a[name] < 0) | (a[name] >= tiles), a[name])
    known = np.array(sorted(KERNELS), dtype=np.int64)
    _fail_at("v_kernel: unknown kernel id, vertex", ~np.isin(a["v_kernel"], known), a["v_kernel"])
    _fail_at("x_bytes: transfer bytes must be >= 1, transfer", a["x_bytes"] < 1, a["x_bytes"])
    _check_patch_structure(pkg)


def _check_patch_structure(pkg: Package) -> None:
    a = pkg.arrays
    tgt, idx, arg, loop, mode = a["p_target"], a["p_index"], a["p_arg"], a["p_loop"], a["p_mode"]
    _fail_at("p_target: must be 0 (vertex), 1 (src) or 2 (dst), patch",
             (tgt < 0) | (tgt > 2), tgt)
    _fail_at("p_mode: must be 0 (arithmetic) or 1 (table), patch", (mode < 0) | (mode > 1), mode)
    is_v = tgt == PATCH_VERTEX_ARG
    limit = np.where(is_v, pkg.n_vertices, pkg.n_transfers)
    _fail_at("p_index: no such vertex/transfer, patch", (idx < 0) | (idx >= limit), idx)
    _fail_at("p_arg: vertex arg outside [0, 16), patch", is_v & ((arg < 0) | (arg >= N_ARGS)), arg)
    _fail_at("p_arg: must be 0 for a transfer patch, patch", ~is_v & (arg != 0), arg)
    steps = np.full(pkg.n_patches, -1, dtype=np.int64)
    steps[is_v] = item_steps(a["step_vtx"], pkg.n_vertices)[idx[is_v]]
    steps[~is_v] = item_steps(a["step_xfer"], pkg.n_transfers)[idx[~is_v]]
    ok_loop = (loop >= 0) & (loop < pkg.n_steps)
    safe = np.where(ok_loop, loop, 0)
    enclosing = ok_loop & (a["step_kind"][safe] == STEP_REPEAT_BEGIN)
    enclosing &= (safe < steps) & (steps < a["step_match"][safe])
    if (~enclosing).any():
        p = int(np.flatnonzero(~enclosing)[0])
        raise PackageInvalid(
            f"patch {p}: p_loop {int(loop[p])} is not a Repeat enclosing the patched "
            f"{'vertex' if is_v[p] else 'transfer'} {int(idx[p])} (step {int(steps[p])})"
        )
    tlen = np.diff(a["p_table"])
    want = np.where(mode == PATCH_TABLE, a["step_trips"][safe], 0)
    bad = tlen != want
    if bad.any():
        p = int(np.flatnonzero(bad)[0])
        raise PackageInvalid(
            f"patch {p}: table length {int(tlen[p])} != {int(want[p])} "
            f"({'trips of loop at step ' + str(int(loop[p])) if mode[p] else 'arithmetic'})"
        )


# ---- 2. buffers and liveness -----------------------------------------------------


def effective_live(pkg: Package) -> tuple[np.ndarray, np.ndarray]:
    """Live ranges [first, last] per buffer, widened to the whole loop (BEGIN..END)
    for every Repeat whose boundary the range crosses."""
    a = pkg.arrays
    first, last = a["buf_first"].copy(), a["buf_last"].copy()
    begins = np.flatnonzero(a["step_kind"] == STEP_REPEAT_BEGIN)
    ends = a["step_match"][begins]
    for _ in range(len(begins) + 1):
        changed = False
        for b, e in zip(begins.tolist(), ends.tolist(), strict=True):
            touches = (first <= e) & (last >= b)
            inside = (first > b) & (last < e)
            m = touches & ~inside & ((first > b) | (last < e))
            if m.any():
                first[m] = np.minimum(first[m], b)
                last[m] = np.maximum(last[m], e)
                changed = True
        if not changed:
            break
    return first, last


class BufferIndex:
    """Buffers of each tile sorted by address, for `access.find_buffer`."""

    def __init__(self, pkg: Package, first: np.ndarray, last: np.ndarray) -> None:
        a = pkg.arrays
        self.order = np.lexsort((a["buf_addr"], a["buf_tile"])).astype(np.int64)
        self.ptr = np.searchsorted(a["buf_tile"][self.order], np.arange(pkg.tiles + 1))
        self.ptr = self.ptr.astype(np.int64)
        self.addr = a["buf_addr"]
        self.end = a["buf_addr"] + a["buf_bytes"]
        self.first, self.last = first, last
        self.maxend = np.empty_like(self.order)
        _prefix_maxend(self.ptr, self.order, self.end, self.maxend)

    def args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                            np.ndarray, np.ndarray]:
        return (self.ptr, self.order, self.addr, self.end, self.first, self.last, self.maxend)


@sjit
def _prefix_maxend(ptr, order, end, out):  # type: ignore[no-untyped-def]
    for t in range(ptr.shape[0] - 1):
        m = np.int64(-1)
        for k in range(ptr[t], ptr[t + 1]):
            if end[order[k]] > m:
                m = end[order[k]]
            out[k] = m


@sjit
def _buffer_overlap(ptr, order, addr, end, first, last):  # type: ignore[no-untyped-def]
    """First pair of buffers of one tile overlapping in address and live range."""
    for t in range(ptr.shape[0] - 1):
        for i in range(ptr[t], ptr[t + 1]):
            bi = order[i]
            for j in range(i + 1, ptr[t + 1]):
                bj = order[j]
                if addr[bj] >= end[bi]:
                    break
                if first[bi] <= last[bj] and first[bj] <= last[bi]:
                    return bi, bj
    return -1, -1


def _check_buffers(pkg: Package, first: np.ndarray, last: np.ndarray) -> None:
    a, dev = pkg.arrays, pkg.device
    addr, nbytes = a["buf_addr"], a["buf_bytes"]
    checks = [
        ((a["buf_kind"] < 0) | (a["buf_kind"] > BUF_SUPPORT), "unknown buffer kind"),
        (nbytes < 1, "size must be >= 1 byte"),
        (addr < dev.memory_base, f"starts below memory base {dev.memory_base:#x}"),
        (addr + nbytes > dev.memory_end, f"ends past memory end {dev.memory_end:#x}"),
        (addr % dev.alignment != 0, f"address not aligned to {dev.alignment}"),
        ((a["buf_first"] < 0) | (a["buf_first"] > a["buf_last"])
         | (a["buf_last"] >= max(pkg.n_steps, 1)), "live range outside the program"),
    ]
    for mask, what in checks:
        if mask.any():
            b = int(np.flatnonzero(mask)[0])
            raise PackageInvalid(
                f"{pkg.buffer_label(b)}: {what} (live steps {int(a['buf_first'][b])}.."
                f"{int(a['buf_last'][b])})"
            )
    idx = BufferIndex(pkg, first, last)
    bi, bj = _buffer_overlap(idx.ptr, idx.order, idx.addr, idx.end, first, last)
    if bi >= 0:
        lo = max(int(addr[bi]), int(addr[bj]))
        s = max(int(first[bi]), int(first[bj]))
        raise PackageInvalid(
            f"tile {int(a['buf_tile'][bi])}: {pkg.buffer_label(bi)} and "
            f"{pkg.buffer_label(bj)} overlap at {lo:#x} while both live at step {s} "
            f"(live {int(first[bi])}..{int(last[bi])} and {int(first[bj])}..{int(last[bj])})"
        )


# ---- 3. patches ----------------------------------------------------------------------


def _check_patches(pkg: Package, first: np.ndarray, last: np.ndarray) -> None:
    a = pkg.arrays
    tgt, idx, arg = a["p_target"], a["p_index"], a["p_arg"]
    key = np.stack([tgt, idx, arg], axis=1)
    if pkg.n_patches:
        uniq, counts = np.unique(key, axis=0, return_counts=True)
        if (counts > 1).any():
            t, i, k = uniq[int(np.flatnonzero(counts > 1)[0])].tolist()
            raise PackageInvalid(f"patches: two patches rewrite target {t} item {i} arg {k}")
    idx_v = np.where(tgt == PATCH_VERTEX_ARG, idx, 0)
    idx_x = np.where(tgt == PATCH_VERTEX_ARG, 0, idx)
    unpatched = np.zeros(pkg.n_patches, dtype=np.int64)
    if pkg.n_vertices:
        unpatched = np.where(tgt == 0, a["v_args"][idx_v, arg], unpatched)
    if pkg.n_transfers:
        unpatched = np.where(tgt == 1, a["x_src_addr"][idx_x], unpatched)
        unpatched = np.where(tgt == 2, a["x_dst_addr"][idx_x], unpatched)
    tv = a["table_values"] if a["table_values"].size else np.zeros(1, dtype=np.int64)
    table0 = tv[np.minimum(a["p_table"][:-1], tv.size - 1)]  # all-arithmetic: no table values
    it0 = np.where(a["p_mode"] == PATCH_ARITH, a["p_base"], table0)
    bad = np.flatnonzero(it0 != unpatched)
    if bad.size:
        p = int(bad[0])
        raise PackageInvalid(
            f"patch {p} (target {int(tgt[p])} item {int(idx[p])} arg {int(arg[p])}): "
            f"iteration-0 value {int(it0[p])} != unpatched value {int(unpatched[p])}"
        )
    arith = a["p_mode"] == PATCH_ARITH
    bad = np.flatnonzero(arith & ((a["p_table_tile"] != -1) | (a["p_table_addr"] != -1)))
    if bad.size:
        raise PackageInvalid(f"patch {int(bad[0])}: arithmetic patch with a table location")
    bi = BufferIndex(pkg, first, last)
    tlen = np.diff(a["p_table"])
    for p in np.flatnonzero(~arith).tolist():
        tile, addr = int(a["p_table_tile"][p]), int(a["p_table_addr"][p])
        loop = int(a["p_loop"][p])
        end = addr + int(tlen[p]) * TABLE_ENTRY_BYTES
        ok = 0 <= tile < pkg.tiles
        b = -1
        if ok:
            b = int(find_buffer(tile, addr, end, loop, *bi.args()))
        if not ok or b < 0 or a["buf_kind"][b] != BUF_SUPPORT or last[b] < a["step_match"][loop]:
            raise PackageInvalid(
                f"patch {p}: table at tile {tile} {addr:#x}+{end - addr} is not inside a "
                f"support buffer live over loop steps {loop}..{int(a['step_match'][loop])}"
            )


# ---- 4. footprint --------------------------------------------------------------------


def required_bytes(dev: Device, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Minimum (code, exchange-table) bytes per tile (DESIGN §3).

    code = code_bytes_per_vertex × vertices on the tile + the kernel image
    (`KernelSpec.code_bytes`) of each distinct kernel the tile runs;
    exchange table = exchange_table_bytes_per_transfer × transfer endpoints on
    the tile (a transfer has one on its source and one on its destination).
    """
    code = np.zeros(dev.tiles, dtype=np.int64)
    np.add.at(code, arrays["v_tile"], dev.code_bytes_per_vertex)
    pairs = np.unique(np.stack([arrays["v_tile"], arrays["v_kernel"]], axis=1), axis=0)
    for tile, kid in pairs.tolist():
        spec = KERNELS.get(kid)
        if spec is not None:
            code[tile] += spec.code_bytes
    xt = np.zeros(dev.tiles, dtype=np.int64)
    np.add.at(xt, arrays["x_src_tile"], dev.exchange_table_bytes_per_transfer)
    np.add.at(xt, arrays["x_dst_tile"], dev.exchange_table_bytes_per_transfer)
    return code, xt


def _check_footprint(pkg: Package) -> None:
    a, dev = pkg.arrays, pkg.device
    sums = {}
    for key, kind in (("fp_code", BUF_CODE), ("fp_xtable", BUF_XTABLE),
                      ("fp_support", BUF_SUPPORT)):
        s = np.zeros(pkg.tiles, dtype=np.int64)
        m = a["buf_kind"] == kind
        np.add.at(s, a["buf_tile"][m], a["buf_bytes"][m])
        sums[key] = s
        bad = np.flatnonzero(s != a[key])
        if bad.size:
            t = int(bad[0])
            raise PackageInvalid(
                f"tile {t}: {key} = {int(a[key][t])} but its {key[3:]} buffers hold {int(s[t])}"
            )
    code, xt = required_bytes(dev, a)
    for key, need in (("fp_code", code), ("fp_xtable", xt)):
        bad = np.flatnonzero(a[key] < need)
        if bad.size:
            t = int(bad[0])
            raise PackageInvalid(f"tile {t}: {key} = {int(a[key][t])} < {int(need[t])} required")
    lo, hi = a["fp_tensor_lo"], a["fp_tensor_hi"]
    bad = np.flatnonzero((lo < dev.memory_base) | (lo > hi) | (hi > dev.memory_end)
                         | (a["fp_tensor"] != hi - lo))
    if bad.size:
        t = int(bad[0])
        raise PackageInvalid(
            f"tile {t}: tensor range {int(lo[t]):#x}..{int(hi[t]):#x} with fp_tensor "
            f"{int(a['fp_tensor'][t])} (must lie in memory and equal hi - lo)"
        )
    tens = np.isin(a["buf_kind"], TENSOR_KINDS)
    bt = a["buf_tile"]
    outside = tens & ((a["buf_addr"] < lo[bt]) | (a["buf_addr"] + a["buf_bytes"] > hi[bt]))
    if outside.any():
        b = int(np.flatnonzero(outside)[0])
        t = int(bt[b])
        raise PackageInvalid(
            f"tile {t}: {pkg.buffer_label(b)} lies outside the tensor range "
            f"{int(lo[t]):#x}..{int(hi[t]):#x}"
        )
    total = a["fp_code"] + a["fp_xtable"] + a["fp_support"] + a["fp_tensor"]
    bad = np.flatnonzero(total > dev.memory_size)
    if bad.size:
        t = int(bad[0])
        raise PackageInvalid(
            f"tile {t}: footprint {int(total[t])} bytes (code {int(a['fp_code'][t])}, "
            f"xtable {int(a['fp_xtable'][t])}, support {int(a['fp_support'][t])}, tensor "
            f"{int(a['fp_tensor'][t])}) exceeds memory_size {dev.memory_size}"
        )


# ---- 5. I/O map --------------------------------------------------------------------


def io_block_span(pkg: Package, i: int) -> tuple[int, int]:
    """[lo, hi) bytes of io block i in tile memory."""
    a = pkg.arrays
    ext = a["io_hi"][i] - a["io_lo"][i]
    esize = DTYPE_BYTES[dtype_code(pkg.io[int(a["io_tensor"][i])].dtype)]
    reg = np.array([a["io_addr"][i], ext[0], a["io_ld0"][i], ext[1], a["io_ld1"][i],
                    ext[2] * esize, 0], dtype=np.int64)
    lo, hi = region_span(reg)
    return int(lo), int(hi)


def _check_io(pkg: Package, first: np.ndarray, last: np.ndarray) -> None:
    a = pkg.arrays
    bi = BufferIndex(pkg, first, last)
    end_step = max(pkg.n_steps - 1, 0)
    volume = np.zeros(len(pkg.io), dtype=np.int64)
    for i in range(a["io_tensor"].shape[0]):
        t = pkg.io[int(a["io_tensor"][i])]
        shape = (1,) * (IO_DIMS - len(t.shape)) + t.shape
        lo, hi = a["io_lo"][i], a["io_hi"][i]
        if (lo < 0).any() or (hi <= lo).any() or (hi > np.array(shape)).any():
            raise PackageInvalid(
                f"io block {i} of {t.name!r}: slice {lo.tolist()}..{hi.tolist()} "
                f"outside shape {list(shape)}"
            )
        volume[int(a["io_tensor"][i])] += int(np.prod(hi - lo))
        s0, s1 = io_block_span(pkg, i)
        step = end_step if t.role == "output" else 0
        tile = int(a["io_tile"][i])
        b = int(find_buffer(tile, s0, s1, step, *bi.args()))
        if b < 0 or (t.role != "output" and first[b] != 0):
            raise PackageInvalid(
                f"io block {i} of {t.name!r} ({t.role}): tile {tile} {s0:#x}..{s1:#x} is "
                f"not inside a buffer live at step {step}"
            )
    for k, t in enumerate(pkg.io):
        size = int(np.prod(t.shape))
        if (t.role == "output" and volume[k] != size) or volume[k] < size:
            raise PackageInvalid(
                f"io tensor {t.name!r} ({t.role}): blocks cover {int(volume[k])} of {size} "
                f"elements" + (" (outputs must be covered exactly once)" if t.role == "output"
                               else "")
            )


# ---- 6. accesses for every iteration ---------------------------------------------


def patch_index(pkg: Package) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CSR of patch ids per vertex (vp_ptr, vp_list) and per transfer (xp_ptr, xp_list)."""
    a = pkg.arrays
    out = []
    for is_v, n in ((True, pkg.n_vertices), (False, pkg.n_transfers)):
        sel = (a["p_target"] == PATCH_VERTEX_ARG) if is_v else (a["p_target"] != 0)
        ids = np.flatnonzero(sel)
        ids = ids[np.argsort(a["p_index"][ids], kind="stable")].astype(np.int64)
        ptr = np.searchsorted(a["p_index"][ids], np.arange(n + 1)).astype(np.int64)
        out += [ptr, ids]
    return out[0], out[1], out[2], out[3]


def _check_accesses(pkg: Package, first: np.ndarray, last: np.ndarray) -> None:
    a = pkg.arrays
    vp_ptr, vp_list, xp_ptr, xp_list = patch_index(pkg)
    # vertices and transfers touch tensor buffers only: code, exchange-table and
    # support memory never count as live for them (the engine's image has none)
    tensor = np.isin(a["buf_kind"], TENSOR_KINDS)
    bi = BufferIndex(pkg, np.where(tensor, first, np.iinfo(np.int64).max),
                     np.where(tensor, last, -1))
    err = np.zeros(9, dtype=np.int64)
    code = scan_accesses(
        a["step_kind"], a["step_vtx"], a["step_xfer"], a["step_trips"],
        a["v_tile"], a["v_kernel"], a["v_args"],
        a["x_src_tile"], a["x_src_addr"], a["x_dst_tile"], a["x_dst_addr"], a["x_bytes"],
        vp_ptr, vp_list, xp_ptr, xp_list,
        a["p_target"], a["p_arg"], a["p_loop"], a["p_mode"], a["p_base"], a["p_stride"],
        a["p_table"], a["table_values"], *bi.args(), err,
    )
    if code == 0:
        return
    step, tile, addr, item, loop, it, other, nb = (int(v) for v in err[1:])
    kind = STEP_KIND_NAMES[int(a["step_kind"][step])]
    where = f"step {step} ({kind}), tile {tile}, address {addr:#x}"
    if loop >= 0:
        where += f", iteration {it} of loop at step {loop}"
    V = pkg.n_vertices

    def who(k: int) -> str:
        return f"vertex {k} (kernel {int(a['v_kernel'][k])})" if k < V else f"transfer {k - V}"

    msgs = {
        E_REGION: f"{who(item)} operand region of {nb} bytes is not inside one buffer live "
                  f"at this step",
        E_SRC: f"{who(item + V)} source ({nb} bytes) is not inside one buffer live at this step",
        E_DST: f"{who(item + V)} destination ({nb} bytes) is not inside one buffer live at "
               f"this step",
        E_RACE: f"race: {who(other)} and {who(item)} touch the same byte and one of them writes",
        E_KERNEL: f"{who(item)}: kernel has no region description",
        E_ALIGN_V: f"{who(item)} operand misaligned (natural alignment {nb})",
        E_ALIGN_X: f"{who(item + V)} endpoint misaligned (natural alignment {nb})",
        E_ROWS: f"{who(item)} operand region has {nb} rows, more than its buffer has bytes",
    }
    raise PackageInvalid(f"{where}: {msgs[code]}")
