"""Package mutations: the ways a package can be wrong at run time.

Each `Mutation` turns a valid package into a corrupted copy at the first
site it applies to (a vertex of the right kernel, a transfer, a buffer, a
patch, an output block), or raises `NotApplicable`.  Every one must be
rejected by `simulator.verify` and reported as a fault by the engines when
the package runs with verification skipped: tests/test_mutations.py holds
both for every kind, and `python -m experiments.mutations` prints the table
of what verify says and which fault each engine reports.

The mutations are chosen to be visible at run time: ones that only break a
static rule (a footprint that disagrees with the buffers, a code buffer too
small) are verify's alone and are tested in tests/test_verify.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from kernels.abi import (
    ARGS,
    BUF_CODE,
    BUF_SUPPORT,
    CAST,
    DT_FP16,
    FLAG_ACCUMULATE,
    MATMUL,
    PATCH_ARITH,
    PATCH_TABLE,
    PATCH_VERTEX_ARG,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TENSOR_KINDS,
)
from simulator.package import Package

MM, CA = ARGS.MATMUL, ARGS.CAST


class NotApplicable(LookupError):
    """The package has no site for this mutation (no such kernel, no loop...)."""


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # one line: what is corrupted
    apply: Callable[[Package], Package]


# ---- sites --------------------------------------------------------------------------------


def _loop_depth(pkg: Package) -> np.ndarray:
    """Repeat nesting depth of every step (BEGIN and END count as inside)."""
    kind = pkg["step_kind"]
    depth, d = np.zeros(kind.shape[0], dtype=np.int64), 0
    for s, k in enumerate(kind):
        if k == STEP_REPEAT_BEGIN:
            d += 1
        depth[s] = d
        if k == STEP_REPEAT_END:
            d -= 1
    return depth


def _step_of(ptr: np.ndarray, i: int) -> int:
    return int(np.searchsorted(ptr, i, side="right") - 1)


def _vertex(pkg: Package, kernel: int, outside_loops: bool = True) -> tuple[int, int]:
    """(vertex, step) of the first vertex of `kernel` (outside Repeat loops,
    where liveness is not widened to the loop and no patch moves it)."""
    depth = _loop_depth(pkg)
    patched = set(pkg["p_index"][pkg["p_target"] == PATCH_VERTEX_ARG].tolist())
    for v in np.flatnonzero(pkg["v_kernel"] == kernel):
        s = _step_of(pkg["step_vtx"], int(v))
        if not outside_loops or (depth[s] == 0 and int(v) not in patched):
            return int(v), s
    raise NotApplicable(f"no vertex of kernel {kernel} outside loops")


def _transfers(pkg: Package) -> Iterator[tuple[int, int]]:
    """(transfer, step) of the unpatched transfers outside Repeat loops."""
    depth = _loop_depth(pkg)
    patched = set(pkg["p_index"][pkg["p_target"] != PATCH_VERTEX_ARG].tolist())
    for x in range(pkg["x_bytes"].shape[0]):
        s = _step_of(pkg["step_xfer"], x)
        if depth[s] == 0 and x not in patched and pkg["x_bytes"][x] > 0:
            yield x, s


def _transfer(pkg: Package) -> tuple[int, int]:
    for site in _transfers(pkg):
        return site
    raise NotApplicable("no transfer outside loops")


def _buffer(pkg: Package, tile: int, addr: int, step: int) -> int:
    """The tensor buffer live at `step` on `tile` that holds `addr`."""
    a, n = pkg["buf_addr"], pkg["buf_bytes"]
    hit = ((pkg["buf_tile"] == tile) & (a <= addr) & (addr < a + n)
           & (pkg["buf_first"] <= step) & (step <= pkg["buf_last"])
           & np.isin(pkg["buf_kind"], TENSOR_KINDS))
    found = np.flatnonzero(hit)
    if found.size == 0:
        raise NotApplicable(f"no live buffer at tile {tile} address {addr:#x} step {step}")
    return int(found[0])


def _system_buffer(pkg: Package, tile: int, kind: int) -> int:
    found = np.flatnonzero((pkg["buf_tile"] == tile) & (pkg["buf_kind"] == kind))
    if found.size == 0:
        raise NotApplicable(f"no buffer of kind {kind} on tile {tile}")
    return int(found[0])


def _set(pkg: Package, name: str, index: tuple[int, ...] | int, value: int) -> Package:
    arr = pkg[name].copy()
    arr[index] = value
    return pkg.with_arrays(**{name: arr})


def _set_arg(pkg: Package, v: int, slot: int, value: int) -> Package:
    return _set(pkg, "v_args", (v, slot), value)


# ---- vertex mutations ---------------------------------------------------------------------


def _matmul_out_buffer(pkg: Package) -> tuple[int, int, int]:
    v, s = _vertex(pkg, MATMUL)
    return v, s, _buffer(pkg, int(pkg["v_tile"][v]), int(pkg["v_args"][v, MM.c]), s)


def vertex_dead_output(pkg: Package) -> Package:
    v, s, b = _matmul_out_buffer(pkg)
    if pkg["buf_last"][b] <= s:
        raise NotApplicable("output buffer dies at its writer")
    return _set(pkg, "buf_first", b, s + 1)


def vertex_dead_input(pkg: Package) -> Package:
    v, s = _vertex(pkg, MATMUL)
    b = _buffer(pkg, int(pkg["v_tile"][v]), int(pkg["v_args"][v, MM.a]), s)
    if pkg["buf_first"][b] >= s:
        raise NotApplicable("input buffer born at its reader")
    return _set(pkg, "buf_last", b, s - 1)


def vertex_overrun(pkg: Package) -> Package:
    v, s, b = _matmul_out_buffer(pkg)
    rows = int(pkg["buf_bytes"][b]) // max(int(pkg["v_args"][v, MM.ldc]), 1) + 1
    return _set_arg(pkg, v, MM.M, int(pkg["v_args"][v, MM.M]) + rows)


def vertex_misaligned(pkg: Package) -> Package:
    """A matmul output one byte off its alignment, its buffer widened down by
    that byte so the region still lies inside it."""
    v, _, b = _matmul_out_buffer(pkg)
    moved = _set(pkg, "buf_addr", b, int(pkg["buf_addr"][b]) - 1)
    moved = _set(moved, "buf_bytes", b, int(pkg["buf_bytes"][b]) + 1)
    return _set_arg(moved, v, MM.c, int(pkg["buf_addr"][b]) - 1)


def vertex_into_support(pkg: Package) -> Package:
    v, _ = _vertex(pkg, MATMUL)
    b = _system_buffer(pkg, int(pkg["v_tile"][v]), BUF_SUPPORT)
    return _set_arg(pkg, v, MM.c, int(pkg["buf_addr"][b]))


def vertex_from_code(pkg: Package) -> Package:
    v, _ = _vertex(pkg, MATMUL)
    b = _system_buffer(pkg, int(pkg["v_tile"][v]), BUF_CODE)
    return _set_arg(pkg, v, MM.a, int(pkg["buf_addr"][b]))


def cast_dtype_7(pkg: Package) -> Package:
    v, _ = _vertex(pkg, CAST, outside_loops=False)
    return _set_arg(pkg, v, CA.dtype_y, 7)


def cast_negative_rows(pkg: Package) -> Package:
    v, _ = _vertex(pkg, CAST, outside_loops=False)
    return _set_arg(pkg, v, CA.M, -3)


def matmul_accumulate_fp16(pkg: Package) -> Package:
    v, _ = _vertex(pkg, MATMUL, outside_loops=False)
    args = pkg["v_args"].copy()
    args[v, MM.flags] |= FLAG_ACCUMULATE
    args[v, MM.out_dtype] = DT_FP16
    return pkg.with_arrays(v_args=args)


def matmul_dtype_7(pkg: Package) -> Package:
    v, _ = _vertex(pkg, MATMUL, outside_loops=False)
    return _set_arg(pkg, v, MM.in_dtype, 7)


def matmul_zero_k(pkg: Package) -> Package:
    v, _ = _vertex(pkg, MATMUL, outside_loops=False)
    return _set_arg(pkg, v, MM.K, 0)


# ---- buffer mutations ---------------------------------------------------------------------


def buffer_past_end(pkg: Package) -> Package:
    _, _, b = _matmul_out_buffer(pkg)
    return _set(pkg, "buf_addr", b, pkg.device.memory_end - 64)


def buffer_shrunk(pkg: Package) -> Package:
    _, _, b = _matmul_out_buffer(pkg)
    return _set(pkg, "buf_bytes", b, pkg.device.alignment)


def buffers_overlap(pkg: Package) -> Package:
    """The output buffer of a matmul moved onto its live input buffer."""
    v, s, b = _matmul_out_buffer(pkg)
    a = _buffer(pkg, int(pkg["v_tile"][v]), int(pkg["v_args"][v, MM.a]), s)
    return _set(pkg, "buf_addr", b, int(pkg["buf_addr"][a]))


# ---- transfer mutations -------------------------------------------------------------------


def _transfer_sites(pkg: Package) -> Iterator[tuple[int, int, int, int]]:
    """(transfer, step, source buffer, destination buffer) of `_transfers`."""
    for x, s in _transfers(pkg):
        src = _buffer(pkg, int(pkg["x_src_tile"][x]), int(pkg["x_src_addr"][x]), s)
        dst = _buffer(pkg, int(pkg["x_dst_tile"][x]), int(pkg["x_dst_addr"][x]), s)
        yield x, s, src, dst


def transfer_dead_source(pkg: Package) -> Package:
    for _, s, src, _ in _transfer_sites(pkg):
        if pkg["buf_first"][src] < s:
            return _set(pkg, "buf_last", src, s - 1)
    raise NotApplicable("every transfer source is born at its transfer")


def transfer_dead_destination(pkg: Package) -> Package:
    for _, s, _, dst in _transfer_sites(pkg):
        if pkg["buf_last"][dst] > s:
            return _set(pkg, "buf_first", dst, s + 1)
    raise NotApplicable("every transfer destination dies at its transfer")


def transfer_overrun_4k(pkg: Package) -> Package:
    x, _ = _transfer(pkg)
    return _set(pkg, "x_bytes", x, int(pkg["x_bytes"][x]) + 4096)


def transfer_overrun_source(pkg: Package) -> Package:
    """The source moved so its last bytes lie past its buffer's end."""
    x, _, src, _ = next(_transfer_sites(pkg))
    end = int(pkg["buf_addr"][src] + pkg["buf_bytes"][src])
    return _set(pkg, "x_src_addr", x, end - int(pkg["x_bytes"][x]) + pkg.device.alignment)


