"""Cycle models: monotone in size, large fp8 matmuls near peak, tiny vertices
dominated by overhead, memory-element conflicts change the count."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import dispatch, ids
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32
from kernels.registry import KERNELS, by_name
from kernels.tile import D_AMP_FP8, D_OVERHEAD, TileDesc

DESC = TileDesc().as_array()
BASE = TileDesc().memory_base
ELEM = TileDesc().element_bytes
SEED = 3


def _matmul(m: int, k: int, n: int, in_dt: int = DT_FP8, out_dt: int = DT_FP16,
            conflict: bool = False) -> int:
    """Cycles of an M x K x N matmul with A, B, C each in its own elements
    (or A and B in one element when `conflict`)."""
    a = BASE
    b = BASE + (64 if conflict else 4 * ELEM)
    c = BASE + 12 * ELEM
    args = by_name("MATMUL").make_args(a=a, lda=k, b=b, ldb=n, c=c, ldc=2 * n, M=m, K=k, N=n,
                                       in_dtype=in_dt, out_dtype=out_dt)
    return int(dispatch.vertex_cycles(ids.MATMUL, args, DESC))


def _peak_fraction(m: int, k: int, n: int) -> float:
    return m * k * n / DESC[D_AMP_FP8] / _matmul(m, k, n)


def test_large_fp8_matmul_reaches_90_percent_of_peak() -> None:
    for shape in [(128, 256, 128), (96, 512, 64), (192, 128, 256)]:
        assert _peak_fraction(*shape) >= 0.90, shape


def test_tiny_matmul_dominated_by_overhead() -> None:
    cycles = _matmul(2, 8, 8)
    assert cycles < 2 * DESC[D_OVERHEAD]
    assert _peak_fraction(2, 8, 8) < 0.05
    assert _peak_fraction(32, 32, 32) < _peak_fraction(64, 64, 64) < _peak_fraction(128, 256, 128)


def test_fp16_matmul_at_half_the_fp8_rate() -> None:
    fp8 = _matmul(120, 256, 128) - DESC[D_OVERHEAD]
    fp16 = _matmul(120, 256, 128, in_dt=DT_FP16) - DESC[D_OVERHEAD]
    assert fp16 == 2 * fp8


def test_conflict_penalty_changes_count() -> None:
    plain = _matmul(64, 64, 64)
    clash = _matmul(64, 64, 64, conflict=True)
    assert clash == DESC[D_OVERHEAD] + 2 * (plain - DESC[D_OVERHEAD])
    ln = by_name("LAYERNORM")
    far = ln.make_args(x=BASE, ldx=128, gamma=BASE + 3 * ELEM, beta=BASE + 5 * ELEM,
                       y=BASE + ELEM, ldy=128, M=8, N=64)
    near = ln.make_args(x=BASE, ldx=128, gamma=BASE + 3 * ELEM, beta=BASE + 5 * ELEM,
                        y=BASE + 2048, ldy=128, M=8, N=64)
    assert dispatch.vertex_conflict(ids.LAYERNORM, near, DESC)
    assert not dispatch.vertex_conflict(ids.LAYERNORM, far, DESC)
    assert ln.cycles(near, DESC) > ln.cycles(far, DESC)
    # a block that merely straddles an element boundary still conflicts with its neighbour
    edge = ln.make_args(x=BASE + ELEM - 128, ldx=128, gamma=BASE + 3 * ELEM,
                        beta=BASE + 5 * ELEM, y=BASE + ELEM + 512, ldy=128, M=8, N=64)
    assert dispatch.vertex_conflict(ids.LAYERNORM, edge, DESC)


def test_accumulate_reads_and_writes_c_without_self_conflict() -> None:
    mm = by_name("MATMUL")
    args = mm.make_args(a=BASE, lda=64, b=BASE + 4 * ELEM, ldb=64, c=BASE + 8 * ELEM, ldc=256,
                        M=16, K=64, N=64, in_dtype=DT_FP8, out_dtype=DT_FP32,
                        flags=ids.FLAG_ACCUMULATE)
    assert not dispatch.vertex_conflict(ids.MATMUL, args, DESC)


def _scaled(spec_name: str, args: np.ndarray, field: str, value: int) -> np.ndarray:
    a = args.copy()
    a[by_name(spec_name).arg_names.index(field)] = value
    return a


MONOTONE_FIELDS = {
    "MATMUL": ("M", "K", "N"), "BATCH_MATMUL": ("M", "K", "N", "batch"),
    "REDUCE": ("M", "N", "k"), "ADD": ("M", "N"), "BIAS_ADD": ("M", "N"),
    "LAYERNORM": ("M", "N"), "GELU": ("M", "N"), "SOFTMAX": ("M", "N"), "CAST": ("M", "N"),
    "COPY": ("rows", "row_bytes"), "TRANSPOSE": ("M", "N"),
}


@pytest.mark.parametrize("name", sorted(MONOTONE_FIELDS))
def test_monotone_in_every_size_argument(name: str) -> None:
    spec = by_name(name)
    # operands far apart: no conflicts, so only the size changes
    addr = {f: BASE + i * 4 * ELEM for i, f in enumerate(
        ("a", "b", "c", "x", "y", "parts", "out", "src", "dst", "bias", "gamma", "beta"))}
    named: dict[str, int] = {f: v for f, v in addr.items() if f in spec.arg_names}
    dtypes = {"in_dtype": DT_FP8, "out_dtype": DT_FP32, "dtype_a": DT_FP16, "dtype_b": DT_FP16,
              "dtype_c": DT_FP16, "dtype_x": DT_FP16, "dtype_y": DT_FP8, "elem_bytes": 2}
    named.update({f: v for f, v in dtypes.items() if f in spec.arg_names})
    base_args = spec.make_args(**named)
    rng = np.random.default_rng(SEED)
    for field in MONOTONE_FIELDS[name]:
        for _ in range(20):
            sizes = {f: int(rng.integers(1, 40)) for f in MONOTONE_FIELDS[name]}
            args = base_args.copy()
            for f, v in sizes.items():
                args = _scaled(name, args, f, v)
            prev = spec.cycles(args, DESC)
            for bigger in range(sizes[field] + 1, sizes[field] + 80, 7):
                cur = spec.cycles(_scaled(name, args, field, bigger), DESC)
                assert cur >= prev, (field, sizes, bigger)
                prev = cur
        big = spec.cycles(_scaled(name, base_args, field, 4000), DESC)
        small = spec.cycles(_scaled(name, base_args, field, 1), DESC)
        assert big > small, field
    assert set(MONOTONE_FIELDS) == {s.name for s in KERNELS.values()}
    assert DT_FP32 == 2
