"""The Numba superstep engine: one `@njit` loop over a package's flat arrays.

`execute(pkg, image)` runs the program of a package (docs/contracts.md §3):

- REPEAT_BEGIN/REPEAT_END run natively with loop counters indexed by the
  BEGIN step and a stack of open loops; patches read the counter of their
  loop (`base + i*stride` or `table[i]`).  Nothing is unrolled.
- Timing: a COMPUTE step costs the max over tiles of the summed vertex
  cycles (`kernels.dispatch.vertex_cost`, = `vertex_cycles` without its
  scratch allocation; computed once for vertices without patches); an
  EXCHANGE step and each REPEAT_END execution cost what simulator.timing
  says (sync + setup + the busiest tile's payload or control cycles; loop
  overhead + patched words before a jump back), charged to the step.  Cycles
  per step are summed over iterations.
- Numerics (when `image` is given): before a step runs, every region of every
  vertex/transfer (with its patched values) is checked: inside the tile's
  image window (the span of its tensor buffers, see `MemoryImage`), on its
  natural alignment, reads only of bytes written before; then
  the step is race-checked (two writers, or a writer and a reader from
  different vertices/transfers).  Vertices whose regions are out of range are
  skipped (memory safety); everything else executes, so one run reports all
  faults it meets.  An exchange gathers every source first, then writes every
  destination (all copies read the pre-step state).

Faults and the image are described in simulator.engines.base.  The loop's
arguments are grouped as NamedTuples of arrays: `Program` (the package's flat
arrays and patch index), `MemoryImage` and `Outputs`.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

import numba
import numpy as np

from kernels.abi import (
    KERNEL_IDS,
    MAX_REGIONS,
    MAX_REPEAT_DEPTH,
    N_ARGS,
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
)
from kernels.dispatch import vertex_check, vertex_cost
from simulator.access import (
    B_ADDR,
    B_END,
    R_LEN,
    find_race,
    granule_of,
    live_buffer,
    region_span,
    span_of,
)
from simulator.engines import numba_scratch
from simulator.engines.base import (
    C_CYCLES,
    C_FAULTS,
    C_TRANSFERS,
    C_VERTICES,
    F_ARGS,
    F_MISALIGNED,
    F_NO_BUFFER,
    F_NO_REGIONS,
    F_RACE,
    F_RANGE,
    F_SCHEDULE,
    F_UNINIT,
    FAULT_COLS,
    MAX_FAULTS,
    EngineOutput,
    MemoryImage,
    no_image,
)
from simulator.engines.numba_data import (
    P_KERNEL,
    P_WRITTEN,
    P_XCHECK,
    PARALLEL_CHUNKS,
    execute_parallel,
    execute_serial,
    fault,
    finish_execute,
    first_unwritten,
    mark_parallel,
    regions_parallel,
    regions_serial,
)
from simulator.engines.numba_exchange import (
    C_ENDS,
    C_FLAGGED,
    C_SELF,
    RACE_PARTS,
    X_CHUNKS,
    bytes_in_hist,
    copy_parallel,
    copy_serial,
    ends_serial,
    exchange_ends,
    exchange_race,
    keep_bytes_in,
    keep_exchange_row,
    mark_copied,
    patch_value,
    race_rows_parallel,
    race_rows_serial,
    report_flagged,
    x_chunks,
    xfer_one,
    xfer_pass_parallel,
)
from simulator.engines.ticks import ticks
from simulator.package import Package, per_package
from simulator.timing import (
    DV_LOOP,
    DV_PATCH,
    DV_SYNC,
    device_scalars,
    loop_patch_words,
)
from simulator.verify import access_index, buffer_overlap, patch_index, schedule_violations
from simulator.xschedule import transfer_busy
from tilecommon.jit import kjit, kjit_host, kjit_inline, kjit_parallel

# compute steps with at least this many vertices are costed and checked on all
# cores (`_vertex_pass_parallel`) when the engine runs in the main thread;
# smaller ones, and all in other threads, in this thread
PARALLEL_VERTICES = 512
SERIAL = 1 << 62  # the threshold that keeps a run out of the thread pool
OPT_PARALLEL_MIN, OPT_CHECKS, OPT_OVERLAP = 0, 1, 2  # run options of _superstep_loop
# the profile (Outputs.prof, in time-stamp ticks): where the loop's time went;
# P_WRITTEN and P_KERNEL + kernel id are charged in numba_data
P_COST = 0  # compute: cycles and run-time checks of every vertex (_vertex_pass)
P_CHECK = 1  # compute, numerics: regions in the image, reads of unwritten bytes
P_RACE = 2  # compute, numerics: the step's race check
P_XFER = 4  # exchange: patches, run-time checks, payload per tile
P_XCYCLES = 5  # exchange: cycles of a step not cached
P_XCOPY = 7  # exchange, numerics: the copies and their written bits
PROFILE_LEN = 32
P_EXEC = 30  # compute, numerics: executing the vertices (wall; P_KERNEL + id: CPU)
P_TOTAL = 31  # the whole loop
PROFILE_NAMES = {P_COST: "compute: cycles + checks", P_CHECK: "compute: regions + uninit",
                 P_RACE: "compute: race check", P_WRITTEN: "compute: written bits",
                 P_XFER: "exchange: patches + checks", P_XCYCLES: "exchange: cycles",
                 P_XCHECK: "exchange: numerics checks", P_XCOPY: "exchange: copies"}


class Program(NamedTuple):
    """A package's flat arrays as the loop reads them (docs/contracts.md §3),
    with the patch index of verify.patch_index and the patched words per loop."""

    step_kind: np.ndarray
    step_vtx: np.ndarray
    step_xfer: np.ndarray
    step_trips: np.ndarray
    step_match: np.ndarray
    v_tile: np.ndarray
    v_kernel: np.ndarray
    v_args: np.ndarray
    x_src_tile: np.ndarray
    x_src_addr: np.ndarray
    x_dst_tile: np.ndarray
    x_dst_addr: np.ndarray
    x_bytes: np.ndarray
    vp_ptr: np.ndarray
    vp_list: np.ndarray
    xp_ptr: np.ndarray
    xp_list: np.ndarray
    p_target: np.ndarray
    p_arg: np.ndarray
    p_loop: np.ndarray
    p_mode: np.ndarray
    p_base: np.ndarray
    p_stride: np.ndarray
    p_table: np.ndarray
    table_values: np.ndarray
    loop_patch: np.ndarray
    b_ptr: np.ndarray  # the access index (verify.access_index): tile -> first row
    b_table: np.ndarray  # ... its rows (simulator.access B_* columns)
    step_xcycles: np.ndarray  # the exchange schedule's window per step
    x_sched: np.ndarray  # [S, 4] its first violation per step (simulator.xschedule)
    x_lead: np.ndarray  # bool [X]: the transfer leads its send (bytes out once per send)
    x_lane: np.ndarray  # int32 [X]: cycles its send holds the sender's lane (on leaders)
    x_port: np.ndarray  # int32 [X]: cycles it holds its receiver's port (xschedule.transfer_busy)


class Outputs(NamedTuple):
    """What the loop accumulates (EngineOutput before it is trimmed)."""

    cycles_per_step: np.ndarray  # int64 [S]
    tile_busy: np.ndarray  # int64 [tiles]
    bytes_in: np.ndarray  # int64 [tiles]
    bytes_out: np.ndarray  # int64 [tiles]
    xsend: np.ndarray  # int64 [tiles]: exchange cycles its send lane is booked
    xrecv: np.ndarray  # int64 [tiles]: ... its receive port
    faults: np.ndarray  # int64 [MAX_FAULTS, FAULT_COLS]
    counters: np.ndarray  # int64 [4]: C_*
    prof: np.ndarray  # int64 [PROFILE_LEN]: ticks per P_* phase


@per_package
def program_arrays(pkg: Package) -> tuple[Program, bool]:
    """The `Program` of `pkg`, and whether two of its tensor buffers on a tile
    overlap in address while both are live (verify rejects such a package;
    the engine's exchange race check then takes its exact path).  Built once
    per package object (`per_package`); the engine only reads it."""
    a = pkg.arrays
    vp_ptr, vp_list, xp_ptr, xp_list = patch_index(pkg)
    bi = access_index(pkg)
    b_ptr, b_table = bi.args()
    overlap = buffer_overlap(bi.ptr, bi.order, bi.addr, bi.end, bi.first, bi.last)[0] >= 0
    return Program(
        a["step_kind"], a["step_vtx"], a["step_xfer"], a["step_trips"], a["step_match"],
        a["v_tile"], a["v_kernel"], a["v_args"],
        a["x_src_tile"], a["x_src_addr"], a["x_dst_tile"], a["x_dst_addr"], a["x_bytes"],
        vp_ptr, vp_list, xp_ptr, xp_list,
        a["p_target"], a["p_arg"], a["p_loop"], a["p_mode"], a["p_base"], a["p_stride"],
        a["p_table"], a["table_values"], loop_patch_words(pkg), b_ptr, b_table,
        a["step_xcycles"], schedule_violations(pkg),
        a["x_send"] == np.arange(a["x_send"].size), *transfer_busy(pkg.device, a)), overlap


def execute(pkg: Package, image: MemoryImage | None = None, checks: bool = True) -> EngineOutput:
    """Run `pkg` (already structure-checked) for timing, and numerics if `image`.
    `checks=False` drops the run-time invariant checks of the timing path (only
    for measuring what they cost: experiments/bench_simulator.py)."""
    a, dev = pkg.arrays, pkg.device
    numerics = image is not None
    if image is None:
        image = no_image(pkg.tiles)
    stage_bytes = 1
    sx = a["step_xfer"]
    if numerics and pkg.n_transfers:  # the most bytes one exchange step moves
        starts = sx[:-1][sx[1:] > sx[:-1]]
        stage_bytes = max(1, int(np.add.reduceat(a["x_bytes"], starts).max()))
    out = Outputs(np.zeros(pkg.n_steps, dtype=np.int64), np.zeros(pkg.tiles, dtype=np.int64),
                  np.zeros(pkg.tiles, dtype=np.int64), np.zeros(pkg.tiles, dtype=np.int64),
                  np.zeros(pkg.tiles, dtype=np.int64), np.zeros(pkg.tiles, dtype=np.int64),
                  np.zeros((MAX_FAULTS, FAULT_COLS), dtype=np.int64),
                  np.zeros(4, dtype=np.int64), np.zeros(PROFILE_LEN, dtype=np.int64))
    # Numba's thread pool is entered from the main thread only (tilecommon.jit:
    # the fork-safe workqueue layer must never be entered by two threads)
    opts = np.zeros(3, dtype=np.int64)
    opts[OPT_PARALLEL_MIN] = PARALLEL_VERTICES \
        if threading.current_thread() is threading.main_thread() else SERIAL
    opts[OPT_CHECKS] = bool(checks) or numerics  # numerics needs the checks for memory safety
    prog, overlap = program_arrays(pkg)
    opts[OPT_OVERLAP] = overlap
    scratch = numba_scratch.take(int(np.diff(sx).max(initial=0)), pkg.n_transfers)
    t0 = time.perf_counter()
    try:
        _superstep_loop(prog, dev.tile_desc().as_array(), device_scalars(dev), numerics, image,
                        np.zeros(stage_bytes, dtype=np.uint8), out, opts, scratch)
    finally:
        numba_scratch.give(scratch)
    wall = time.perf_counter() - t0
    per_tick = wall / max(int(out.prof[P_TOTAL]), 1)
    counters = out.counters
    n_f = int(counters[C_FAULTS])
    return EngineOutput(
        cycles=int(counters[C_CYCLES]), cycles_per_step=out.cycles_per_step,
        tile_busy=out.tile_busy, tile_bytes_in=out.bytes_in, tile_bytes_out=out.bytes_out,
        tile_send_busy=out.xsend, tile_receive_busy=out.xrecv,
        faults=out.faults[: min(n_f, MAX_FAULTS)].copy(), n_faults=n_f,
        vertex_invocations=int(counters[C_VERTICES]), transfers=int(counters[C_TRANSFERS]),
        profile=profile_seconds(out.prof, per_tick),
    )


def profile_seconds(prof: np.ndarray, per_tick: float) -> dict[str, float]:
    """The loop's profile in seconds by phase name (PROFILE_NAMES, and
    `execute: <kernel>` per kernel family that ran), with `other` for the
    rest of the loop (loop control, step bookkeeping, fault reports)."""
    sec = {name: float(prof[k]) * per_tick for k, name in PROFILE_NAMES.items()}
    # kernels' ticks are summed over the cores: scaled to the phase's wall time
    cpu = sum(int(prof[P_KERNEL + kid]) for kid in KERNEL_IDS.values())
    for name, kid in sorted(KERNEL_IDS.items(), key=lambda kv: kv[1]):
        if prof[P_KERNEL + kid]:
            sec[f"execute: {name}"] = float(prof[P_EXEC]) * per_tick * prof[P_KERNEL + kid] / cpu
    sec["other"] = max(0.0, float(prof[P_TOTAL]) * per_tick - sum(sec.values()))
    return sec


@kjit_inline
def _check_regions(s, loop, it, v, tile, vr, nr, b_ptr, b_table, vbuf, faults, counters,
                   emit):  # type: ignore[no-untyped-def]
    """The run-time invariants of vertex v's regions vr[:nr] at step s
    (simulator.engines.base): each in a live tensor buffer (else F_NO_BUFFER),
    on its natural alignment (else F_MISALIGNED).  Returns a bit set: 1 some
    region has no buffer (the vertex must not run), 2 some is misaligned.
    Faults are recorded only when `emit` (the parallel pass only flags)."""
    bad = 0
    for r in range(nr):
        # scalars, not a row view: a view passed to a call costs reference counting
        addr, outer, ostride, rows, ld, nb = vr[r, 0], vr[r, 1], vr[r, 2], vr[r, 3], vr[r, 4], \
            vr[r, 5]
        lo, hi = span_of(addr, outer, ostride, rows, ld, nb)
        if hi <= lo:
            continue
        # the bounds of the buffer this region was found in last time (a vertex
        # always runs at the same step, so that buffer is still live): no
        # lookup while a patched region stays inside it
        k = 2 * (v * 8 + r)
        if not (vbuf[k] <= lo and hi <= vbuf[k + 1] and outer * rows <= vbuf[k + 1] - vbuf[k]):
            j = live_buffer(tile, lo, hi, outer * rows, s, b_ptr, b_table, -1)
            if j < 0:
                if emit:
                    fault(faults, counters, F_NO_BUFFER, s, tile, lo, loop, it, v, hi - lo)
                bad |= 1
                continue
            vbuf[k], vbuf[k + 1] = b_table[j, B_ADDR], b_table[j, B_END]
        g = granule_of(outer, ostride, rows, ld, nb)
        if addr & (g - 1) != 0:  # g is 1, 2 or 4
            if emit:
                fault(faults, counters, F_MISALIGNED, s, tile, addr, loop, it, v, g)
            bad |= 2
    return bad


@kjit_inline
def _fill_args(v, row, prog, ctr):  # type: ignore[no-untyped-def]
    """Vertex v's arguments with its patches applied at the loop counters `ctr`."""
    for j in range(N_ARGS):
        row[j] = prog.v_args[v, j]
    for q in range(prog.vp_ptr[v], prog.vp_ptr[v + 1]):
        p = prog.vp_list[q]
        row[prog.p_arg[p]] = patch_value(p, ctr, prog)