def transfer_misaligned(pkg: Package) -> Package:
    for x, _, _, dst in _transfer_sites(pkg):
        nb, start = int(pkg["x_bytes"][x]), int(pkg["buf_addr"][dst]) + 1
        if nb % 2 == 0 and start + nb <= int(pkg["buf_addr"][dst] + pkg["buf_bytes"][dst]):
            return _set(pkg, "x_dst_addr", x, start)  # inside its buffer, off its alignment
    raise NotApplicable("no transfer with room to misalign inside its buffer")


def transfer_into_support(pkg: Package) -> Package:
    x, _ = _transfer(pkg)
    b = _system_buffer(pkg, int(pkg["x_dst_tile"][x]), BUF_SUPPORT)
    return _set(pkg, "x_dst_addr", x, int(pkg["buf_addr"][b]))


def transfer_from_code(pkg: Package) -> Package:
    x, _ = _transfer(pkg)
    b = _system_buffer(pkg, int(pkg["x_src_tile"][x]), BUF_CODE)
    return _set(pkg, "x_src_addr", x, int(pkg["buf_addr"][b]))


def transfer_race(pkg: Package) -> Package:
    """Two transfers of one step land on the same bytes."""
    tile, nb = pkg["x_dst_tile"], pkg["x_bytes"]
    for x, s in _transfers(pkg):
        for y in range(int(pkg["step_xfer"][s]), int(pkg["step_xfer"][s + 1])):
            if y != x and tile[y] == tile[x] and 0 < nb[y] <= nb[x]:
                return _set(pkg, "x_dst_addr", y, int(pkg["x_dst_addr"][x]))
    raise NotApplicable("no two transfers to one tile in a step")


