"""Static verification of a package: trust nothing the builder did.

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
6. accesses, for EVERY Repeat iteration's patched values (jitted,
   simulator/verify_scan.py): each vertex operand region
   (`kernels.dispatch.vertex_regions`) and each transfer endpoint lies inside
   one tensor buffer (parameter, activation, scratch, exchange-landing) of its
   tile live at that step and starts on its natural alignment
   (`access.region_granule`); within a step no byte has two writers or a
   writer and a reader from different vertices/transfers;
7. the exchange schedule (`simulator.xschedule`): each send's bytes covered
   exactly once by its pieces, no send lane and no receive port booked twice
   at once, every booking over by the step's `step_xcycles`.
"""

from __future__ import annotations

import threading

import numpy as np

from kernels import status
from kernels.abi import (
    BUF_CODE,
    BUF_SUPPORT,
    BUF_XTABLE,
    IO_DIMS,
    MAX_REPEAT_DEPTH,
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
)
from kernels.dtypes import DTYPE_BYTES, dtype_code
from kernels.registry import KERNELS
from simulator.access import R_LEN, BufferIndex, find_buffers
from simulator.device import Device
from simulator.footprint import code_bytes, follows_previous, xtable_bytes
from simulator.package import Package, per_package
from simulator.verify_scan import (
    E_ALIGN_V,
    E_ALIGN_X,
    E_ARGS,
    E_DST,
    E_KERNEL,
    E_RACE,
    E_REGION,
    E_ROWS,
    E_SRC,
    PT_LEN,
    TS_LEN,
    VS_LEN,
    XS_LEN,
    scan_accesses,
)
from simulator.xschedule import (
    V_NONE,
    describe,
    package_leaders,
    repeated_members,
    source_patches,
    violations,
)
from tilecommon.errors import PackageInvalid
from tilecommon.jit import kjit


def verify(pkg: Package) -> None:
    """Check every invariant listed in the module docstring; raise PackageInvalid."""
    check_structure(pkg)
    first, last = effective_live(pkg)
    idx = _check_buffers(pkg, first, last)
    _check_patches(pkg, idx)
    _check_io(pkg, access_index(pkg, idx))
    _check_accesses(pkg, idx)
    _check_footprint(pkg)  # after the accesses: an overrun is named as one, not by its table
    _check_schedule(pkg)


def _check_schedule(pkg: Package) -> None:
    """7. The exchange schedule (simulator.xschedule): the transfers of a send
    share source tile, address, bytes and patch and land on distinct tiles;
    every send's bytes covered once by its pieces, no lane or port booked
    twice at once, every booking over by its step's `step_xcycles`."""
    a = pkg.arrays
    lead = a["x_send"]
    patch = source_patches(a)
    # a member shares its leader's source (tile, address, bytes and patch)
    other = np.zeros(lead.size, dtype=bool)
    for key in (a["x_src_tile"], a["x_src_addr"], a["x_bytes"], patch):
        other |= key[lead] != key
    _fail_at("x_send: a transfer shares a send with a transfer of another source, "
             "transfer", other, lead)
    rep = repeated_members(a["step_xfer"], lead, a["x_dst_tile"], pkg.tiles)
    if rep is not None:
        raise PackageInvalid(
            f"x_send: two transfers of the send led by transfer {rep[0]} land on tile {rep[1]}")
    bad = schedule_violations(pkg)
    steps = np.flatnonzero(bad[:, 0] != V_NONE)
    if steps.size:
        s = int(steps[0])
        raise PackageInvalid(describe(bad[s], s))


# ---- 1. structure ------------------------------------------------------------


@per_package
def schedule_violations(pkg: Package) -> np.ndarray:
    """`simulator.xschedule.violations` of a package (once per package)."""
    return violations(pkg.device, pkg.arrays)


def _fail_at(what: str, mask: np.ndarray, values: np.ndarray | None = None) -> None:
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        shown = "" if values is None else f" (got {int(values[i])})"
        raise PackageInvalid(f"{what} at index {i}{shown}")


