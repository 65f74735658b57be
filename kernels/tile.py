"""What one tile's kernels know about the tile they run on.

`kernels` imports nothing from `simulator` or `planner`; the simulator builds a
`TileDesc` from its Device.  `as_array()` gives the flat int64 form the jitted
cycle models take (indices are the `D_*` constants).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

D_AMP_FP8 = 0
D_AMP_FP16 = 1
D_VEC_FP32 = 2
D_VEC_FP16 = 3
D_WORKERS = 4
D_ELEMENT = 5
D_BASE = 6
D_OVERHEAD = 7
D_LEN = 8


@dataclass(frozen=True)
class TileDesc:
    """Rates per cycle per tile, worker count, SRAM element size (bytes),
    memory base address and the fixed per-vertex overhead (cycles)."""

    amp_macs_fp8: int = 128
    amp_macs_fp16: int = 64
    vector_fp32: int = 2
    vector_fp16: int = 4
    workers: int = 6
    element_bytes: int = 16384
    memory_base: int = 0x4C000
    vertex_overhead: int = 40

    def as_array(self) -> np.ndarray:
        a = np.zeros(D_LEN, dtype=np.int64)
        a[D_AMP_FP8] = self.amp_macs_fp8
        a[D_AMP_FP16] = self.amp_macs_fp16
        a[D_VEC_FP32] = self.vector_fp32
        a[D_VEC_FP16] = self.vector_fp16
        a[D_WORKERS] = self.workers
        a[D_ELEMENT] = self.element_bytes
        a[D_BASE] = self.memory_base
        a[D_OVERHEAD] = self.vertex_overhead
        return a
