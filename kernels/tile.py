"""What one tile's kernels know about the tile they run on: the tile descriptor.

`kernels` imports nothing from `simulator` or `planner`; the simulator builds a
`TileDesc` from its Device (`Device.tile_desc()`), whose `[costs]` table holds
every constant named in `KERNEL_COSTS`.  `as_array()` gives the flat int64 form
the jitted cycle models take; the index of field `f` is the module constant
`D_<F>` (a test holds the constants to `DESC_FIELDS`).

Units: cycles, bytes, elements.  A *slot* is one instruction issue of one
worker: the six workers of an IPU tile share the pipeline in a round-robin
barrel, so a worker issues once every `workers` cycles and `s` slots of one
worker cost `s * workers` cycles.  A *grain* is the unit a kernel splits its
work by.  The kernels' docstrings give each formula.

No value lives here: the constants come from the device (the `c600` preset is
their least-squares fit to published IPU21 measurements, `c600-ideal` the
uncalibrated first model; see simulator/calibrate.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# (name, minimum, maximum, meaning) of every cost constant a kernel cycle model reads
KERNEL_COSTS: tuple[tuple[str, int, int, str], ...] = (
    ("conflict_percent", 100, 1000,
     "work cycles in percent when two operand streams share a memory element"),
    ("vector_bytes", 1, 64,
     "bytes one vector load/store/op moves (lanes = vector_bytes / element)"),
    # AMP matrix multiply (MATMUL, BATCH_MATMUL)
    ("mm_call", 0, 1 << 20,
     "cycles of one GEMM call (supervisor, worker start, coefficient setup)"),
    ("mm_panel", 0, 1 << 16, "cycles to load one coefficient panel (K grain x N grain of B)"),
    ("mm_row", 0, 1 << 10, "cycles per row of A streamed through one panel"),
    ("mm_min_rows", 1, 1 << 12, "rows below which the AMP pipeline costs as many as this"),
    ("mm_k_grain_fp8", 1, 1 << 10, "K elements per fp8 panel"),
    ("mm_k_grain_fp16", 1, 1 << 10, "K elements per fp16 panel"),
    ("mm_n_grain", 1, 1 << 10, "output columns per panel"),
    # REDUCE
    ("reduce_call", 0, 1 << 20, "cycles of one reduction call"),
    ("reduce_grain", 1, 1 << 10, "elements per worker chunk"),
    ("reduce_chunk", 0, 1 << 12, "slots per chunk (load the first partial, convert, store)"),
    ("reduce_partial", 0, 1 << 12, "slots per chunk per further partial (or bias)"),
    # ADD, BIAS_ADD and a matmul's fused bias
    ("add_call", 0, 1 << 20, "cycles of one elementwise add call"),
    ("add_slots", 0, 1 << 12,
     "slots per vector group (workers x lanes elements) of one contiguous run"),
    ("add_row_slots", 0, 1 << 12, "slots per vector group on the row-by-row path"),
    ("add_row", 0, 1 << 16, "cycles per further row on the row-by-row path"),
    # GELU
    ("gelu_call", 0, 1 << 20, "cycles of one GELU call"),
    ("gelu_block_elems", 1, 1 << 10, "elements of one worker block"),
    ("gelu_block", 0, 1 << 16, "cycles per block when the row is a whole number of blocks"),
    ("gelu_tail_block", 0, 1 << 16, "cycles per block on the checked path (row with a tail)"),
    ("gelu_pair", 0, 1 << 16, "cycles per tail pair of elements"),
    ("gelu_tail_setup", 0, 1 << 16, "extra cycles of the worker that handles the tail"),
    ("gelu_row", 0, 1 << 16, "cycles per further non-contiguous row"),
    # LAYERNORM
    ("ln_call", 0, 1 << 20, "cycles of one layernorm call"),
    ("ln_row", 0, 1 << 20, "cycles per row (worker rendezvous, row statistics, 1/sqrt)"),
    ("ln_stats", 0, 1 << 16, "cycles per workers x 8 elements of the statistics pass"),
    ("ln_chunk", 0, 1 << 16, "cycles per workers x 4 elements of moments and apply"),
    # SOFTMAX: whole rows per worker, or split rows (workers / split_rows per row)
    ("softmax_call", 0, 1 << 20, "cycles of one whole-row softmax call"),
    ("softmax_row", 0, 1 << 16, "slots per row (whole rows)"),
    ("softmax_panel", 0, 1 << 16, "slots per panel of keys (whole rows)"),
    ("softmax_panel_keys", 1, 1 << 10, "keys per panel"),
    ("softmax_split_call", 0, 1 << 20, "cycles of one split-row softmax call"),
    ("softmax_split_rows", 1, 64, "rows processed together on the split path"),
    ("softmax_split_panel", 0, 1 << 16, "slots per panel of keys per worker (split rows)"),
    ("softmax_split_row", 0, 1 << 16, "slots per row round (split rows: combine partial max/sum)"),
    ("softmax_split_round", 0, 1 << 16, "cycles per round of `workers` rows (split rows)"),
    # CAST
    ("cast_call", 0, 1 << 20, "cycles of one conversion call"),
    ("cast_grain", 1, 1 << 10, "elements per worker chunk"),
    ("cast_slots", 0, 1 << 12, "slots per chunk"),
    ("cast_row", 0, 1 << 16, "cycles per further non-contiguous row"),
    # COPY, TRANSPOSE
    ("copy_call", 0, 1 << 20, "cycles of one local copy call (supervisor + worker rendezvous)"),
    ("copy_bytes_per_cycle", 1, 1 << 10, "bytes a tile copies per cycle"),
    ("copy_row", 0, 1 << 16, "cycles per further non-contiguous row"),
    ("transpose_call", 0, 1 << 20, "cycles of one transpose call"),
    ("transpose_rows", 1, 1 << 10, "source rows per group (shared by the workers)"),
    ("transpose_group", 0, 1 << 16, "cycles per group of rows"),
    ("transpose_pair", 0, 1 << 16, "cycles per group per pair of columns"),
)

DESC_FIELDS: tuple[str, ...] = ("workers", "element_bytes", "memory_base") + tuple(
    f for f, _, _, _ in KERNEL_COSTS)

D_WORKERS = 0
D_ELEMENT_BYTES = 1
D_MEMORY_BASE = 2
D_CONFLICT_PERCENT = 3
D_VECTOR_BYTES = 4
D_MM_CALL = 5
D_MM_PANEL = 6
D_MM_ROW = 7
D_MM_MIN_ROWS = 8
D_MM_K_GRAIN_FP8 = 9
D_MM_K_GRAIN_FP16 = 10
D_MM_N_GRAIN = 11
D_REDUCE_CALL = 12
D_REDUCE_GRAIN = 13
D_REDUCE_CHUNK = 14
D_REDUCE_PARTIAL = 15
D_ADD_CALL = 16
D_ADD_SLOTS = 17
D_ADD_ROW_SLOTS = 18
D_ADD_ROW = 19
D_GELU_CALL = 20
D_GELU_BLOCK_ELEMS = 21
D_GELU_BLOCK = 22
D_GELU_TAIL_BLOCK = 23
D_GELU_PAIR = 24
D_GELU_TAIL_SETUP = 25
D_GELU_ROW = 26
D_LN_CALL = 27
D_LN_ROW = 28
D_LN_STATS = 29
D_LN_CHUNK = 30
D_SOFTMAX_CALL = 31
D_SOFTMAX_ROW = 32
D_SOFTMAX_PANEL = 33
D_SOFTMAX_PANEL_KEYS = 34
D_SOFTMAX_SPLIT_CALL = 35
D_SOFTMAX_SPLIT_ROWS = 36
D_SOFTMAX_SPLIT_PANEL = 37
D_SOFTMAX_SPLIT_ROW = 38
D_SOFTMAX_SPLIT_ROUND = 39
D_CAST_CALL = 40
D_CAST_GRAIN = 41
D_CAST_SLOTS = 42
D_CAST_ROW = 43
D_COPY_CALL = 44
D_COPY_BYTES_PER_CYCLE = 45
D_COPY_ROW = 46
D_TRANSPOSE_CALL = 47
D_TRANSPOSE_ROWS = 48
D_TRANSPOSE_GROUP = 49
D_TRANSPOSE_PAIR = 50
D_LEN = 51


@dataclass(frozen=True)
class TileDesc:
    """The tile as its kernels see it: worker count, SRAM element size (bytes),
    memory base address and the cost constants (`values`: one int per
    DESC_FIELDS name, in that order)."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.values) != D_LEN:
            raise ValueError(f"TileDesc needs {D_LEN} values ({DESC_FIELDS}), "
                             f"got {len(self.values)}")

    @classmethod
    def from_mapping(cls, fields: Mapping[str, int]) -> TileDesc:
        """A TileDesc from a mapping with every DESC_FIELDS name; a missing
        name raises KeyError naming it."""
        missing = [f for f in DESC_FIELDS if f not in fields]
        if missing:
            raise KeyError(f"tile descriptor fields missing: {missing}")
        return cls(tuple(int(fields[f]) for f in DESC_FIELDS))

    def __getattr__(self, name: str) -> int:
        if name == "values":  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        try:
            return self.values[DESC_FIELDS.index(name)]
        except ValueError:
            raise AttributeError(name) from None

    def as_array(self) -> np.ndarray:
        return np.asarray(self.values, dtype=np.int64)
