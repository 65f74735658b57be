"""Assemble packages by hand: for tests and benchmarks of the simulator.

`PackageBuilder` records buffers, steps, vertices, transfers, Repeat loops,
patches and I/O blocks in program order and `build()` turns them into a
`Package`.  With `support=True` (the default) `build()` also adds, on every tile
that holds anything, a code buffer, an exchange-table buffer and a support
buffer at the top of tile memory, sized by the verifier's rules
(`simulator.verify.required_bytes`), live for the whole program, and places
table patches without an explicit address into that support buffer; the
footprint arrays are computed from the buffers.

Example::

    b = PackageBuilder(load_device("tiny"))
    x = b.buffer("x", tile=0, addr=b.base, nbytes=64)
    (v,) = b.compute((0, COPY, {0: b.base, ...}))
    pkg = b.build()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.abi import (
    BUF_CODE,
    BUF_SUPPORT,
    BUF_XTABLE,
    BUFFER_KIND_NAMES,
    IO_DIMS,
    N_ARGS,
    PATCH_ARITH,
    PATCH_TABLE,
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TABLE_ENTRY_BYTES,
    TENSOR_KINDS,
)
from simulator.device import Device
from simulator.package import IoTensor, Package
from simulator.verify import required_bytes

Args = dict[int, int] | Sequence[int]


@dataclass
class _Patch:
    target: int
    index: int
    arg: int
    loop: int
    mode: int
    base: int
    stride: int
    values: tuple[int, ...]
    tile: int
    addr: int | None


class PackageBuilder:
    """Mutable recorder of one hand-written program (test helper only)."""

    def __init__(self, device: Device, name: str = "handmade") -> None:
        self.device = device
        self.name = name
        self.base = device.memory_base
        self.buffers: list[tuple[str, int, int, int, int, int, int | None]] = []
        self.steps: list[tuple[int, int]] = []  # (kind, trips)
        self.step_items: list[list[int]] = []
        self.vertices: list[tuple[int, int, list[int]]] = []
        self.transfers: list[tuple[int, int, int, int, int]] = []
        self.patches: list[_Patch] = []
        self.io_tensors: list[IoTensor] = []
        self.io_rows: list[tuple[int, int, int, list[int], list[int], int, int]] = []
        self._open: list[int] = []
        self._auto: dict[int, int] = {}  # tile -> bytes of auto-placed tables

    # ---- memory ----------------------------------------------------------------
    def buffer(self, name: str, tile: int, addr: int, nbytes: int, kind: str = "activation",
               first: int = 0, last: int | None = None) -> int:
        """Add a buffer; `last=None` means live to the end of the program."""
        self.buffers.append((name, tile, addr, nbytes, BUFFER_KIND_NAMES.index(kind), first, last))
        return len(self.buffers) - 1

    # ---- program ---------------------------------------------------------------
    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def compute(self, *vertices: tuple[int, int, Args]) -> list[int]:
        """One COMPUTE step of (tile, kernel id, args) vertices; returns their indices."""
        ids = []
        for tile, kid, args in vertices:
            full = [0] * N_ARGS
            items = args.items() if isinstance(args, dict) else enumerate(args)
            for k, v in items:
                full[k] = int(v)
            self.vertices.append((tile, kid, full))
            ids.append(len(self.vertices) - 1)
        self.steps.append((STEP_COMPUTE, 0))
        self.step_items.append(ids)
        return ids

    def exchange(self, *transfers: tuple[int, int, int, int, int]) -> list[int]:
        """One EXCHANGE step of (src tile, src addr, dst tile, dst addr, bytes)."""
        ids = []
        for t in transfers:
            self.transfers.append(tuple(int(v) for v in t))  # type: ignore[arg-type]
            ids.append(len(self.transfers) - 1)
        self.steps.append((STEP_EXCHANGE, 0))
        self.step_items.append(ids)
        return ids

    def repeat(self, trips: int) -> int:
        """Open a Repeat loop; returns the REPEAT_BEGIN step index (patches' `loop`)."""
        self.steps.append((STEP_REPEAT_BEGIN, trips))
        self.step_items.append([])
        self._open.append(len(self.steps) - 1)
        return len(self.steps) - 1

    def end_repeat(self) -> int:
        self.steps.append((STEP_REPEAT_END, 0))
        self.step_items.append([])
        self._open.pop()
        return len(self.steps) - 1

    def patch(self, target: int, index: int, arg: int, loop: int, base: int, stride: int) -> None:
        """Arithmetic patch: value = base + i*stride (target 0 vertex arg, 1 src, 2 dst)."""
        self.patches.append(_Patch(target, index, arg, loop, PATCH_ARITH, base, stride, (), -1, -1))

    def patch_table(self, target: int, index: int, arg: int, loop: int, values: Sequence[int],
                    tile: int = -1, addr: int | None = None) -> None:
        """Table patch: value = values[i]; the table goes into the support buffer of
        `tile` (default: the vertex's or transfer's tile) unless `addr` is given."""
        self.patches.append(
            _Patch(target, index, arg, loop, PATCH_TABLE, 0, 0, tuple(values), tile, addr)
        )

    # ---- io --------------------------------------------------------------------
    def io(self, name: str, role: str, shape: Sequence[int], dtype: str,
           scale_exp: int = 0) -> int:
        self.io_tensors.append(IoTensor(name, role, tuple(shape), dtype, scale_exp))
        return len(self.io_tensors) - 1

    def io_block(self, tensor: int, tile: int, addr: int, lo: Sequence[int], hi: Sequence[int],
                 ld0: int, ld1: int) -> None:
        """A block [lo, hi) of tensor (leading dims padded to 3 with 0..1)."""
        pad = IO_DIMS - len(lo)
        self.io_rows.append(
            (tensor, tile, addr, [0] * pad + list(lo), [1] * pad + list(hi), ld0, ld1)
        )

    # ---- build -----------------------------------------------------------------
    def build(self, support: bool = True, meta: dict[str, Any] | None = None) -> Package:
        assert not self._open, "unclosed Repeat"
        dev = self.device
        n_steps = len(self.steps)
        a = self._program_arrays()
        buffers = list(self.buffers)
        tables = self._table_rows(a)
        if support:
            buffers += self._support_buffers(a, tables)
        names = [b[0] for b in buffers]
        last_step = max(n_steps - 1, 0)
        a["buf_tile"] = np.array([b[1] for b in buffers], dtype=np.int64)
        a["buf_addr"] = np.array([b[2] for b in buffers], dtype=np.int64)
        a["buf_bytes"] = np.array([b[3] for b in buffers], dtype=np.int64)
        a["buf_kind"] = np.array([b[4] for b in buffers], dtype=np.int64)
        a["buf_first"] = np.array([b[5] for b in buffers], dtype=np.int64)
        a["buf_last"] = np.array([last_step if b[6] is None else b[6] for b in buffers],
                                 dtype=np.int64)
        a["p_table_tile"] = np.array([t for t, _ in tables], dtype=np.int64)
        a["p_table_addr"] = np.array([ad for _, ad in tables], dtype=np.int64)
        a.update(_footprint(dev, a))
        return Package(name=self.name, device=dev, io=tuple(self.io_tensors),
                       buffer_names=tuple(names), arrays=a, meta=dict(meta or {}))

    def _program_arrays(self) -> dict[str, np.ndarray]:
        i64 = np.int64
        kinds = [k for k, _ in self.steps]
        a: dict[str, np.ndarray] = {
            "step_kind": np.array(kinds, dtype=i64),
            "step_trips": np.array([t for _, t in self.steps], dtype=i64),
        }
        match = np.full(len(kinds), -1, dtype=i64)
        stack: list[int] = []
        for s, k in enumerate(kinds):
            if k == STEP_REPEAT_BEGIN:
                stack.append(s)
            elif k == STEP_REPEAT_END:
                b = stack.pop()
                match[b], match[s] = s, b
        a["step_match"] = match
        pairs = list(zip(kinds, self.step_items, strict=True))
        nv = [len(ids) if k == STEP_COMPUTE else 0 for k, ids in pairs]
        nx = [len(ids) if k == STEP_EXCHANGE else 0 for k, ids in pairs]
        a["step_vtx"] = np.concatenate([[0], np.cumsum(nv)]).astype(i64)
        a["step_xfer"] = np.concatenate([[0], np.cumsum(nx)]).astype(i64)
        a["v_tile"] = np.array([v[0] for v in self.vertices], dtype=i64)
        a["v_kernel"] = np.array([v[1] for v in self.vertices], dtype=i64)
        a["v_args"] = np.array([v[2] for v in self.vertices], dtype=i64).reshape(-1, N_ARGS)
        for j, name in enumerate(["x_src_tile", "x_src_addr", "x_dst_tile", "x_dst_addr",
                                  "x_bytes"]):
            a[name] = np.array([t[j] for t in self.transfers], dtype=i64)
        ps = self.patches
        for name in ["target", "index", "arg", "loop", "mode", "base", "stride"]:
            a[f"p_{name}"] = np.array([getattr(p, name) for p in ps], dtype=i64)
        lens = [len(p.values) for p in ps]
        a["p_table"] = np.concatenate([[0], np.cumsum(lens)]).astype(i64)
        a["table_values"] = np.array([v for p in ps for v in p.values], dtype=i64)
        a["io_tensor"] = np.array([r[0] for r in self.io_rows], dtype=i64)
        a["io_tile"] = np.array([r[1] for r in self.io_rows], dtype=i64)
        a["io_addr"] = np.array([r[2] for r in self.io_rows], dtype=i64)
        a["io_lo"] = np.array([r[3] for r in self.io_rows], dtype=i64).reshape(-1, IO_DIMS)
        a["io_hi"] = np.array([r[4] for r in self.io_rows], dtype=i64).reshape(-1, IO_DIMS)
        a["io_ld0"] = np.array([r[5] for r in self.io_rows], dtype=i64)
        a["io_ld1"] = np.array([r[6] for r in self.io_rows], dtype=i64)
        return a

    def _owner_tile(self, p: _Patch) -> int:
        if p.tile >= 0:
            return p.tile
        if p.target == 0:
            return self.vertices[p.index][0]
        t = self.transfers[p.index]
        return t[0] if p.target == 1 else t[2]

    def _table_rows(self, a: dict[str, np.ndarray]) -> list[tuple[int, int]]:
        """(tile, addr) per patch; auto-placed tables get addresses in the support
        buffer (placed at the top of memory by `_support_buffers`)."""
        self._auto = {}
        rows: list[tuple[int, int]] = []
        for p in self.patches:
            if p.mode == PATCH_ARITH:
                rows.append((-1, -1))
                continue
            tile = self._owner_tile(p)
            if p.addr is not None:
                rows.append((tile, p.addr))
                continue
            off = self._auto.get(tile, 0)
            self._auto[tile] = off + len(p.values) * TABLE_ENTRY_BYTES
            rows.append((tile, -(off + 1)))  # resolved once the support buffer is placed
        return rows

    def _support_buffers(self, a: dict[str, np.ndarray],
                         tables: list[tuple[int, int]]) -> list[tuple[Any, ...]]:
        dev = self.device
        used = {b[1] for b in self.buffers} | set(a["v_tile"].tolist())
        used |= set(a["x_src_tile"].tolist()) | set(a["x_dst_tile"].tolist())
        code, xtab = required_bytes(dev, a)
        out: list[tuple[Any, ...]] = []
        align = dev.alignment
        for tile in sorted(used):
            top = dev.memory_end
            table = _round_up(self._auto.get(tile, 0), align)
            sizes = [("support", BUF_SUPPORT, dev.costs.support_bytes + table),
                     ("code", BUF_CODE, _round_up(int(code[tile]), align)),
                     ("xtable", BUF_XTABLE, _round_up(int(xtab[tile]), align))]
            for label, kind, n in sizes:
                if n == 0:
                    continue
                top -= n
                out.append((f"{label}@{tile}", tile, top, n, kind, 0, None))
                if kind == BUF_SUPPORT:
                    for j, (t, addr) in enumerate(tables):
                        if t == tile and addr < 0:
                            tables[j] = (t, top + dev.costs.support_bytes + (-addr - 1))
        return out


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


def _footprint(dev: Device, a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tiles = dev.tiles
    fp = {k: np.zeros(tiles, dtype=np.int64) for k in ("fp_code", "fp_xtable", "fp_support")}
    for key, kind in (("fp_code", BUF_CODE), ("fp_xtable", BUF_XTABLE),
                      ("fp_support", BUF_SUPPORT)):
        m = a["buf_kind"] == kind
        np.add.at(fp[key], a["buf_tile"][m], a["buf_bytes"][m])
    lo = np.full(tiles, dev.memory_base, dtype=np.int64)
    hi = np.full(tiles, dev.memory_base, dtype=np.int64)
    tensor = np.isin(a["buf_kind"], TENSOR_KINDS)
    for tile in np.unique(a["buf_tile"][tensor]):
        m = tensor & (a["buf_tile"] == tile)
        lo[tile] = a["buf_addr"][m].min()
        hi[tile] = (a["buf_addr"][m] + a["buf_bytes"][m]).max()
    fp["fp_tensor_lo"], fp["fp_tensor_hi"], fp["fp_tensor"] = lo, hi, hi - lo
    return fp


# ---- example programs shared by the simulator tests ------------------------------------

M_KS, K_KS, N_KS, PARTS = 8, 128, 16, 4  # K-split matmul: 4 tiles, K slices of 32


def exact_fp8_values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Multiples of 1/8 in [-1, 1]: exact in fp8, and every product and K-sum of
    them is exact in fp32, so results do not depend on the summation order."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-8, 9, size=shape) / 8).astype(np.float32)


def ksplit_matmul(device: Device) -> tuple[Package, dict[str, np.ndarray],
                                           dict[str, np.ndarray], dict[str, np.ndarray]]:
    """out = fp16(a @ b + bias): a fp8 [8,128] input, b fp8 [128,16] and bias fp16 [16]
    parameters.  Tile t computes its K-slice into fp32 partials (step 0); tiles 1..3
    send them to tile 0 (step 1); tile 0 reduces the 4 partials + bias (step 2).
    Returns (package, params, inputs, expected outputs)."""
    from kernels.abi import MATMUL, REDUCE

    m, k, n, parts = M_KS, K_KS, N_KS, PARTS
    ks = k // parts
    base = device.memory_base
    b = PackageBuilder(device, "ksplit")
    a_io = b.io("a", "input", (m, k), "fp8")
    b_io = b.io("b", "parameter", (k, n), "fp8")
    bias_io = b.io("bias", "parameter", (n,), "fp16")
    out_io = b.io("out", "output", (m, n), "fp16")
    a_at, b_at, c_at = base, base + m * ks, base + m * ks + ks * n
    part = m * n * 4
    bias_at = c_at + parts * part
    out_at = bias_at + n * 2
    verts = []
    for t in range(parts):
        b.buffer(f"a{t}", t, a_at, m * ks, "activation", 0, 0)
        b.buffer(f"b{t}", t, b_at, ks * n, "parameter", 0, 0)
        b.io_block(a_io, t, a_at, (0, t * ks), (m, (t + 1) * ks), 0, ks)
        b.io_block(b_io, t, b_at, (t * ks, 0), ((t + 1) * ks, n), 0, n)
        verts.append((t, MATMUL, {0: a_at, 1: ks, 2: b_at, 3: n, 4: c_at, 5: n * 4, 6: m, 7: ks,
                                  8: n, 9: 0, 10: 2}))
        if t > 0:
            b.buffer(f"c{t}", t, c_at, part, "activation", 0, 1)
    b.buffer("parts", 0, c_at, parts * part, "exchange-landing", 0, 2)
    b.buffer("bias", 0, bias_at, 32, "parameter", 0, 2)
    b.buffer("out", 0, out_at, m * n * 2, "activation", 2, 2)
    b.io_block(bias_io, 0, bias_at, (0,), (n,), 0, 0)
    b.io_block(out_io, 0, out_at, (0, 0), (m, n), 0, n * 2)
    b.compute(*verts)
    b.exchange(*[(t, c_at, 0, c_at + t * part, part) for t in range(1, parts)])
    b.compute((0, REDUCE, {0: c_at, 1: n * 4, 2: part, 3: parts, 4: out_at, 5: n * 2, 6: m,
                           7: n, 8: 1, 9: bias_at}))
    a_val = exact_fp8_values((m, k), 1)
    b_val = exact_fp8_values((k, n), 2)
    bias = (np.arange(n, dtype=np.float32) - 8) / 4
    partials = [a_val[:, t * ks:(t + 1) * ks] @ b_val[t * ks:(t + 1) * ks] for t in range(parts)]
    total = np.zeros((m, n), np.float32)
    for p in partials:
        total = total + p
    expected = (total + bias).astype(np.float16).astype(np.float32)
    return b.build(), {"b": b_val, "bias": bias}, {"a": a_val}, {"out": expected}


ROWS_R, COLS_R = 4, 8
BLOCK_R = ROWS_R * COLS_R * 2  # one fp16 [4, 8] block


def repeat_program(device: Device, trips: int, unrolled: bool = False) -> Package:
    """y = x + sum_i w[i] (fp16, rounded after each add), hist[i] = partial sum i.

    Tile 0: COPY x -> A; loop i: ADD(cur, w[i]) -> nxt where (cur, nxt) ping-pong
    between A and B (table patches: not arithmetic), w[i] at W + i*64 (arithmetic
    patch); EXCHANGE nxt -> tile 1 hist + i*64 (table patch on the source,
    arithmetic patch on the destination); after the loop COPY the last nxt -> y.
    `unrolled=True` writes the same program with the loop body repeated."""
    from kernels.abi import ADD, COPY

    base = device.memory_base
    x_at, w_at = base, base + BLOCK_R
    a_at = w_at + trips * BLOCK_R
    b_at, y_at = a_at + BLOCK_R, a_at + 2 * BLOCK_R
    hist_at = base
    ld = COLS_R * 2
    b = PackageBuilder(device, f"repeat{trips}{'-unrolled' if unrolled else ''}")
    x_io = b.io("x", "input", (ROWS_R, COLS_R), "fp16")
    w_io = b.io("w", "parameter", (trips, ROWS_R, COLS_R), "fp16")
    y_io = b.io("y", "output", (ROWS_R, COLS_R), "fp16")
    h_io = b.io("hist", "output", (trips, ROWS_R, COLS_R), "fp16")
    b.buffer("x", 0, x_at, BLOCK_R, "activation", 0, 0)
    b.buffer("w", 0, w_at, trips * BLOCK_R, "parameter", 0, None)
    b.buffer("A", 0, a_at, BLOCK_R, "activation", 0, None)
    b.buffer("B", 0, b_at, BLOCK_R, "activation", 0, None)
    b.buffer("y", 0, y_at, BLOCK_R, "activation", 0, None)
    b.buffer("hist", 1, hist_at, trips * BLOCK_R, "exchange-landing", 0, None)
    b.io_block(x_io, 0, x_at, (0, 0), (ROWS_R, COLS_R), 0, ld)
    b.io_block(w_io, 0, w_at, (0, 0, 0), (trips, ROWS_R, COLS_R), BLOCK_R, ld)
    b.io_block(y_io, 0, y_at, (0, 0), (ROWS_R, COLS_R), 0, ld)
    b.io_block(h_io, 1, hist_at, (0, 0, 0), (trips, ROWS_R, COLS_R), BLOCK_R, ld)
    copy = {1: ld, 3: ld, 4: ROWS_R, 5: ld}
    b.compute((0, COPY, {**copy, 0: x_at, 2: a_at}))
    cur = [a_at if i % 2 == 0 else b_at for i in range(trips)]
    nxt = [b_at if i % 2 == 0 else a_at for i in range(trips)]

    def add(i: int) -> tuple[int, int, dict[int, int]]:
        return (0, ADD, {0: cur[i], 1: ld, 2: w_at + i * BLOCK_R, 3: ld, 4: nxt[i], 5: ld,
                         6: ROWS_R, 7: COLS_R, 8: 1, 9: 1, 10: 1})

    if unrolled:
        for i in range(trips):
            b.compute(add(i))
            b.exchange((0, nxt[i], 1, hist_at + i * BLOCK_R, BLOCK_R))
    else:
        loop = b.repeat(trips)
        (v,) = b.compute(add(0))
        (x,) = b.exchange((0, nxt[0], 1, hist_at, BLOCK_R))
        b.patch_table(0, v, 0, loop, cur)
        b.patch(0, v, 2, loop, w_at, BLOCK_R)
        b.patch_table(0, v, 4, loop, nxt)
        b.patch_table(1, x, 0, loop, nxt)
        b.patch(2, x, 0, loop, hist_at, BLOCK_R)
        b.end_repeat()
    b.compute((0, COPY, {**copy, 0: nxt[-1], 2: y_at}))
    return b.build()


def repeat_reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y, hist) of `repeat_program` in numpy with fp16 rounding after each add."""
    acc = x.astype(np.float16)
    hist = []
    for i in range(w.shape[0]):
        acc = (acc.astype(np.float32) + w[i].astype(np.float16).astype(np.float32)).astype(
            np.float16)
        hist.append(acc)
    return acc.astype(np.float32), np.stack(hist).astype(np.float32)
