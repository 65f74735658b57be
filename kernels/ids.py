"""Stable kernel ids and the shape of the vertex ABI (contracts §2).

Ids never change meaning once a package has been saved with them.
"""

from __future__ import annotations

MATMUL = 1
BATCH_MATMUL = 2
REDUCE = 3
ADD = 4
BIAS_ADD = 5
LAYERNORM = 6
GELU = 7
SOFTMAX = 8
CAST = 9
COPY = 10
TRANSPOSE = 11

N_ARGS = 16  # int64 args per vertex
MAX_REGIONS = 8  # rows of the vertex_regions `out` array
REGION_COLS = 7  # (addr, outer, outer_stride, rows, ld, row_bytes, is_write)

# matmul flags (arg 11)
FLAG_TRANS_B = 1
FLAG_ACCUMULATE = 2
