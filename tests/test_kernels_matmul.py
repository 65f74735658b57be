"""MATMUL / BATCH_MATMUL numerics against a float64 product of the same decoded inputs.

fp32 outputs: relative Frobenius error <= 1e-6 against float64 (the only
difference is fp32 accumulation).  fp16 outputs: bit-identical to rounding the
same vertex's fp32 output once (one rounding point), and that fp32 output is
checked against float64 as above.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels import abi, dispatch
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, fp8_decode, fp16_decode, fp16_encode
from kernels.registry import by_name
from kernels.testing import TileImage, random_codes

SEED = 11
REL_TOL = 1e-6


def _decode(codes: np.ndarray, dt: int) -> np.ndarray:
    return fp8_decode(codes) if dt == DT_FP8 else fp16_decode(codes)


def _rel_fro(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30))


def _run_matmul(rng: np.random.Generator, m: int, k: int, n: int, in_dt: int, out_dt: int,
                trans_b: bool, accumulate: bool, bias: bool, scale_exp: int, pad: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Run one MATMUL; returns (output as float32, float64 expectation)."""
    img = TileImage(1 << 17)
    ib = 1 if in_dt == DT_FP8 else 2
    ob = 4 if out_dt == DT_FP32 else 2
    a = random_codes(rng, (m, k), in_dt)
    b = random_codes(rng, (n, k) if trans_b else (k, n), in_dt)
    lda, ldb, ldc = k * ib + pad, b.shape[1] * ib + pad, n * ob + pad
    a_addr = img.put(a, ld=lda)
    b_addr = img.put(b, ld=ldb)
    bias_codes = random_codes(rng, (n,), DT_FP16)
    old = random_codes(rng, (m, n), DT_FP32)
    c_addr = img.put(old, ld=ldc) if accumulate else img.alloc(ldc * (m - 1) + n * ob)
    flags = (abi.FLAG_TRANS_B if trans_b else 0) | (abi.FLAG_ACCUMULATE if accumulate else 0)
    args = by_name("MATMUL").make_args(
        a=a_addr, lda=lda, b=b_addr, ldb=ldb, c=c_addr, ldc=ldc, M=m, K=k, N=n,
        in_dtype=in_dt, out_dtype=out_dt, flags=flags, scale_exp=scale_exp,
        bias=img.put(bias_codes) if bias else 0)
    assert dispatch.vertex_execute(abi.MATMUL, img.mem, img.base, args) == 0
    bd = _decode(b, in_dt).astype(np.float64)
    want = _decode(a, in_dt).astype(np.float64) @ (bd.T if trans_b else bd) * 2.0**scale_exp
    if bias:
        want = want + fp16_decode(bias_codes)
    if accumulate:
        want = want + old
    got = img.get(c_addr, m, n, ldc, np.float32 if out_dt == DT_FP32 else np.uint16)
    return (got if out_dt == DT_FP32 else fp16_decode(got)), want


SHAPES = [(1, 1, 1), (1, 37, 5), (7, 13, 1), (5, 64, 33), (33, 17, 9), (64, 96, 48)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("in_dt", [DT_FP8, DT_FP16])
def test_matmul_fp32_out_close_to_float64(shape: tuple[int, int, int], in_dt: int) -> None:
    rng = np.random.default_rng(SEED + shape[0] * 100 + shape[2])
    for trans_b, accumulate, bias, scale_exp, pad in [
        (False, False, False, 0, 0), (True, False, True, -3, 8), (False, True, True, 2, 16),
        (True, True, False, -1, 24),
    ]:
        got, want = _run_matmul(rng, *shape, in_dt, DT_FP32, trans_b, accumulate, bias,
                                scale_exp, pad)
        assert _rel_fro(got, want) <= REL_TOL, (trans_b, accumulate, bias, scale_exp)


@pytest.mark.parametrize("in_dt", [DT_FP8, DT_FP16])
def test_matmul_fp16_out_is_one_rounding_of_fp32_out(in_dt: int) -> None:
    for i, (m, k, n) in enumerate(SHAPES):
        for trans_b in (False, True):
            got32, _ = _run_matmul(np.random.default_rng(SEED + i), m, k, n, in_dt, DT_FP32,
                                   trans_b, False, True, -2, 8)
            got16, _ = _run_matmul(np.random.default_rng(SEED + i), m, k, n, in_dt, DT_FP16,
                                   trans_b, False, True, -2, 8)
            np.testing.assert_array_equal(fp16_encode(got16), fp16_encode(got32))
            assert not np.array_equal(got16, got32) or m * n == 1


def test_fp8_matmul_exact_for_small_k() -> None:
    """With K <= 2 every fp32 sum of fp8 products is exact, so the result must be too."""
    rng = np.random.default_rng(SEED)
    got, want = _run_matmul(rng, 9, 2, 11, DT_FP8, DT_FP32, False, False, False, 0, 0)
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("trans_b, dt, scale", [(False, DT_FP16, 0), (True, DT_FP16, 0),
                                                (False, DT_FP8, -12), (True, DT_FP8, 5)])
def test_batch_matmul_per_batch(trans_b: bool, dt: int, scale: int) -> None:
    rng = np.random.default_rng(SEED + 5)
    img = TileImage(1 << 17)
    batch, m, k, n = 3, 5, 12, 7
    a = random_codes(rng, (batch, m, k), dt)
    b = random_codes(rng, (batch, n, k) if trans_b else (batch, k, n), dt)
    e = 1 if dt == DT_FP8 else 2
    lda, ldb, ldc = k * e + 8, b.shape[2] * e + 16, n * 4
    a_addr = img.put(a.reshape(batch * m, k), ld=lda)
    b_addr = img.put(b.reshape(-1, b.shape[2]), ld=ldb)
    c_stride = m * ldc + 24  # gap between output blocks
    c_addr = img.alloc(c_stride * batch)
    args = by_name("BATCH_MATMUL").make_args(
        a=a_addr, lda=lda, b=b_addr, ldb=ldb, c=c_addr, ldc=ldc, M=m, K=k, N=n,
        in_dtype=dt, out_dtype=DT_FP32,
        flags=(abi.FLAG_TRANS_B if trans_b else 0) | abi.bmm_scale_flags(scale),
        batch=batch, batch_stride_a=m * lda, batch_stride_b=b.shape[1] * ldb,
        batch_stride_c=c_stride)
    assert dispatch.vertex_execute(abi.BATCH_MATMUL, img.mem, img.base, args) == 0
    decode = fp8_decode if dt == DT_FP8 else fp16_decode
    ad = decode(a).astype(np.float64)
    bd = decode(b).astype(np.float64)
    for t in range(batch):
        want = ad[t] @ (bd[t].T if trans_b else bd[t]) * 2.0 ** scale
        got = img.get(c_addr + t * c_stride, m, n, ldc, np.float32)
        assert _rel_fro(got, want) <= REL_TOL