# ---- patch and output mutations -----------------------------------------------------------


def _patch_of(pkg: Package, mode: int) -> int:
    found = np.flatnonzero((pkg["p_mode"] == mode) & (pkg["p_target"] == PATCH_VERTEX_ARG))
    if found.size == 0:
        raise NotApplicable(f"no vertex patch of mode {mode}")
    return int(found[0])


def patch_stride(pkg: Package) -> Package:
    p = _patch_of(pkg, PATCH_ARITH)
    return _set(pkg, "p_stride", p, int(pkg["p_stride"][p]) + pkg.device.memory_end)


def patch_table_entry(pkg: Package) -> Package:
    p = _patch_of(pkg, PATCH_TABLE)
    last = int(pkg["p_table"][p + 1]) - 1
    return _set(pkg, "table_values", last, int(pkg["table_values"][last]) + pkg.device.memory_end)


def patch_twice(pkg: Package) -> Package:
    """A second arithmetic patch on the argument the first one rewrites (half
    its stride): the engines would apply both."""
    p = _patch_of(pkg, PATCH_ARITH)
    arrays = {}
    for name in ("p_target", "p_index", "p_arg", "p_loop", "p_mode", "p_base", "p_stride",
                 "p_table_tile", "p_table_addr"):
        a = pkg[name]
        arrays[name] = np.insert(a, p + 1, a[p])
    arrays["p_stride"][p + 1] = int(pkg["p_stride"][p]) // 2
    arrays["p_table"] = np.insert(pkg["p_table"], p + 1, pkg["p_table"][p + 1])
    return pkg.with_arrays(**arrays)