def item_steps(offsets: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Step index owning each of the CSR items `items` (indices into the items)."""
    return np.searchsorted(offsets, items, side="right") - 1


@per_package
def check_structure(pkg: Package) -> None:
    """What the engine relies on for memory safety: kinds, ownership, loops,
    tile/kernel ids, patch targets and table lengths.  Raises PackageInvalid
    (checked once per package object: `per_package`)."""
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
            if len(stack) > MAX_REPEAT_DEPTH:
                raise PackageInvalid(f"step {s}: Repeat nesting deeper than {MAX_REPEAT_DEPTH}")
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
    _check_schedule_structure(pkg)


def _check_schedule_structure(pkg: Package) -> None:
    """The exchange schedule's indices (simulator.xschedule): each transfer's
    send is a leader of its own step; pieces belong to EXCHANGE steps and
    name a send of their step (what a send may group: `_check_schedule`)."""
    a = pkg.arrays
    kind, xptr, pptr = a["step_kind"], a["step_xfer"], a["step_piece"]
    npc = np.diff(pptr)
    _fail_at("step_piece: a non-EXCHANGE step owns schedule pieces, step",
             (kind != STEP_EXCHANGE) & (npc > 0))
    _fail_at("step_xcycles: must be 0 outside EXCHANGE steps, step",
             (kind != STEP_EXCHANGE) & (a["step_xcycles"] != 0), a["step_xcycles"])
    lead = a["x_send"]
    n = lead.size
    x_step = item_steps(xptr, np.arange(n))
    _fail_at("x_send: the send of a transfer is not a leader (x_send[l] == l) of its step, "
             "transfer", (x_step[lead] != x_step) | (lead[lead] != lead), lead)
    q_step = item_steps(pptr, np.arange(a["q_send"].size))
    qs = a["q_send"]
    _fail_at("q_send: a piece names a transfer that is not a send of its step, piece",
             (x_step[qs] != q_step) | (lead[qs] != qs), qs)


def _check_patch_structure(pkg: Package) -> None:
    a = pkg.arrays
    tgt, idx, arg, loop, mode = a["p_target"], a["p_index"], a["p_arg"], a["p_loop"], a["p_mode"]
    _fail_at("p_target: must be 0 (vertex), 1 (src) or 2 (dst), patch",
             (tgt < 0) | (tgt > 2), tgt)
    _fail_at("p_mode: must be 0 (arithmetic) or 1 (table), patch", (mode < 0) | (mode > 1), mode)
    is_v = tgt == PATCH_VERTEX_ARG
    limit = np.where(is_v, pkg.n_vertices, pkg.n_transfers)
    _fail_at("p_index: no such vertex/transfer, patch", (idx < 0) | (idx >= limit), idx)
    _fail_at(f"p_arg: vertex arg outside [0, {N_ARGS}), patch",
             is_v & ((arg < 0) | (arg >= N_ARGS)), arg)
    _fail_at("p_arg: must be 0 for a transfer patch, patch", ~is_v & (arg != 0), arg)
    steps = np.full(pkg.n_patches, -1, dtype=np.int64)
    steps[is_v] = item_steps(a["step_vtx"], idx[is_v])
    steps[~is_v] = item_steps(a["step_xfer"], idx[~is_v])
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


@kjit
def buffer_overlap(ptr, order, addr, end, first, last):  # type: ignore[no-untyped-def]
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


def _check_buffers(pkg: Package, first: np.ndarray, last: np.ndarray) -> BufferIndex:
    """Raise PackageInvalid on a bad buffer; return the index of all buffers live
    over [first, last] (the effective ranges)."""
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
    bi, bj = buffer_overlap(idx.ptr, idx.order, idx.addr, idx.end, first, last)
    if bi >= 0:
        lo = max(int(addr[bi]), int(addr[bj]))
        s = max(int(first[bi]), int(first[bj]))
        raise PackageInvalid(
            f"tile {int(a['buf_tile'][bi])}: {pkg.buffer_label(bi)} and "
            f"{pkg.buffer_label(bj)} overlap at {lo:#x} while both live at step {s} "
            f"(live {int(first[bi])}..{int(last[bi])} and {int(first[bj])}..{int(last[bj])})"
        )
    return idx


# ---- 3. patches ----------------------------------------------------------------------


def patch_collisions(pkg: Package) -> np.ndarray:
    """int64 [n, 2]: (first, later) patch pairs that rewrite one argument (the
    same target, item and arg), in patch order; check_structure bounded all
    three.  verify rejects them; the simulator faults them (F_PATCH)."""
    a = pkg.arrays
    if pkg.n_patches < 2:
        return np.zeros((0, 2), dtype=np.int64)
    items = max(pkg.n_vertices, pkg.n_transfers, 1)
    key = (a["p_target"] * items + a["p_index"]) * N_ARGS + a["p_arg"]
    order = np.argsort(key, kind="stable")
    same = np.flatnonzero(key[order][1:] == key[order][:-1])
    pairs = np.stack([order[same], order[same + 1]], axis=1).astype(np.int64)
    return pairs[np.argsort(pairs[:, 1], kind="stable")]


def _check_patches(pkg: Package, bidx: BufferIndex) -> None:
    a = pkg.arrays
    tgt, idx, arg = a["p_target"], a["p_index"], a["p_arg"]
    dup = patch_collisions(pkg)
    if dup.size:
        p = int(dup[0, 1])
        raise PackageInvalid(f"patches: patches {int(dup[0, 0])} and {p} both rewrite target "
                             f"{int(tgt[p])} item {int(idx[p])} arg {int(arg[p])}")
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
    tables = np.flatnonzero(~arith)
    tile, addr = a["p_table_tile"][tables], a["p_table_addr"][tables]
    loop = a["p_loop"][tables]
    end = addr + np.diff(a["p_table"])[tables] * TABLE_ENTRY_BYTES
    ok = (tile >= 0) & (tile < pkg.tiles)
    b = np.full(tables.size, -1, dtype=np.int64)
    find_buffers(np.where(ok, tile, 0), addr, end, loop, *bidx.args(), b)
    b = np.where(ok, b, -1)
    loop_end = a["step_match"][loop]
    found = np.maximum(b, 0)  # b >= 0 somewhere means there are buffers to index
    good = b >= 0
    if good.any():
        good &= (a["buf_kind"][found] == BUF_SUPPORT) & (bidx.last[found] >= loop_end)
    if not good.all():
        k = int(np.flatnonzero(~good)[0])
        raise PackageInvalid(
            f"patch {int(tables[k])}: table at tile {int(tile[k])} {int(addr[k]):#x}+"
            f"{int(end[k] - addr[k])} is not inside a support buffer live over loop steps "
            f"{int(loop[k])}..{int(loop_end[k])}"
        )


# ---- 4. footprint --------------------------------------------------------------------


def required_bytes(dev: Device, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Minimum (code, exchange-table) bytes per tile: the footprint model of
    simulator.footprint applied to the package's vertices, transfers and
    exchange schedule (a tile holding any buffer is in use).  Arrays not
    scheduled yet (a package being built by hand) count the sends the
    scheduler makes: one piece per send."""
    v_step = np.repeat(np.arange(arrays["step_vtx"].size - 1, dtype=np.int64),
                       np.diff(arrays["step_vtx"]))
    x_step = np.repeat(np.arange(arrays["step_xfer"].size - 1, dtype=np.int64),
                       np.diff(arrays["step_xfer"]))
    used = np.zeros(dev.tiles, dtype=bool)
    for key in ("buf_tile", "v_tile", "x_src_tile", "x_dst_tile"):
        if key in arrays:
            used[arrays[key]] = True
    loops = int(np.count_nonzero(arrays["step_kind"] == STEP_REPEAT_BEGIN))
    code = code_bytes(dev, used, arrays["v_tile"], arrays["v_kernel"], v_step, loops)
    dst = arrays["x_dst_addr"]
    follows = follows_previous(x_step, arrays["x_dst_tile"], dst, dst + arrays["x_bytes"])
    if "q_send" in arrays:
        qs, q_bytes = arrays["q_send"], arrays["q_bytes"]
        lead = arrays["x_send"]
    else:
        lead = package_leaders(arrays, dev.tiles)
        qs = np.flatnonzero(lead == np.arange(lead.size))
        q_bytes = arrays["x_bytes"][qs]
    xt = xtable_bytes(dev, x_step, arrays["x_src_tile"], arrays["x_dst_tile"], follows, lead,
                      qs, q_bytes)
    return code, xt


def _check_footprint(pkg: Package) -> None:
    a, dev = pkg.arrays, pkg.device
    for key, kind in (("fp_code", BUF_CODE), ("fp_xtable", BUF_XTABLE),
                      ("fp_support", BUF_SUPPORT)):
        m = a["buf_kind"] == kind
        # float sums are exact: _check_buffers bounded every size by memory_end
        s = np.bincount(a["buf_tile"][m], weights=a["buf_bytes"][m], minlength=pkg.tiles)
        s = s.astype(np.int64)
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


def io_block_spans(pkg: Package) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) bytes in tile memory of every io block (int64 arrays, one per
    block), as `access.region_span` of the block's region; (0, 0) for an empty
    block."""
    a = pkg.arrays
    ext = a["io_hi"] - a["io_lo"]
    esize = np.array([DTYPE_BYTES[dtype_code(t.dtype)] for t in pkg.io] or [1], dtype=np.int64)
    nb = ext[:, 2] * esize[a["io_tensor"]]
    d0, d1 = (ext[:, 0] - 1) * a["io_ld0"], (ext[:, 1] - 1) * a["io_ld1"]
    lo = a["io_addr"] + np.minimum(d0, 0) + np.minimum(d1, 0)
    hi = a["io_addr"] + nb + np.maximum(d0, 0) + np.maximum(d1, 0)
    empty = (ext[:, 0] <= 0) | (ext[:, 1] <= 0) | (nb <= 0)
    return np.where(empty, 0, lo), np.where(empty, 0, hi)


def _check_io(pkg: Package, bidx: BufferIndex) -> None:
    a = pkg.arrays
    ts = a["io_tensor"]
    n_io = ts.shape[0]
    shapes = np.array([(1,) * (IO_DIMS - len(t.shape)) + t.shape for t in pkg.io]
                      or [(1,) * IO_DIMS], dtype=np.int64)
    output = np.array([t.role == "output" for t in pkg.io] or [False])
    lo, hi = a["io_lo"], a["io_hi"]
    bad_slice = ((lo < 0) | (hi <= lo) | (hi > shapes[ts])).any(axis=1)
    s0, s1 = io_block_spans(pkg)
    end_step = max(pkg.n_steps - 1, 0)
    step = np.where(output[ts], end_step, 0)
    b = np.full(n_io, -1, dtype=np.int64)
    find_buffers(a["io_tile"].copy(), s0, s1, step, *bidx.args(), b)  # copy: one signature
    bad_buf = b < 0
    if not bad_buf.all():
        bad_buf |= ~output[ts] & (bidx.first[np.maximum(b, 0)] != 0)
    bad = np.flatnonzero(bad_slice | bad_buf)
    if bad.size:
        i = int(bad[0])
        t = pkg.io[int(ts[i])]
        if bad_slice[i]:
            raise PackageInvalid(
                f"io block {i} of {t.name!r}: slice {lo[i].tolist()}..{hi[i].tolist()} "
                f"outside shape {shapes[ts[i]].tolist()}"
            )
        raise PackageInvalid(
            f"io block {i} of {t.name!r} ({t.role}): tile {int(a['io_tile'][i])} "
            f"{int(s0[i]):#x}..{int(s1[i]):#x} is not inside a buffer live at step {int(step[i])}"
        )
    volume = np.zeros(len(pkg.io), dtype=np.int64)
    np.add.at(volume, ts, np.prod(hi - lo, axis=1))
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
        item = a["p_index"][ids]
        ids = ids[np.argsort(item, kind="stable")].astype(np.int64)
        # ptr[i] = patches of items < i: counts of (negative, 0, .., n-1, >= n)
        counts = np.bincount(np.clip(item, -1, n) + 1, minlength=n + 2)
        out += [np.cumsum(counts)[:n + 1].astype(np.int64, copy=False), ids]
    return out[0], out[1], out[2], out[3]


class _Scratch(threading.local):
    """Per-thread int64 scratch memory reused across `verify` calls.

    Fresh memory costs a page fault per 4 KiB touched (~2 µs each measured on
    the shared 2-core VM): for the access scan's scratch that was more than
    the scan's own work on the biggest steps."""

    def __init__(self) -> None:
        self.flat: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, int]) -> np.ndarray:
        size = shape[0] * shape[1]
        flat = self.flat.get(name)
        if flat is None or flat.size < size:
            flat = self.flat[name] = np.empty(max(size, 1), dtype=np.int64)
        return flat[:size].reshape(shape)


