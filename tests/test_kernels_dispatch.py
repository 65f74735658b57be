"""kernels.dispatch / kernels.registry: ids, arg vectors, unknown ids, status codes."""

from __future__ import annotations

import numpy as np
import pytest

from kernels import abi, dispatch, status
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32, f32_as_u32
from kernels.registry import KERNELS, by_name
from kernels.testing import TileImage, random_vertex
from kernels.tile import D_GELU_CALL
from simulator.device import load_device

DESC = load_device("c600").tile_desc().as_array()


def test_registry_ids_names_and_args() -> None:
    assert sorted(KERNELS) == list(range(1, len(abi.KERNEL_ARGS) + 1))
    for kid, spec in KERNELS.items():
        assert spec.id == kid
        assert by_name(spec.name) is spec
        assert len(spec.arg_names) <= abi.N_ARGS
        assert len(set(spec.arg_names)) == len(spec.arg_names)
    assert by_name("MATMUL").arg_names[13] == "bias"
    assert by_name("LAYERNORM").arg_names[8] == "eps"
    with pytest.raises(ValueError, match="CONV"):
        by_name("CONV")


def test_make_args_names_and_float_bits() -> None:
    spec = by_name("SOFTMAX")
    args = spec.make_args(x=0x4C000, M=3, N=5, scale=0.125, dtype_x=DT_FP16)
    assert args.dtype == np.int64 and args.shape == (abi.N_ARGS,)
    assert args[0] == 0x4C000 and args[4] == 3 and args[5] == 5
    assert args[6] == f32_as_u32(0.125) and args[7] == DT_FP16
    with pytest.raises(ValueError, match="'lda'"):
        spec.make_args(lda=4)


def test_unknown_kernel_id() -> None:
    args = np.zeros(abi.N_ARGS, dtype=np.int64)
    out = np.zeros((abi.MAX_REGIONS, abi.REGION_COLS), dtype=np.int64)
    mem = np.zeros(64, dtype=np.uint8)
    assert dispatch.vertex_cycles(99, args, DESC) == -1
    assert dispatch.vertex_regions(0, args, out) == -1
    assert dispatch.vertex_execute(len(abi.KERNEL_ARGS) + 1, mem, 0, args) == status.BAD_KERNEL
    assert "unknown kernel" in status.describe(status.BAD_KERNEL)


def test_bad_arguments_give_status_codes() -> None:
    img = TileImage(4096)
    mm = by_name("MATMUL")
    good = dict(a=img.base, lda=8, b=img.base + 64, ldb=8, c=img.base + 128, ldc=16,
                M=2, K=8, N=8, in_dtype=DT_FP8, out_dtype=DT_FP16)
    assert dispatch.vertex_execute(abi.MATMUL, img.mem, img.base, mm.make_args(**good)) == 0
    cases = [({"M": 0}, status.BAD_SHAPE), ({"in_dtype": DT_FP32}, status.BAD_DTYPE),
             ({"flags": abi.FLAG_ACCUMULATE}, status.BAD_FLAGS), ({"flags": 8}, status.BAD_FLAGS),
             ({"lda": 4}, status.BAD_STRIDE)]
    for change, code in cases:
        args = mm.make_args(**{**good, **change})
        assert dispatch.vertex_execute(abi.MATMUL, img.mem, img.base, args) == code, change
    cast = by_name("CAST").make_args(x=img.base, y=img.base + 64, M=1, N=4, dtype_x=3)
    assert dispatch.vertex_execute(abi.CAST, img.mem, img.base, cast) == status.BAD_DTYPE


def test_spec_cycles_equals_dispatch() -> None:
    spec = by_name("GELU")
    args = spec.make_args(x=0x4C000, ldx=64, y=0x4C000 + 65536, ldy=64, M=12, N=32)
    assert spec.cycles(args, DESC) == dispatch.vertex_cycles(abi.GELU, args, DESC)
    assert spec.cycles(args, DESC) > DESC[D_GELU_CALL]


def test_vertex_cost_equals_cycles_and_regions() -> None:
    rng = np.random.default_rng(5)
    for kid in sorted(KERNELS):
        for _ in range(4):
            img = TileImage(1 << 15)
            args = random_vertex(kid, rng, img)
            scratch = np.full((abi.MAX_REGIONS, abi.REGION_COLS), -1, dtype=np.int64)
            cycles, n = dispatch.vertex_cost(kid, args, DESC, scratch)
            ref = np.zeros((abi.MAX_REGIONS, abi.REGION_COLS), dtype=np.int64)
            assert n == dispatch.vertex_regions(kid, args, ref) > 0
            np.testing.assert_array_equal(scratch[:n], ref[:n])
            assert cycles == dispatch.vertex_cycles(kid, args, DESC) > 0
    assert tuple(dispatch.vertex_cost(42, np.zeros(16, np.int64), DESC, scratch)) == (-1, -1)
