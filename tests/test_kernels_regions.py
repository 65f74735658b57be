"""vertex_regions covers exactly what the numeric bodies touch, for every kernel.

Writes: run a random vertex on an image whose free bytes hold a sentinel; every
byte that changed lies in a write region.  Reads: re-run the vertex on a copy
whose bytes outside every declared region are scrambled; the write regions must
come out identical, so the body read nothing it did not declare.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels import abi, dispatch
from kernels.registry import KERNELS
from kernels.testing import TileImage, random_vertex, region_mask

SEED = 7
VERTICES_PER_KERNEL = 12
SENTINEL = 0xA5


def _regions(kid: int, args: np.ndarray) -> tuple[np.ndarray, int]:
    out = np.full((abi.MAX_REGIONS, abi.REGION_COLS), -7, dtype=np.int64)
    n = dispatch.vertex_regions(kid, args, out)
    return out, int(n)


@pytest.mark.parametrize("kid", sorted(KERNELS))
def test_regions_cover_reads_and_writes(kid: int) -> None:
    rng = np.random.default_rng(SEED + kid)
    for _ in range(VERTICES_PER_KERNEL):
        img = TileImage(1 << 15, fill=SENTINEL)
        args = random_vertex(kid, rng, img)
        regions, n = _regions(kid, args)
        assert 1 <= n <= abi.MAX_REGIONS
        assert (regions[:n, 6] == 1).sum() >= 1
        size = img.mem.size
        writes = region_mask(regions, n, img.base, size, 1)
        reads = region_mask(regions, n, img.base, size, 0)
        before = img.mem.copy()
        assert dispatch.vertex_execute(kid, img.mem, img.base, args) == 0
        changed = img.mem != before
        assert changed.any(), "vertex wrote nothing"
        assert not (changed & ~writes).any(), f"{KERNELS[kid].name} wrote outside its regions"
        scrambled = before.copy()
        outside = ~(reads | writes)
        scrambled[outside] = rng.integers(0, 256, size=int(outside.sum()), dtype=np.uint8)
        assert dispatch.vertex_execute(kid, scrambled, img.base, args) == 0
        np.testing.assert_array_equal(scrambled[writes], img.mem[writes])


def test_accumulate_matmul_reports_c_as_read_and_write() -> None:
    spec = KERNELS[abi.MATMUL]
    args = spec.make_args(a=0x4C000, lda=16, b=0x4C100, ldb=16, c=0x4C200, ldc=64, M=3, K=16,
                          N=16, in_dtype=0, out_dtype=2, flags=abi.FLAG_ACCUMULATE, bias=0x4C400)
    regions, n = _regions(abi.MATMUL, args)
    rows = {tuple(int(v) for v in r) for r in regions[:n]}
    assert rows == {
        (0x4C000, 1, 0, 3, 16, 16, 0),   # A
        (0x4C100, 1, 0, 16, 16, 16, 0),  # B (K x N fp8)
        (0x4C400, 1, 0, 1, 0, 32, 0),    # bias fp16[16]
        (0x4C200, 1, 0, 3, 64, 64, 0),   # C read
        (0x4C200, 1, 0, 3, 64, 64, 1),   # C write
    }
