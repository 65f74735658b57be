"""Status codes that `vertex_execute` returns (0 = ok) and their meaning.

The jitted bodies return a code instead of raising; the simulator turns a
non-zero code into a fault naming the step, tile, kernel and this text.
"""

from __future__ import annotations

OK = 0
BAD_KERNEL = 1  # unknown kernel id
BAD_DTYPE = 2  # a dtype arg is not one the kernel accepts
BAD_SHAPE = 3  # a shape arg (M, K, N, rows, batch, k, elem_bytes) is < 1
BAD_FLAGS = 4  # unknown flag bits, or accumulate with a non-fp32 output
BAD_STRIDE = 5  # a row stride is smaller than the row it has to hold

_TEXT = {
    OK: "ok",
    BAD_KERNEL: "unknown kernel id",
    BAD_DTYPE: "unsupported dtype argument",
    BAD_SHAPE: "shape argument < 1",
    BAD_FLAGS: "bad flags (unknown bits, or accumulate into a non-fp32 output)",
    BAD_STRIDE: "row stride smaller than the row bytes",
}


def describe(status: int) -> str:
    """One-line meaning of a status code (names unknown codes too)."""
    return _TEXT.get(int(status), f"unknown status code {int(status)}")