def output_uncovered(pkg: Package) -> Package:
    """An output block one row short: elements no block covers."""
    a = pkg["io_hi"] - pkg["io_lo"]
    for i in np.flatnonzero(pkg["io_tensor"] == pkg["io_tensor"].max()).tolist():
        dims = np.flatnonzero(a[i] >= 2)
        if dims.size:
            hi = pkg["io_hi"].copy()
            hi[i, int(dims[0])] -= 1
            return pkg.with_arrays(io_hi=hi)
    raise NotApplicable("no output block with an extent of 2 or more")


def output_moved(pkg: Package) -> Package:
    """An output block read from the tile's code buffer."""
    if pkg["io_addr"].shape[0] == 0:
        raise NotApplicable("no output blocks")
    i = int(np.flatnonzero(pkg["io_tensor"] == pkg["io_tensor"].max())[0])
    b = _system_buffer(pkg, int(pkg["io_tile"][i]), BUF_CODE)
    return _set(pkg, "io_addr", i, int(pkg["buf_addr"][b]))


# ---- exchange schedule mutations ----------------------------------------------------------


def _pieces_outside_loops(pkg: Package) -> Iterator[tuple[int, int]]:
    """(piece, step) of the schedule's pieces in exchange steps outside loops."""
    depth = _loop_depth(pkg)
    ptr = pkg["step_piece"]
    for q in range(pkg["q_send"].shape[0]):
        s = _step_of(ptr, q)
        if depth[s] == 0:
            yield q, s


def _set_pieces(pkg: Package, keep: np.ndarray) -> Package:
    """The package with only the pieces `keep` (bool [Q]) in its schedule."""
    step = np.repeat(np.arange(pkg.n_steps), np.diff(pkg["step_piece"]))
    counts = np.bincount(step[keep], minlength=pkg.n_steps)
    ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return pkg.with_arrays(step_piece=ptr, q_send=pkg["q_send"][keep],
                           q_offset=pkg["q_offset"][keep], q_bytes=pkg["q_bytes"][keep],
                           q_start=pkg["q_start"][keep])


def schedule_piece_dropped(pkg: Package) -> Package:
    """One piece of a send left out of the schedule (its words never sent)."""
    for q, _ in _pieces_outside_loops(pkg):
        keep = np.ones(pkg["q_send"].shape[0], dtype=bool)
        keep[q] = False
        return _set_pieces(pkg, keep)
    raise NotApplicable("no schedule piece outside loops")


def schedule_start_moved(pkg: Package) -> Package:
    """A piece started at the end of its step's transfer window (it ends after it)."""
    for q, s in _pieces_outside_loops(pkg):
        return _set(pkg, "q_start", q, int(pkg["step_xcycles"][s]))
    raise NotApplicable("no schedule piece outside loops")


