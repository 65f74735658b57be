"""kernels.blocks fast paths agree bitwise with the kernels.dtypes codecs on every
fp8 and fp16 code and on fp8 and fp16 encodes of values from every class (the
branch-free encoders were also checked against the scalar codecs on all 2**32
float32 bit patterns when they were written)."""

from __future__ import annotations

import numpy as np

from kernels.blocks import read_block, read_row, write_block, write_row
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, fp8_decode, fp16_decode, fp16_encode

SEED = 29


def test_read_row_every_code() -> None:
    codes8 = np.arange(256, dtype=np.uint8)
    out = np.empty(256, dtype=np.float32)
    read_row(codes8, 0, 256, DT_FP8, out)
    np.testing.assert_array_equal(out.view(np.uint32), fp8_decode(codes8).view(np.uint32))
    codes16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out16 = np.empty(65536, dtype=np.float32)
    read_row(codes16.view(np.uint8), 0, 65536, DT_FP16, out16)
    np.testing.assert_array_equal(out16.view(np.uint32), fp16_decode(codes16).view(np.uint32))


def test_write_row_fp16_every_class_and_fp32_bits() -> None:
    rng = np.random.default_rng(SEED)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    vals = np.concatenate([bits.view(np.float32), rng.standard_normal(50_000).astype(np.float32),
                           np.array([65504, 65519.9, 65520, 6e-8, 3e-8, 0.0, -0.0, np.inf,
                                     -np.inf, np.nan], dtype=np.float32)])
    mem = np.zeros(vals.size * 4, dtype=np.uint8)
    write_row(mem, 0, vals.size, DT_FP16, vals)
    got = mem[: vals.size * 2].view(np.uint16)
    want = fp16_encode(vals)
    finite = ~np.isnan(vals)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert (((got[~finite] & 0x7C00) == 0x7C00) & ((got[~finite] & 0x3FF) != 0)).all()
    write_row(mem, 0, vals.size, DT_FP32, vals)
    np.testing.assert_array_equal(mem.view(np.uint32), vals.view(np.uint32))


def test_write_row_fp8_every_class() -> None:
    from kernels.dtypes import f32_to_f8

    rng = np.random.default_rng(SEED + 2)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    edges = np.array([448, 464, 464.01, 480, 2.0**-6, 2.0**-6 * 0.999, 2.0**-9, 2.0**-10,
                      3 * 2.0**-10, 2.0**-10 * 1.0001, 0.0, -0.0, np.inf, -np.inf, np.nan],
                     dtype=np.float32)
    vals = np.concatenate([bits.view(np.float32), rng.standard_normal(50_000).astype(np.float32),
                           (rng.standard_normal(50_000) * 2.0**-8).astype(np.float32), edges,
                           -edges])
    mem = np.zeros(vals.size, dtype=np.uint8)
    write_row(mem, 0, vals.size, DT_FP8, vals)
    want = np.array([f32_to_f8(v) for v in vals], dtype=np.uint8)
    np.testing.assert_array_equal(mem, want)
    np.testing.assert_array_equal(mem[vals.size - 2 * edges.size:][:edges.size],
                                  [0x7E, 0x7E, 0x7F, 0x7F, 8, 8, 1, 0, 2, 1, 0, 0x80, 0x7F,
                                   0xFF, 0x7F])


def test_blocks_dense_and_strided_agree() -> None:
    rng = np.random.default_rng(SEED + 1)
    rows, cols = 7, 13
    vals = rng.standard_normal((rows, cols)).astype(np.float32)
    for dt, nbytes in ((DT_FP8, 1), (DT_FP16, 2), (DT_FP32, 4)):
        for ld in (cols * nbytes, cols * nbytes + 5):
            mem = np.full(rows * ld + 16, 0xEE, dtype=np.uint8)
            write_block(mem, 3, rows, cols, ld, dt, vals)
            back = np.empty((rows, cols), dtype=np.float32)
            read_block(mem, 3, rows, cols, ld, dt, back)
            row = np.empty(cols, dtype=np.float32)
            for r in range(rows):
                read_row(mem, 3 + r * ld, cols, dt, row)
                np.testing.assert_array_equal(row, back[r])
            if dt == DT_FP32:
                np.testing.assert_array_equal(back, vals)
            assert mem[0] == 0xEE and mem[3 + (rows - 1) * ld + cols * nbytes] == 0xEE