@kjit_inline
def _vertex_one(v, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf, row, vr, faults,
                counters, checks):  # type: ignore[no-untyped-def]
    """Cycles of vertex v at step s into vcost[v] and its run-time check
    result into vflag[v] (the bits of `_check_regions`; 1 also for a rejected
    argument or a kernel without regions), recording no fault.  A clean
    unpatched vertex is computed once (vcyc)."""
    patched = prog.vp_ptr[v] != prog.vp_ptr[v + 1]
    if not patched and vcyc[v] >= 0:
        vcost[v] = vcyc[v]  # cycles are a pure function of (kernel, args, tile)
        vflag[v] = 0
        return
    _fill_args(v, row, prog, ctr)
    kid = prog.v_kernel[v]
    if not checks:  # the benchmark's measure of what the checks cost
        c, _ = vertex_cost(kid, row, desc, vr)
        vcost[v] = max(c, 0)
        vflag[v] = 0
        if not patched:
            vcyc[v] = vcost[v]
        return
    if vertex_check(kid, row) != 0:
        vcost[v] = 0  # a vertex its kernel rejects costs nothing and does not run
        vflag[v] = 1
        return
    c, nr = vertex_cost(kid, row, desc, vr)  # cycles and regions in one call
    c = max(c, 0)  # unknown kernels are rejected by check_structure
    vcost[v] = c
    if nr < 0:
        vflag[v] = 1
        return
    bad = _check_regions(s, 0, 0, v, prog.v_tile[v], vr, nr, prog.b_ptr, prog.b_table, vbuf,
                         faults, counters, False)
    vflag[v] = bad
    if not patched and bad == 0:
        vcyc[v] = c  # a clean unpatched vertex needs no second check