def schedule_port_double_booked(pkg: Package) -> Package:
    """A piece moved so that one of its receivers hears it while it still
    hears another piece (a sender whose only piece it is: no lane clash)."""
    from simulator.xschedule import fabric, latency

    fab = fabric(pkg.device)
    src, dst, lead_of = pkg["x_src_tile"], pkg["x_dst_tile"], pkg["x_send"]
    ptr = pkg["step_piece"]
    for s in np.flatnonzero(_loop_depth(pkg) == 0).tolist():
        p0, p1 = int(ptr[s]), int(ptr[s + 1])
        if p1 - p0 < 2:
            continue
        leads = pkg["q_send"][p0:p1]
        senders = src[leads]
        hears: dict[int, list[int]] = {}  # receiver tile -> pieces it hears
        x0, x1 = int(pkg["step_xfer"][s]), int(pkg["step_xfer"][s + 1])
        for x in range(x0, x1):
            for q in np.flatnonzero(leads == lead_of[x]).tolist():
                hears.setdefault(int(dst[x]), []).append(p0 + q)
        for d, qs in sorted(hears.items()):
            for qa in qs:
                for qb in qs:
                    sb = int(src[pkg["q_send"][qb]])
                    if qa == qb or (senders == sb).sum() != 1:
                        continue
                    sa = int(src[pkg["q_send"][qa]])
                    t = int(pkg["q_start"][qa]) + int(latency(fab, sa, d)) - int(
                        latency(fab, sb, d))
                    if t >= 0 and t != int(pkg["q_start"][qb]):
                        return _set(pkg, "q_start", qb, t)
    raise NotApplicable("no receiver outside loops hearing two senders")


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("vertex-dead-output", "a matmul writes a buffer not yet live", vertex_dead_output),
    Mutation("vertex-dead-input", "a matmul reads a buffer already dead", vertex_dead_input),
    Mutation("vertex-overrun", "a matmul's rows overrun its output buffer", vertex_overrun),
    Mutation("vertex-misaligned", "a matmul output one byte off its alignment",
             vertex_misaligned),
    Mutation("vertex-into-support", "a matmul writes the support buffer", vertex_into_support),
    Mutation("vertex-from-code", "a matmul reads the code buffer", vertex_from_code),
    Mutation("cast-dtype-7", "CAST output dtype code 7", cast_dtype_7),
    Mutation("cast-rows-negative", "CAST M = -3", cast_negative_rows),
    Mutation("matmul-accumulate-fp16", "MATMUL accumulating into an fp16 output",
             matmul_accumulate_fp16),
    Mutation("matmul-dtype-7", "MATMUL input dtype code 7", matmul_dtype_7),
    Mutation("matmul-k-zero", "MATMUL K = 0", matmul_zero_k),
    Mutation("buffer-past-end", "a buffer moved past the tile's memory end", buffer_past_end),
    Mutation("buffer-shrunk", "a matmul's output buffer shrunk to one granule", buffer_shrunk),
    Mutation("buffers-overlap", "a live buffer moved onto another live one", buffers_overlap),
    Mutation("transfer-dead-source", "a transfer reads a buffer already dead",
             transfer_dead_source),
    Mutation("transfer-dead-destination", "a transfer writes a buffer not yet live",
             transfer_dead_destination),
    Mutation("transfer-overrun-4k", "a transfer 4 KiB longer than its buffers",
             transfer_overrun_4k),
    Mutation("transfer-overrun-source", "a transfer source straddling its buffer's end",
             transfer_overrun_source),
    Mutation("transfer-misaligned", "a transfer destination one byte off its alignment",
             transfer_misaligned),
    Mutation("transfer-into-support", "a transfer lands in the support buffer",
             transfer_into_support),
    Mutation("transfer-from-code", "a transfer reads the code buffer", transfer_from_code),
    Mutation("transfer-race", "two transfers of one step land on the same bytes", transfer_race),
    Mutation("patch-stride", "a Repeat patch stride past the memory end", patch_stride),
    Mutation("patch-table-entry", "a patch table's last entry past the memory end",
             patch_table_entry),
    Mutation("patch-twice", "two Repeat patches rewrite one vertex argument", patch_twice),
    Mutation("output-moved", "an output block read from the code buffer", output_moved),
    Mutation("output-uncovered", "an output block one row short (elements no block covers)",
             output_uncovered),
    Mutation("schedule-piece-dropped", "a piece of a send left out of the exchange schedule",
             schedule_piece_dropped),
    Mutation("schedule-start-moved", "a piece started at the end of its step's window",
             schedule_start_moved),
    Mutation("schedule-port-double-booked", "a receiver hearing two pieces at once",
             schedule_port_double_booked),
)


def mutation(name: str) -> Mutation:
    for m in MUTATIONS:
        if m.name == name:
            return m
    raise KeyError(f"unknown mutation {name!r}; known: {', '.join(m.name for m in MUTATIONS)}")