_SCRATCH = _Scratch()


def _patch_lists(pkg: Package) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ids of the vertex patches sorted by vertex and the position of each step's
    first one (pv_list, pv_step: n_steps + 1 entries); the same for transfers."""
    a = pkg.arrays
    out = []
    for is_v, offsets in ((True, a["step_vtx"]), (False, a["step_xfer"])):
        ids = np.flatnonzero((a["p_target"] == PATCH_VERTEX_ARG) == is_v)
        ids = ids[np.argsort(a["p_index"][ids], kind="stable")].astype(np.int64)
        out += [ids, np.searchsorted(a["p_index"][ids], offsets).astype(np.int64)]
    return out[0], out[1], out[2], out[3]


def access_index(pkg: Package, bidx: BufferIndex | None = None) -> BufferIndex:
    """The buffers a vertex operand or transfer endpoint may lie in, with the
    steps they may be touched at: tensor buffers over their effective live
    ranges (code, exchange-table and support memory never count as live for
    vertices and transfers).  The verifier checks every access against it
    statically, the engines at run time (simulator.access.live_buffer)."""
    if bidx is None:
        bidx = BufferIndex(pkg, *effective_live(pkg))
    tensor = np.isin(pkg.arrays["buf_kind"], TENSOR_KINDS)
    return bidx.live(np.where(tensor, bidx.first, np.iinfo(np.int64).max),
                     np.where(tensor, bidx.last, -1))


def _check_accesses(pkg: Package, bidx: BufferIndex) -> None:
    a = pkg.arrays
    pv_list, pv_step, px_list, px_step = _patch_lists(pkg)
    pt = np.stack([a["p_target"], a["p_index"], a["p_arg"], a["p_loop"], a["p_mode"],
                   a["p_base"], a["p_stride"], a["p_table"][:-1]], axis=1)
    assert pt.shape[1] == PT_LEN
    bi = access_index(pkg, bidx)
    max_x = max(int(np.diff(a["step_xfer"]).max(initial=0)), 1)
    max_r = max(8 * int(np.diff(a["step_vtx"]).max(initial=0)), 1)
    err = np.zeros(9, dtype=np.int64)
    code = scan_accesses(
        a["step_kind"], a["step_vtx"], a["step_xfer"], a["step_trips"],
        a["v_tile"], a["v_kernel"], a["v_args"],
        a["x_src_tile"], a["x_src_addr"], a["x_dst_tile"], a["x_dst_addr"], a["x_bytes"],
        pv_list, pv_step, px_list, px_step, pt, a["table_values"], *bi.args(),
        _SCRATCH.get("xs", (XS_LEN, max_x)), _SCRATCH.get("ts", (TS_LEN, pkg.tiles + 2)),
        _SCRATCH.get("regs", (max_r, R_LEN)), _SCRATCH.get("vs", (VS_LEN, max_r)), err,
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
        E_ARGS: f"{who(item)} arguments rejected by its kernel: {status.describe(nb)}",
    }
    raise PackageInvalid(f"{where}: {msgs[code]}")
