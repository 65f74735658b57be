"""A tile image with a bump allocator, for kernel tests and benchmarks.

`TileImage.put` lays a 2-D array of codes (uint8 fp8, uint16 fp16, float32)
into the image with a chosen byte row stride and returns its absolute
address; `get` reads a block back.  Addresses are absolute (base included),
as in vertex args.
"""

from __future__ import annotations

import numpy as np

from kernels.tile import TileDesc

ALIGN = 8


class TileImage:
    """uint8 memory image of one tile starting at `base`, filled with `fill`."""

    def __init__(self, size: int, base: int = TileDesc().memory_base, fill: int = 0) -> None:
        self.mem = np.full(size, fill, dtype=np.uint8)
        self.base = base
        self.next = base

    def alloc(self, nbytes: int, at: int | None = None) -> int:
        """Reserve nbytes (8-aligned) at the bump pointer or at absolute `at`."""
        addr = self.next if at is None else at
        addr = (addr + ALIGN - 1) // ALIGN * ALIGN
        end = addr + nbytes
        if addr < self.base or end > self.base + self.mem.size:
            raise ValueError(f"block {addr:#x}+{nbytes} outside image "
                             f"{self.base:#x}+{self.mem.size}")
        self.next = max(self.next, end)
        return addr

    def put(self, block: np.ndarray, ld: int | None = None, at: int | None = None) -> int:
        """Store a 1-D or 2-D array of codes with row stride `ld` bytes; returns address."""
        b = np.atleast_2d(np.ascontiguousarray(block))
        rows, row_bytes = b.shape[0], b.shape[1] * b.itemsize
        stride = row_bytes if ld is None else ld
        addr = self.alloc(stride * (rows - 1) + row_bytes, at)
        raw = b.view(np.uint8).reshape(rows, row_bytes)
        for r in range(rows):
            off = addr - self.base + r * stride
            self.mem[off:off + row_bytes] = raw[r]
        return addr

    def get(self, addr: int, rows: int, cols: int, ld: int, dtype: type) -> np.ndarray:
        """rows x cols elements of numpy `dtype` at `addr`, row stride `ld` bytes."""
        item = np.dtype(dtype).itemsize
        out = np.empty((rows, cols * item), dtype=np.uint8)
        for r in range(rows):
            off = addr - self.base + r * ld
            out[r] = self.mem[off:off + cols * item]
        return out.view(dtype).reshape(rows, cols)
