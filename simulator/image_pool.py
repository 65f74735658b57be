"""The memory image's mappings, kept from one numerics run to the next.

A fresh anonymous mapping is faulted in a 4 KiB page at a time on first
touch, and unmapping it frees every page again.  The image of siglip-so400m
1 layer on c600 touches about 60k pages (~240 MB of bytes and their bitmap);
at about 1.8 us a fault on the 2-core development machine (a touch of one
byte per page of a new 400 MB mapping: 0.18 s).  With the unmapping (and the
engine's own scratch, since trimmed), a run spent 0.6 s of kernel time on
the two cores, of 2.1 s of CPU time.

So `simulator.run` hands its image back (`give`) once it has read the
outputs, and the next image that fits in the kept mappings reuses them
(`take`): only the bytes the previous image could have written are zeroed,
on both cores when called from the main thread.  After a run without faults
every byte written is marked in the bitmap (the image builder, the
exchange's copies and every vertex that ran mark what they write), so only
the 64-byte blocks under its non-zero words are zeroed, with the words:
about a fifth of the windows for siglip-so400m 1 layer.  After a run with
faults (a kernel that failed leaves its writes unmarked) each row's whole
window is zeroed, and the bitmap words over it (the engine and the image
builder write nowhere else: an access outside a tile's window is a fault,
not a write).  Every other byte is still zero, so a reused image is
indistinguishable from a fresh one.

One slot, and only mappings of at most KEEP_BYTES together (1.5 GiB): a
process holds at most that much after its runs.  `release()` drops the
slot, `kept_bytes()` says what it holds.  An image a caller built itself
(`simulator.run.build_image`) is never taken back: it stays the caller's.
"""

from __future__ import annotations

import mmap
import threading
from typing import NamedTuple

import numba
import numpy as np

from tilecommon.jit import kjit, kjit_inline, kjit_parallel

KEEP_BYTES = 1536 << 20


class _Slot(NamedTuple):
    mem: np.ndarray  # uint8, flat over its own mapping
    bits: np.ndarray  # uint64, flat over its own mapping
    width: int  # the last image's row width (bytes) ...
    sizes: np.ndarray  # ... and window per row: where it may have written
    marked: bool  # every byte it wrote is marked in `bits`


_lock = threading.Lock()
_slot: list[_Slot] = []


def take(rows: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed (mem uint8 [rows, width], written uint64 [rows, ceil(width / 64)])
    for an image, from the kept mappings when they are large enough."""
    words = -(-width // 64)
    with _lock:
        slot = _slot.pop() if _slot else None
    if slot is None or slot.mem.size < rows * width or slot.bits.size < rows * words:
        return (_mapped(rows * width, np.uint8).reshape(rows, width),
                _mapped(rows * words, np.uint64).reshape(rows, words))
    if threading.current_thread() is threading.main_thread():
        _zero_parallel(slot.mem, slot.bits, slot.width, slot.sizes, slot.marked)
    else:  # the thread pool is entered from the main thread only (tilecommon.jit)
        _zero_serial(slot.mem, slot.bits, slot.width, slot.sizes, slot.marked)
    mem = slot.mem[: rows * width].reshape(rows, width)
    return mem, slot.bits[: rows * words].reshape(rows, words)


def give(mem: np.ndarray, written: np.ndarray, sizes: np.ndarray, marked: bool = False) -> None:
    """Keep an image's mappings (from `take`, no longer used) for the next
    `take`; `sizes[r]` is the window of row r, the bytes that may hold data;
    `marked`: every byte written is marked in `written` (a run without
    faults), so the next `take` zeroes only those."""
    flat_mem, flat_bits = mem.base, written.base  # the arrays over the mappings
    if not (isinstance(flat_mem, np.ndarray) and isinstance(flat_mem.base, memoryview)
            and isinstance(flat_bits, np.ndarray) and isinstance(flat_bits.base, memoryview)):
        return
    if flat_mem.nbytes + flat_bits.nbytes > KEEP_BYTES:
        return
    slot = _Slot(flat_mem, flat_bits, int(mem.shape[1]),
                 np.ascontiguousarray(sizes[: mem.shape[0]], dtype=np.int64), bool(marked))
    with _lock:
        _slot[:] = [slot]


def kept_bytes() -> int:
    """Bytes of mapping the pool holds for the next image (0 when empty)."""
    with _lock:
        return sum(k.mem.nbytes + k.bits.nbytes for k in _slot)


def release() -> None:
    """Drop the kept mappings (their pages go back when nothing else holds them)."""
    with _lock:
        _slot.clear()


def _mapped(count: int, dtype: type) -> np.ndarray:
    """A zero-filled flat array on its own anonymous mapping, faulted in
    lazily with small pages.  (np.zeros asks for transparent huge pages; on a
    busy machine each first touch of a huge page can stall for milliseconds in
    memory compaction, and an image is touched sparsely, tile by tile.)"""
    nbytes = max(count * np.dtype(dtype).itemsize, 1)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype=dtype, count=count)


@kjit_parallel
def _zero_parallel(mem, bits, width, sizes, marked):  # type: ignore[no-untyped-def]
    """`_zero_serial` on the machine's cores, a row at a time."""
    for r in numba.prange(sizes.size):
        _zero_row(mem, bits, width, sizes, marked, r)


@kjit
def _zero_serial(mem, bits, width, sizes, marked):  # type: ignore[no-untyped-def]
    """Zero what each row r of the flat [rows, width] layout may hold: if
    `marked`, the 64-byte blocks of its first sizes[r] bytes whose bitmap
    word is non-zero, else all of them; and the bitmap words over them."""
    for r in range(sizes.size):
        _zero_row(mem, bits, width, sizes, marked, r)


@kjit_inline
def _zero_row(mem, bits, width, sizes, marked, r):  # type: ignore[no-untyped-def]
    """Row r of `_zero_serial` (one exit: it is inlined into a parallel loop)."""
    words = (width + 63) // 64
    if not marked:
        mem[r * width:r * width + sizes[r]] = 0
        bits[r * words:r * words + (sizes[r] + 63) // 64] = 0
    else:
        for k in range((sizes[r] + 63) // 64):
            if bits[r * words + k] != 0:
                bits[r * words + k] = 0
                mem[r * width + 64 * k:r * width + min(64 * k + 64, sizes[r])] = 0
