"""Link: a scheduled, allocated Program → a `simulator.Package` (contracts §3).

Two entry points, called before and after allocation:

`reserve(program, sched, device)` sizes what occupies tile memory besides
tensors:
- code and exchange tables by the footprint model (simulator.footprint), from
  the schedule's vertices and transfers and the exchange schedule, made here
  before allocation: the sends (`simulator.xschedule.send_leaders`: a source
  is its buffer and offset and its patch, all known before allocation) and
  their pieces (`simulator.xschedule.schedule`: tiles, bytes and sends are
  all it reads; long unicasts cut into pieces of CUT_INSTRUCTIONS send
  instructions where that ends their step sooner).  `link` writes that
  schedule into the package, so the tables hold every row it issues; a
  receive counts as following the previous one only when it lands in the
  same buffer at the next offset (all that is known before allocation), so
  the reservation bounds what the package's addresses need;
- support = `costs.support_bytes` + Repeat patch tables, on every tile that
  holds a buffer, a vertex or a transfer endpoint.

A patch table holds one `TABLE_ENTRY_BYTES` (8-byte little-endian int64) entry
per loop iteration and lives in the support buffer of the tile whose vertex or
transfer endpoint it patches (a transfer's source address: the source tile;
its destination address: the destination tile).  Tables are reserved before
allocation for every `seq` ref (refs with `iter_stride` are arithmetic by
construction) and shared between refs with the same tile and the same
(buffer, offset) sequence.  After allocation a `seq` whose addresses happen to
be exactly base + i·stride becomes an arithmetic patch; its reserved table is
then unused slack in the support buffer (the reservation is never larger than
the tables a fully non-arithmetic link would need).

Each sized region is rounded up to the device alignment and laid out from
`memory_base`: code, exchange tables, support; the tensor range follows.

`link(...)` resolves every ref to an absolute address (iteration-0 values in
`v_args` / `x_*_addr`), emits one patch per iterated ref (driven by the
innermost enclosing REPEAT_BEGIN), writes the memory map (tensor buffers with
their live ranges, then per tile code / exchange-table / support buffers live
for the whole program), the I/O blocks of `Program.io`, and the footprint:
`fp_code/fp_xtable/fp_support` are the region sizes, `fp_tensor_lo` the first
tensor-range address, `fp_tensor_hi` the end of the highest placed tensor
buffer (= `fp_tensor_lo` on a tile without tensors) and `fp_tensor` their
difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

from kernels.abi import (
    BUF_CODE,
    BUF_SUPPORT,
    BUF_XTABLE,
    PATCH_ARITH,
    PATCH_TABLE,
    PATCH_VERTEX_ARG,
    PATCH_XFER_DST,
    PATCH_XFER_SRC,
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TABLE_ENTRY_BYTES,
)
from kernels.registry import KERNELS
from planner.lowering.allocate import Allocation, Overheads
from planner.lowering.columns import BufColumns, BufMemo, buf_columns
from planner.lowering.program import Program, Ref
from planner.lowering.provenance import step_provenance
from planner.lowering.schedule import COMPUTE, EXCHANGE, REPEAT_BEGIN, REPEAT_END, Schedule
from simulator.device import Device
from simulator.footprint import code_bytes, follows_previous, xtable_bytes
from simulator.package import IoTensor, Package
from simulator.xschedule import schedule, send_leaders
from tilecommon.errors import BuildFailure

# long unicast sends are scheduled cut into pieces of this many send
# instructions where that ends their step sooner (simulator.xschedule.
# schedule's `piece`; 0: never).  Measured on the 27-layer siglip-so400m-map
# plan (8 steps): pieces of 1 instruction (256 bytes) took 1.0 % off its
# cycles, but made 1.56 M pieces where whole sends are 0.83 M (each a send
# row and a receive row in the tables), 2.5 s more planning and 2.52 GB of
# peak memory; pieces of 4 took 0.41 % off with 0.98 M pieces, 0.6 s and
# no more memory.
CUT_INSTRUCTIONS = 4

_STEP_CODES = {
    COMPUTE: STEP_COMPUTE,
    EXCHANGE: STEP_EXCHANGE,
    REPEAT_BEGIN: STEP_REPEAT_BEGIN,
    REPEAT_END: STEP_REPEAT_END,
}

TableKey = tuple[int, tuple[tuple[int, int], ...]]

@dataclass(frozen=True)
class Reservation:
    """Per-tile overheads and where each shared patch table sits: `tables`
    maps (tile, seq) to the byte offset of its table inside the tile's patch
    table area (which starts `costs.support_bytes` into the support buffer).
    `bufs` are the program's buffer columns, read once for reserve,
    allocate and link."""

    overheads: Overheads
    tables: dict[TableKey, int]
    used: np.ndarray  # bool[tiles]: tile holds anything
    bufs: BufColumns
    # the exchange schedule (simulator.xschedule.schedule: `x_send` and the
    # pieces), made before allocation from tiles, bytes and the sends; the
    # exchange tables are sized from its pieces, and link writes it as is
    exchange: dict[str, np.ndarray]

    def support_addr(self, device: Device) -> np.ndarray:
        """Absolute address of each tile's support buffer."""
        return device.memory_base + self.overheads.code + self.overheads.xtable