@kjit
def _vertex_pass(i0, i1, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf, faults,
                 counters, checks):  # type: ignore[no-untyped-def]
    """`_vertex_one` for vertices i0..i1, in this thread (small steps)."""
    row = np.zeros(N_ARGS, dtype=np.int64)
    vr = np.zeros((MAX_REGIONS, R_LEN), dtype=np.int64)
    for v in range(i0, i1):
        _vertex_one(v, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf, row, vr, faults,
                    counters, checks)


@kjit_parallel
def _vertex_pass_parallel(i0, i1, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf, faults,
                          counters, checks):  # type: ignore[no-untyped-def]
    """`_vertex_pass` over the cores: vertices are independent here (every
    write goes to the vertex's own entries), faults are reported after it."""
    n = i1 - i0
    chunks = min(n, PARALLEL_CHUNKS)
    for ch in numba.prange(chunks):
        row = np.zeros(N_ARGS, dtype=np.int64)
        vr = np.zeros((MAX_REGIONS, R_LEN), dtype=np.int64)
        for v in range(i0 + ch * n // chunks, i0 + (ch + 1) * n // chunks):
            _vertex_one(v, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf, row, vr, faults,
                        counters, checks)


@kjit
def _report_vertex(v, s, loop, it, prog, ctr, desc, vbuf, faults,
                   counters):  # type: ignore[no-untyped-def]
    """Record the run-time faults of vertex v (one `_vertex_one` flagged), in
    the order the checks run: arguments, then each region's buffer and
    alignment."""
    row = np.zeros(N_ARGS, dtype=np.int64)
    vr = np.zeros((MAX_REGIONS, R_LEN), dtype=np.int64)
    _fill_args(v, row, prog, ctr)
    kid, tile = prog.v_kernel[v], prog.v_tile[v]
    st = vertex_check(kid, row)
    if st != 0:
        fault(faults, counters, F_ARGS, s, tile, 0, loop, it, v, st)
        return
    _, nr = vertex_cost(kid, row, desc, vr)
    if nr < 0:
        fault(faults, counters, F_NO_REGIONS, s, tile, 0, loop, it, v, kid)
        return
    _check_regions(s, loop, it, v, tile, vr, nr, prog.b_ptr, prog.b_table, vbuf, faults,
                   counters, True)


@kjit
def _step_regions(i0, i1, s, loop, it, prog, ctr, desc, vbuf, vflag, skip, image, regs, vnr,
                  vbad, r_tile, r_owner, faults, counters):  # type: ignore[no-untyped-def]
    """After regions_parallel / regions_serial of numerics compute step s:
    the step's faults in vertex order (the run-time checks' of flagged
    vertices, then each flagged vertex's out-of-window regions, F_RANGE, and
    unwritten reads, F_UNINIT), and its regions compacted to the front of
    `regs` for the race check; returns their number.  A call of its own:
    inlined into the superstep loop, it slowed the timing-only path by a
    third."""
    tile_row, tile_base, tile_size = image.tile_row, image.tile_base, image.tile_size
    nreg = 0
    for j in range(i1 - i0):
        v = i0 + j
        if vflag[v] != 0:
            _report_vertex(v, s, loop, it, prog, ctr, desc, vbuf, faults, counters)
        if skip[j]:
            continue
        tile = prog.v_tile[v]
        trow, tb = tile_row[tile], tile_base[tile]
        for r in range(vnr[j]):
            k = 8 * j + r
            lo, hi = region_span(regs[k])
            if hi <= lo:
                continue
            if vbad[j] != 0:  # inside a live tensor buffer, so inside the image
                # window unless the image is not the package's
                if trow < 0 or lo < tb or hi > tb + tile_size[tile]:
                    fault(faults, counters, F_RANGE, s, tile, lo, loop, it, v, hi - lo)
                    skip[j] = True
                    continue
                if regs[k, 6] == 0:
                    bad = first_unwritten(image.written, trow, regs[k, 0] - tb, regs[k])
                    if bad >= 0:
                        fault(faults, counters, F_UNINIT, s, tile, bad + tb, loop, it, v, 0)
            if nreg != k:  # compacted: nreg <= k, rows ahead stay untouched
                regs[nreg, :] = regs[k]
            r_tile[nreg] = tile
            r_owner[nreg] = v
            nreg += 1
    return nreg


@kjit_host
def _superstep_loop(prog, desc, devv, numerics, image, stage, out, opts, scratch):  # type: ignore[no-untyped-def]
    step_kind, step_vtx, step_xfer = prog.step_kind, prog.step_vtx, prog.step_xfer
    step_trips, step_match = prog.step_trips, prog.step_match
    v_tile, v_kernel = prog.v_tile, prog.v_kernel
    x_src_tile, x_dst_tile, x_bytes = prog.x_src_tile, prog.x_dst_tile, prog.x_bytes
    xp_ptr, loop_patch = prog.xp_ptr, prog.loop_patch
    cycles_per_step, tile_busy, faults = out.cycles_per_step, out.tile_busy, out.faults
    prof = out.prof
    t_start = ticks()
    bytes_in, bytes_out, counters = out.bytes_in, out.bytes_out, out.counters
    xsend, xrecv, x_lane, x_port = out.xsend, out.xrecv, prog.x_lane, prog.x_port
    parallel_min, checks = opts[OPT_PARALLEL_MIN], opts[OPT_CHECKS] != 0
    n_steps = step_kind.shape[0]
    n_tiles = tile_busy.shape[0]
    acc = np.zeros(n_tiles, dtype=np.int64)
    touched = np.zeros(n_tiles, dtype=np.int64)
    mark = np.zeros(n_tiles, dtype=np.bool_)
    ctr = np.zeros(max(n_steps, 1), dtype=np.int64)
    stack = np.zeros(MAX_REPEAT_DEPTH, dtype=np.int64)
    depth = 0
    max_vtx, max_xfer = 1, 1
    for s in range(n_steps):
        max_vtx = max(max_vtx, step_vtx[s + 1] - step_vtx[s])
        max_xfer = max(max_xfer, step_xfer[s + 1] - step_xfer[s])
    max_items = max(max_vtx, max_xfer)
    args = np.zeros((max_vtx if numerics else 1, N_ARGS), dtype=np.int64)
    # the race checks' regions: up to 8 per vertex of a compute step, 2 per
    # transfer of an exchange step; written before they are read, so left
    # unzeroed (zeroing tens of MB faults in every page, each run)
    n_reg_max = max(8 * max_vtx, 2 * max_xfer) if numerics else 1
    regs = np.empty((n_reg_max, R_LEN), dtype=np.int64)
    r_tile = np.empty(n_reg_max, dtype=np.int64)
    r_owner = np.empty(n_reg_max, dtype=np.int64)
    vnr = np.zeros(max_vtx if numerics else 1, dtype=np.int64)  # regions per vertex of a step
    vbad = np.zeros_like(vnr)  # 1: a vertex's region is out of range or reads unwritten bytes
    skip = np.zeros(max_items, dtype=np.bool_)
    status = np.zeros(max_vtx, dtype=np.int64)  # kernel status per vertex of a step
    spent = np.zeros(max_vtx, dtype=np.int64)  # ticks per vertex of a step
    # per transfer of a step: patched addresses, check_transfer bits (written
    # by the step's patch pass before any read)
    x_src, x_dst, xflag = scratch.x_src, scratch.x_dst, scratch.xflag
    vr = np.zeros((MAX_REGIONS, R_LEN), dtype=np.int64)
    race = np.zeros(3, dtype=np.int64)
    vcyc = np.full(v_tile.shape[0], -1, dtype=np.int64)  # cycles of unpatched vertices
    x_lead = prog.x_lead  # bytes out: each send of the schedule once
    # [start, end) of the buffer each region / transfer end was found in last
    # time (int32: addresses of one tile's memory); empty until found
    vbuf = np.zeros(v_tile.shape[0] * 16, dtype=np.int32)
    if parallel_min < SERIAL:  # large (8 regions per vertex); the prange also keeps
        for k in numba.prange(v_tile.shape[0] * 8):  # kjit_host's pipeline in use
            vbuf[2 * k] = 1
    else:  # not from the main thread: never enter the thread pool (execute)
        vbuf[0::2] = 1
    # the access-index row each transfer end was found in (check_transfer;
    # written by a step's first run, so read only once `xseen[step]`), and per
    # row the state of the exchange race proof (exchange_ends, race_rows)
    xrow = scratch.xrow
    xseen = np.zeros(max(n_steps, 1), dtype=np.bool_)
    rstamp = np.zeros(prog.b_table.shape[0] if numerics else 1, dtype=np.int64)
    rend = np.zeros_like(rstamp)
    rsrc = np.zeros_like(rstamp)
    rflag = np.zeros_like(rstamp)
    race_any = np.zeros(RACE_PARTS, dtype=np.bool_)  # race_rows_parallel's scratch
    xserial = np.int64(0)
    exact = opts[OPT_OVERLAP] != 0
    xbits = scratch.xbits  # check_ends per transfer (written by the step's image checks)
    # per chunk of a parallel exchange pass: per-tile counts, flagged transfers
    xhist = np.empty((X_CHUNKS, n_tiles), dtype=np.int64)
    xcnt = np.empty((X_CHUNKS, 3), dtype=np.int64)
    xok = scratch.xok  # unpatched transfers checked clean (cleared by numba_scratch.take)
    xhint = np.full(2 * (prog.b_ptr.shape[0] - 1), -1, dtype=np.int64)  # check_transfer hints
    vcost = np.zeros(v_tile.shape[0], dtype=np.int64)  # cycles of each vertex this step
    vflag = np.zeros(v_tile.shape[0], dtype=np.int64)  # its run-time check bits
    # timing only: an exchange step's per-tile bytes out and lane and port
    # cycles are the same in every execution (patches move addresses, not
    # tiles or bytes): kept in a row per step by its first execution and
    # replayed after.  A step inside a loop with no patched transfer whose
    # transfers all checked clean also keeps its bytes in (`xclean`), and is
    # then replayed without walking its transfers at all
    xrow_of = np.full(max(n_steps, 1), -1, dtype=np.int64)
    n_rows = 0
    if not numerics:
        for q in range(n_steps):
            if step_kind[q] == STEP_EXCHANGE and step_xfer[q + 1] > step_xfer[q]:
                xrow_of[q] = n_rows
                n_rows += 1
    agg_in = np.zeros((max(n_rows, 1) if not numerics else 1, n_tiles), dtype=np.int64)
    agg_out = np.zeros_like(agg_in)
    agg_sb = np.zeros_like(agg_in)  # lane and port cycles per tile
    agg_rb = np.zeros_like(agg_in)
    xclean = np.zeros(max(n_steps, 1), dtype=np.bool_)  # replayable (rows kept)
    xkept = np.zeros(max(n_steps, 1), dtype=np.bool_)  # out, lane and port rows kept
    total = np.int64(0)
    s = 0
    while s < n_steps:
        kind = step_kind[s]
        loop = stack[depth - 1] if depth > 0 else -1
        it = ctr[loop] if depth > 0 else 0
        if kind == STEP_REPEAT_BEGIN:
            ctr[s] = 0
            stack[depth] = s
            depth += 1
            s += 1
            continue
        if kind == STEP_REPEAT_END:
            b = step_match[s]
            cycles_per_step[s] += devv[DV_LOOP]
            total += devv[DV_LOOP]
            ctr[b] += 1
            if ctr[b] < step_trips[b]:
                patch_c = devv[DV_PATCH] * loop_patch[b]
                cycles_per_step[s] += patch_c
                total += patch_c
                s = b + 1
            else:
                depth -= 1
                s += 1
            continue
        n_touched = 0
        if kind == STEP_COMPUTE:
            i0, i1 = step_vtx[s], step_vtx[s + 1]
            nreg = 0
            t0 = ticks()
            if i1 - i0 >= parallel_min:
                _vertex_pass_parallel(i0, i1, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf,
                                      faults, counters, checks)
            else:
                _vertex_pass(i0, i1, s, prog, ctr, desc, vcyc, vcost, vflag, vbuf, faults,
                             counters, checks)
            t1 = ticks()
            prof[P_COST] += t1 - t0
            for v in range(i0, i1):
                tile = v_tile[v]
                c = vcost[v]
                if vflag[v] != 0 and not numerics:  # with numerics: below, in order
                    _report_vertex(v, s, loop, it, prog, ctr, desc, vbuf, faults, counters)
                if not mark[tile]:
                    mark[tile] = True
                    touched[n_touched] = tile
                    n_touched += 1
                acc[tile] += c
                if not numerics:
                    continue
                skip[v - i0] = (vflag[v] & 1) != 0
                if not skip[v - i0]:
                    _fill_args(v, args[v - i0], prog, ctr)
            step_c = np.int64(0)
            for k in range(n_touched):
                t = touched[k]
                step_c = max(step_c, acc[t])
                tile_busy[t] += acc[t]
                acc[t] = 0
                mark[t] = False
            counters[C_VERTICES] += i1 - i0
            if numerics:  # regions found and checked on the cores, faults reported in order
                if i1 - i0 >= parallel_min:
                    regions_parallel(i0, i1, v_tile, v_kernel, args, skip, image, regs, vnr, vbad)
                else:
                    regions_serial(i0, i1, v_tile, v_kernel, args, skip, image, regs, vnr, vbad)
                nreg = _step_regions(i0, i1, s, loop, it, prog, ctr, desc, vbuf, vflag, skip,
                                     image, regs, vnr, vbad, r_tile, r_owner, faults, counters)
                t2 = ticks()
                prof[P_CHECK] += t2 - t1
                if find_race(regs, r_tile, r_owner, nreg, race):
                    fault(faults, counters, F_RACE, s, r_tile[race[1]], race[2], loop, it,
                           r_owner[race[1]], r_owner[race[0]])
                    raced = True
                else:
                    raced = False
                t3 = ticks()
                prof[P_RACE] += t3 - t2
                par = not raced and i1 - i0 >= parallel_min
                if par:
                    execute_parallel(i0, i1, v_tile, v_kernel, args, skip, image, status, spent)
                else:
                    execute_serial(i0, i1, v_tile, v_kernel, args, skip, image, status, spent)
                t4 = ticks()
                prof[P_EXEC] += t4 - t3
                finish_execute(i0, i1, s, loop, it, v_tile, v_kernel, args, skip, image, vr,
                               status, spent, faults, counters, prof, par)
                if par:
                    mark_parallel(i0, i1, v_tile, v_kernel, args, skip, status, image)
                    prof[P_WRITTEN] += ticks() - t4
        elif kind == STEP_EXCHANGE and xclean[s]:
            t0 = ticks()
            r = xrow_of[s]
            for t in range(n_tiles):
                bytes_in[t] += agg_in[r, t]
                bytes_out[t] += agg_out[r, t]
                xsend[t] += agg_sb[r, t]
                xrecv[t] += agg_rb[r, t]
            counters[C_TRANSFERS] += step_xfer[s + 1] - step_xfer[s]
            step_c = prog.step_xcycles[s] + devv[DV_SYNC]  # the schedule's window
            prof[P_XCYCLES] += ticks() - t0
        elif kind == STEP_EXCHANGE:
            i0, i1 = step_xfer[s], step_xfer[s + 1]
            n = i1 - i0
            t0 = ticks()
            # on the cores with numerics only (their checks look every buffer up
            # once); a timing-only step's transfers mostly hit the rows found
            # last time (xrow) or are clean (xok)
            xpar = numerics and n >= parallel_min
            if xpar:  # bytes in per tile by chunk in xhist, flagged transfers in xcnt
                xserial += 1  # stamps the rows of sources (exchange_ends)
                xfer_pass_parallel(i0, i1, s, loop, it, prog, ctr, x_src, x_dst, xflag, xseen[s],
                                   xrow, xok, faults, counters, checks, image, skip, xbits,
                                   xhist, xcnt, rsrc, xserial)
                chunks = x_chunks(n)
                if xcnt[:chunks, C_FLAGGED].sum() > 0:  # their faults, in order
                    report_flagged(i0, i1, s, loop, it, prog, x_src, x_dst, xflag, xrow, xhint,
                                   faults, counters)
                bytes_in_hist(xhist, chunks, bytes_in)
            else:  # inline here: through a call taking `prog` this loop ran 14x slower
                for x in range(i0, i1):
                    xfer_one(x, x - i0, s, loop, it, prog, ctr, x_src, x_dst, xflag, xseen[s], xrow,
                             xhint, xok, faults, counters, checks, True)
                    skip[x - i0] = (xflag[x - i0] & 1) != 0
                    bytes_in[x_dst_tile[x]] += x_bytes[x]
            xseen[s] = True
            t1 = ticks()
            prof[P_XFER] += t1 - t0
            r = xrow_of[s]
            if r >= 0 and not xkept[s]:
                keep_exchange_row(i0, i1, r, prog, agg_out, agg_sb, agg_rb)
                xkept[s] = True
            if xkept[s]:  # each send once; lanes and ports as booked
                for t in range(n_tiles):
                    bytes_out[t] += agg_out[r, t]
                    xsend[t] += agg_sb[r, t]
                    xrecv[t] += agg_rb[r, t]
            else:
                for x in range(i0, i1):
                    if x_lead[x]:
                        bytes_out[x_src_tile[x]] += x_bytes[x]
                    xsend[x_src_tile[x]] += x_lane[x]
                    xrecv[x_dst_tile[x]] += x_port[x]
            step_c = prog.step_xcycles[s] + devv[DV_SYNC]  # the schedule's window
            if r >= 0 and depth > 0 and xp_ptr[i0] == xp_ptr[i1]:
                xclean[s] = keep_bytes_in(i0, i1, r, prog, xflag, agg_in)
            counters[C_TRANSFERS] += n
            t2 = ticks()
            prof[P_XCYCLES] += t2 - t1
            if numerics:
                if xpar:  # the pass on the cores checked the ends, stamped the sources
                    n_self = xcnt[:x_chunks(n), C_SELF].sum()
                    if xcnt[:x_chunks(n), C_ENDS].sum() > 0:
                        exchange_ends(i0, i1, s, loop, it, prog, x_src, x_dst, skip, image, xrow,
                                      xbits, rsrc, xserial, faults, counters, True)
                else:
                    ends_serial(i0, i1, prog, x_src, x_dst, skip, image, xbits)
                    xserial += 1
                    n_self = exchange_ends(i0, i1, s, loop, it, prog, x_src, x_dst, skip, image,
                                           xrow, xbits, rsrc, xserial, faults, counters, False)
                if exact:
                    clash = True
                elif xpar:
                    clash = race_rows_parallel(i0, i1, prog, x_dst, skip, xrow, rstamp, rend,
                                               rsrc, rflag, xserial, race_any)
                else:
                    clash = race_rows_serial(i0, i1, prog, x_dst, skip, xrow, rstamp, rend,
                                             rsrc, rflag, xserial)
                raced = clash and exchange_race(i0, i1, s, loop, it, prog, x_src, x_dst, skip,
                                                xrow, rflag, xserial, exact, regs, r_tile,
                                                r_owner, race, faults, counters)
                t3 = ticks()
                prof[P_XCHECK] += t3 - t2
                if not raced and n_self == 0 and n >= parallel_min:
                    copy_parallel(i0, i1, prog, x_src, x_dst, skip, image)  # and marks
                else:
                    copy_serial(i0, i1, prog, x_src, x_dst, skip, image, stage, raced)
                    mark_copied(i0, i1, prog, x_dst, skip, image)
                prof[P_XCOPY] += ticks() - t3
        else:
            step_c = np.int64(0)
        if kind == STEP_EXCHANGE and prog.x_sched[s, 0] != 0:  # after the step's own faults
            fault(faults, counters, F_SCHEDULE, s, prog.x_sched[s, 1], prog.x_sched[s, 2], loop,
                  it, prog.x_sched[s, 3], prog.x_sched[s, 0])
        cycles_per_step[s] += step_c
        total += step_c
        s += 1
    counters[C_CYCLES] = total
    prof[P_TOTAL] += ticks() - t_start