def _round(n: np.ndarray, a: int) -> np.ndarray:
    return -(-n // a) * a


def reserve(program: Program, sched: Schedule, device: Device,
            memo: BufMemo | None = None) -> Reservation:
    """Size code, exchange-table and support bytes per tile (module docstring);
    `memo`: a build state's buffer-column memo."""
    tiles = device.tiles
    used = np.zeros(tiles, dtype=bool)
    table_bytes = np.zeros(tiles, dtype=np.int64)
    tables: dict[TableKey, int] = {}
    cols = buf_columns(program, memo)
    tile_of = cols.tile
    used[tile_of] = True

    def trips_at(step: int) -> int:
        loop = sched.loop_of[step]
        return sched.steps[loop].trips if loop >= 0 else 0

    v = sched.vertex_arrays()
    used[v.tile] = True
    for k, r in zip(v.iterated.tolist(), v.iter_refs, strict=True):
        if r.seq:
            vi = int(v.ref_vertex[k])
            _reserve_table(tables, table_bytes, int(v.tile[vi]), r, trips_at(int(v.step[vi])))
    x = sched.transfers()
    ts, td = tile_of[x.src_buf], tile_of[x.dst_buf]
    used[ts] = True
    used[td] = True
    # a source's identity before allocation: its buffer and offset (a table
    # patch's first entry, as link resolves it) and its patch (an arithmetic
    # stride, or the table's entries): what the package's sends share
    src_key = (x.src_buf << 32) + x.src_off
    patch = np.zeros(src_key.size, dtype=np.int64)
    arith = np.flatnonzero(x.src_stride != 0)
    if arith.size:
        patch[arith] = np.unique(x.src_stride[arith], return_inverse=True)[1].reshape(-1) + 1
    seq_ids: dict[tuple[tuple[int, int], ...], int] = {}
    for i in x.seq.tolist():
        src, dst = x.refs(i)
        if src.seq:
            _reserve_table(tables, table_bytes, int(ts[i]), src, trips_at(int(x.step[i])))
            src_key[i] = (src.seq[0][0] << 32) + src.seq[0][1]
            patch[i] = arith.size + 1 + seq_ids.setdefault(src.seq, len(seq_ids))
        if dst.seq:
            _reserve_table(tables, table_bytes, int(td[i]), dst, trips_at(int(x.step[i])))
    xptr = np.concatenate([[0], np.cumsum(np.bincount(x.step, minlength=len(sched.steps)))])
    x_send = send_leaders(xptr, ts, td, x.nbytes, src_key, patch, tiles)
    exchange = schedule(device, xptr, ts, td, x.nbytes, x_send,
                        piece=CUT_INSTRUCTIONS * device.costs.send_max_bytes)
    _check_kernels(v.tile, v.kernel)
    a = device.alignment
    code = _round(code_bytes(device, used, v.tile, v.kernel, v.step, len(sched.loops())), a)
    dst_key = (x.dst_buf << 32) + x.dst_off
    follows = follows_previous(x.step, td, dst_key, dst_key + x.nbytes)
    # a send row per piece of the schedule, a receive row per piece heard
    xtable = _round(xtable_bytes(device, x.step, ts, td, follows, x_send, exchange["q_send"],
                                 exchange["q_bytes"]), a)
    support = np.where(used, _round(device.costs.support_bytes + table_bytes, a),
                       0).astype(np.int64)
    return Reservation(Overheads(code, xtable, support), tables, used, cols, exchange)




def _check_kernels(tile: np.ndarray, kernel: np.ndarray) -> None:
    """Raises BuildFailure naming the first unknown kernel id (in (tile,
    kernel) order)."""
    bad = ~np.isin(kernel, np.array(sorted(KERNELS), dtype=np.int64))
    if bad.any():
        order = np.lexsort((kernel, tile))
        first = order[bad[order]][0]
        raise BuildFailure("link", int(tile[first]), 0, 0,
                           f"unknown kernel id {int(kernel[first])}")


def _reserve_table(tables: dict[TableKey, int], table_bytes: np.ndarray, tile: int, r: Ref,
                   trips: int) -> None:
    key = (tile, r.seq)
    if key in tables:
        return
    tables[key] = int(table_bytes[tile])
    table_bytes[tile] += max(trips, len(r.seq)) * TABLE_ENTRY_BYTES


class _Patches:
    """Patch rows collected in program order."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, int, int, int, int, int]] = []
        self.values: list[int] = []
        self.lens: list[int] = []
        self.chunks: list[np.ndarray] = []  # row blocks [n, 9]; `rows` is flushed first
        self.arith = 0
        self.table = 0

    def _flush(self) -> None:
        if self.rows:
            self.chunks.append(np.asarray(self.rows, dtype=np.int64).reshape(-1, 9))
            self.rows = []

    def arith_rows(self, target: int, index: np.ndarray, loop: np.ndarray, base: np.ndarray,
                   stride: np.ndarray) -> None:
        """Arithmetic patches of many transfer endpoints at once."""
        n = index.size
        if n == 0:
            return
        self._flush()
        block = np.empty((n, 9), dtype=np.int64)
        block[:, 0] = target
        block[:, 1] = index
        block[:, 2] = 0
        block[:, 3] = loop
        block[:, 4] = PATCH_ARITH
        block[:, 5] = base
        block[:, 6] = stride
        block[:, 7:] = -1
        self.chunks.append(block)
        self.lens.extend([0] * n)
        self.arith += n

    def arith_row(self, target: int, index: int, arg: int, loop: int, base: int,
                  stride: int) -> None:
        self.rows.append((target, index, arg, loop, PATCH_ARITH, base, stride, -1, -1))
        self.lens.append(0)
        self.arith += 1

    def add(self, target: int, index: int, arg: int, loop: int, addrs: list[int],
            table_at: tuple[int, int]) -> None:
        """Arithmetic if `addrs` is exactly base + i·stride, else the table at
        `table_at` = (tile, address)."""
        base = addrs[0]
        stride = addrs[1] - addrs[0] if len(addrs) > 1 else 0
        if all(a == base + i * stride for i, a in enumerate(addrs)):
            self.arith_row(target, index, arg, loop, base, stride)
            return
        tile, addr = table_at
        self.rows.append((target, index, arg, loop, PATCH_TABLE, 0, 0, tile, addr))
        self.values.extend(addrs)
        self.lens.append(len(addrs))
        self.table += 1

    def arrays(self) -> dict[str, np.ndarray]:
        self._flush()
        r = np.concatenate(self.chunks) if self.chunks else np.zeros((0, 9), dtype=np.int64)
        names = ["p_target", "p_index", "p_arg", "p_loop", "p_mode", "p_base", "p_stride",
                 "p_table_tile", "p_table_addr"]
        out = {n: np.ascontiguousarray(r[:, j]) for j, n in enumerate(names)}
        out["p_table"] = np.concatenate([[0], np.cumsum(self.lens)]).astype(np.int64)
        out["table_values"] = np.asarray(self.values, dtype=np.int64)
        return out


@dataclass(frozen=True)
class LinkStats:
    """Counts for reports: patches by mode, table entries, buffers."""

    arithmetic_patches: int
    table_patches: int
    table_entries: int
    buffers: int


def link(
    program: Program,
    sched: Schedule,
    alloc: Allocation,
    res: Reservation,
    device: Device,
    name: str,
    meta: dict[str, Any],
    owners: Mapping[str, tuple[str, str, str]] | None = None,
) -> tuple[Package, LinkStats]:
    """Lower to a Package; raises BuildFailure("link", ...) on a seq whose length
    differs from its loop's trips or an iterated ref outside a loop.  `owners`
    (planner.lowering.provenance.label_owners of the lowering) gives the
    package's provenance."""
    addr = alloc.addr
    cols = res.bufs
    tile_of = cols.tile
    assert len(cols) == len(program.bufs), "reservation of another program"
    support_addr = res.support_addr(device)
    patches = _Patches()

    def resolve(r: Ref, step: int, tile: int, target: int, index: int, arg: int) -> int:
        a0 = addr_l[r.buf] + r.offset
        loop = sched.loop_of[step]
        if loop < 0:
            raise BuildFailure("link", tile, 0, 0, f"step {step}: iterated ref outside a Repeat")
        trips = sched.steps[loop].trips
        if r.seq:
            if len(r.seq) != trips:
                raise BuildFailure("link", tile, 0, 0,
                                   f"step {step}: seq of {len(r.seq)} addresses in a "
                                   f"{trips}-trip Repeat")
            addrs = [addr_l[b] + o for b, o in r.seq]
            off = res.tables[(tile, r.seq)]
            at = (tile, int(support_addr[tile]) + device.costs.support_bytes + off)
            patches.add(target, index, arg, loop, addrs, at)
            return addrs[0]
        patches.arith_row(target, index, arg, loop, a0, r.iter_stride)
        return a0

    steps = sched.steps
    kinds = [_STEP_CODES[st.kind] for st in steps]
    trips_col = [st.trips if st.kind == REPEAT_BEGIN else 0 for st in steps]
    match_col = [st.match for st in steps]
    nv = [len(st.vertices) for st in steps]
    nx = [len(st.transfers) for st in steps]
    addr_l = addr.tolist()
    v = sched.vertex_arrays()
    # plain refs in bulk; then the iterated ones in (vertex, ref) order, as
    # their patches are numbered
    v_args = v.args.copy()
    plain = np.ones(v.ref_arg.size, dtype=bool)
    plain[v.iterated] = False
    v_args[v.ref_vertex[plain], v.ref_arg[plain]] = addr[v.ref_buf[plain]] + v.ref_off[plain]
    for k, r in zip(v.iterated.tolist(), v.iter_refs, strict=True):
        vi = int(v.ref_vertex[k])
        v_args[vi, r.arg] = resolve(r, int(v.step[vi]), int(v.tile[vi]), PATCH_VERTEX_ARG, vi,
                                    r.arg)
    x = sched.transfers()
    x_src_tile, x_dst_tile = tile_of[x.src_buf], tile_of[x.dst_buf]
    x_src_addr = addr[x.src_buf] + x.src_off
    x_dst_addr = addr[x.dst_buf] + x.dst_off
    loop_of = np.asarray(sched.loop_of, dtype=np.int64)
    for target, stride in ((PATCH_XFER_SRC, x.src_stride), (PATCH_XFER_DST, x.dst_stride)):
        idx = np.flatnonzero(stride != 0)
        if idx.size and (loop_of[x.step[idx]] < 0).any():
            bad = int(idx[np.argmax(loop_of[x.step[idx]] < 0)])
            raise BuildFailure("link", -1, 0, 0,
                               f"step {int(x.step[bad])}: iterated ref outside a Repeat")
        base = x_src_addr[idx] if target == PATCH_XFER_SRC else x_dst_addr[idx]
        patches.arith_rows(target, idx, loop_of[x.step[idx]], base, stride[idx])
    for i in x.seq.tolist():
        (src, dst), s = x.refs(i), int(x.step[i])
        if src.seq:
            x_src_addr[i] = resolve(src, s, int(x_src_tile[i]), PATCH_XFER_SRC, i, 0)
        if dst.seq:
            x_dst_addr[i] = resolve(dst, s, int(x_dst_tile[i]), PATCH_XFER_DST, i, 0)

    i64 = np.int64
    a: dict[str, np.ndarray] = {
        "step_kind": np.asarray(kinds, dtype=i64),
        "step_vtx": np.concatenate([[0], np.cumsum(nv)]).astype(i64),
        "step_xfer": np.concatenate([[0], np.cumsum(nx)]).astype(i64),
        "step_trips": np.asarray(trips_col, dtype=i64),
        "step_match": np.asarray(match_col, dtype=i64),
        "v_tile": v.tile,  # read-only schedule columns: the package may share them
        "v_kernel": v.kernel,
        "v_args": v_args,
    }
    a.update(x_src_tile=x_src_tile, x_src_addr=x_src_addr, x_dst_tile=x_dst_tile,
             x_dst_addr=x_dst_addr, x_bytes=x.nbytes)
    # the exchange schedule the tables were sized for
    a.update(res.exchange)
    a.update(patches.arrays())
    names, bufs = _memory_map(cols, sched, alloc, res, device)
    a.update(bufs)
    a.update(_io_arrays(program, addr, tile_of))
    a.update(_footprint(alloc, res))
    io = tuple(IoTensor(d["name"], d["role"], tuple(d["shape"]), d["dtype"],
                        int(d.get("scale_exp", 0))) for d in program.io_tensors)
    pkg = Package(name=name, device=device, io=io, buffer_names=names, arrays=a,
                  meta=meta, provenance=step_provenance(sched, owners))
    stats = LinkStats(patches.arith, patches.table, len(patches.values), len(names))
    return pkg, stats


def _memory_map(cols: BufColumns, sched: Schedule, alloc: Allocation, res: Reservation,
                device: Device) -> tuple[tuple[str, ...], dict[str, np.ndarray]]:
    """Buffer names and the `buf_*` arrays: the program's tensor buffers (kind
    code = index in TENSOR_KINDS), then per tile code, exchange-table and
    support buffers."""
    last_step = max(len(sched.steps) - 1, 0)
    names = [cols.names]
    tiles_l = [cols.tile]
    addr_l = [alloc.addr]
    bytes_l = [cols.nbytes]
    kind_l = [cols.kind]
    first_l = [alloc.first]
    last_l = [alloc.last]
    o = res.overheads
    starts = {
        BUF_CODE: device.memory_base + np.zeros(device.tiles, dtype=np.int64),
        BUF_XTABLE: device.memory_base + o.code,
        BUF_SUPPORT: res.support_addr(device),
    }
    for kind, label, sizes in ((BUF_CODE, "code", o.code), (BUF_XTABLE, "xtable", o.xtable),
                               (BUF_SUPPORT, "support", o.support)):
        ts = np.flatnonzero(sizes > 0).astype(np.int64)
        names.append(tuple(f"{label}@{t}" for t in ts.tolist()))
        tiles_l.append(ts)
        addr_l.append(starts[kind][ts])
        bytes_l.append(sizes[ts])
        kind_l.append(np.full(ts.size, kind, dtype=np.int64))
        first_l.append(np.zeros(ts.size, dtype=np.int64))
        last_l.append(np.full(ts.size, last_step, dtype=np.int64))
    cat = np.concatenate
    return tuple(chain.from_iterable(names)), {
        "buf_tile": cat(tiles_l).astype(np.int64, copy=False),
        "buf_addr": cat(addr_l).astype(np.int64, copy=False),
        "buf_bytes": cat(bytes_l).astype(np.int64, copy=False),
        "buf_kind": cat(kind_l).astype(np.int64, copy=False),
        "buf_first": cat(first_l).astype(np.int64, copy=False),
        "buf_last": cat(last_l).astype(np.int64, copy=False),
    }


def _io_arrays(program: Program, addr: np.ndarray, tile_of: np.ndarray) -> dict[str, np.ndarray]:
    index = {d["name"]: i for i, d in enumerate(program.io_tensors)}
    blocks = program.io
    n = len(blocks)
    tensor = [index.get(t, -1) for t in map(attrgetter("tensor"), blocks)]
    if -1 in tensor:
        blk = blocks[tensor.index(-1)]
        raise BuildFailure("link", int(tile_of[blk.buf]), 0, 0,
                           f"io block of {blk.tensor}: not in Program.io_tensors")
    buf = np.fromiter(map(attrgetter("buf"), blocks), dtype=np.int64, count=n)
    off = np.fromiter(map(attrgetter("offset"), blocks), dtype=np.int64, count=n)

    def triples(name: str) -> np.ndarray:
        values = chain.from_iterable(map(attrgetter(name), blocks))
        return np.fromiter(values, dtype=np.int64, count=3 * n).reshape(n, 3)

    return {
        "io_tensor": np.asarray(tensor, dtype=np.int64).reshape(n),
        "io_tile": tile_of[buf],
        "io_addr": addr[buf] + off,
        "io_lo": triples("lo"),
        "io_hi": triples("hi"),
        "io_ld0": np.fromiter(map(attrgetter("ld0"), blocks), dtype=np.int64, count=n),
        "io_ld1": np.fromiter(map(attrgetter("ld1"), blocks), dtype=np.int64, count=n),
    }


def _footprint(alloc: Allocation, res: Reservation) -> dict[str, np.ndarray]:
    o = res.overheads
    return {
        "fp_code": o.code.astype(np.int64),
        "fp_xtable": o.xtable.astype(np.int64),
        "fp_support": o.support.astype(np.int64),
        "fp_tensor_lo": alloc.tensor_lo.astype(np.int64),
        "fp_tensor_hi": alloc.tensor_top.astype(np.int64),
        "fp_tensor": (alloc.tensor_top - alloc.tensor_lo).astype(np.int64),
    }
