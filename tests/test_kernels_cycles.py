"""Cycle models: the published IPU21 formulas' structure, monotone in the
extents, memory-element conflicts, the SOFTMAX path argument; the calibrated
c600 reproduces the published per-call figures its formulas were fitted to."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels import abi, dispatch
from kernels.dtypes import DT_FP8, DT_FP16, DT_FP32
from kernels.registry import KERNELS, by_name
from simulator.cost import call_parts, kernel_cycles
from simulator.device import load_device

C600 = load_device("c600")
IDEAL = load_device("c600-ideal")
DESC = C600.tile_desc().as_array()
BASE = C600.memory_base
ELEM = C600.element_bytes
SEED = 3


def test_matmul_is_call_plus_panels_times_panel_and_rows() -> None:
    c = C600.costs
    for m, k, n, dt, grain in [(184, 288, 48, "fp16", 16), (146, 576, 32, "fp16", 16),
                               (100, 1152, 72, "fp8", 32), (8, 80, 64, "fp16", 16)]:
        panels = math.ceil(k / grain) * math.ceil(n / c.mm_n_grain)
        want = c.mm_call + panels * (c.mm_panel + c.mm_row * max(m, c.mm_min_rows))
        assert kernel_cycles(C600, "MATMUL", M=m, K=k, N=n, in_dtype=dt) == want


def test_fp8_panels_hold_twice_the_k_of_fp16() -> None:
    fp8 = kernel_cycles(C600, "MATMUL", M=120, K=256, N=128, in_dtype="fp8")
    fp16 = kernel_cycles(C600, "MATMUL", M=120, K=256, N=128, in_dtype="fp16")
    call = C600.costs.mm_call
    assert fp16 - call == 2 * (fp8 - call)


def test_matmul_calibration_adds_panel_and_call_costs() -> None:
    """The first model ran the AMP at its peak; the calibrated one pays a
    coefficient-panel load and a call: 17-40% more on these shapes."""
    for shape in [(184, 288, 48), (120, 80, 272), (146, 576, 32)]:
        ideal = kernel_cycles(IDEAL, "MATMUL", M=shape[0], K=shape[1], N=shape[2],
                              in_dtype="fp16", out_dtype="fp16")
        cal = kernel_cycles(C600, "MATMUL", M=shape[0], K=shape[1], N=shape[2],
                            in_dtype="fp16", out_dtype="fp16")
        assert 1.15 < cal / ideal < 1.45, shape


def test_tiny_matmul_dominated_by_its_call() -> None:
    call, work, _ = call_parts(C600, "MATMUL", M=2, K=8, N=8)
    assert call > work / 2
    assert call == C600.costs.mm_call


def test_reduce_elements_over_workers_and_partials() -> None:
    c = C600.costs
    w = C600.workers
    for n, k in [(1472, 2), (576, 15), (8, 2)]:
        want = c.reduce_call + math.ceil(n / (w * c.reduce_grain)) * w * (
            c.reduce_chunk + c.reduce_partial * (k - 1))
        assert kernel_cycles(C600, "REDUCE", M=1, N=n, k=k) == want
    # strided rows are not contiguous: each row rounds up on its own
    dense = kernel_cycles(C600, "REDUCE", M=3, N=20, k=2)
    strided = kernel_cycles(C600, "REDUCE", M=3, N=20, k=2, ldo=128)
    assert strided > dense


# the published GELU table of the kernel the c600 is fitted to (elements, cycles)
GELU_TABLE = [(2, 462), (6, 702), (14, 1182), (16, 792), (18, 810), (30, 1182), (94, 1182),
              (96, 792), (98, 942), (1408, 7260), (2208, 10956)]


def test_gelu_follows_the_blocks_and_tail_of_the_hardware() -> None:
    for n, cycles in GELU_TABLE:
        assert kernel_cycles(C600, "GELU", M=1, N=n) == cycles, n


def test_add_contiguous_and_row_paths() -> None:
    c = C600.costs
    assert kernel_cycles(C600, "ADD", M=1, N=1152) == c.add_call + 48 * 6 * c.add_slots
    row = kernel_cycles(C600, "ADD", M=3, N=1152, broadcast=1)
    assert row == c.add_call + 3 * 48 * 6 * c.add_row_slots + 2 * c.add_row
    # contiguous rows take the pipelined path as one run
    assert kernel_cycles(C600, "ADD", M=3, N=1152) == c.add_call + 144 * 6 * c.add_slots


def test_softmax_takes_the_cheaper_path_unless_told() -> None:
    whole = kernel_cycles(C600, "SOFTMAX", M=1, N=768, path=1)
    split = kernel_cycles(C600, "SOFTMAX", M=1, N=768, path=2)
    assert split < whole
    assert kernel_cycles(C600, "SOFTMAX", M=1, N=768) == split
    few = kernel_cycles(C600, "SOFTMAX", M=6, N=64)  # one round of whole rows
    assert few == kernel_cycles(C600, "SOFTMAX", M=6, N=64, path=1)


def test_softmax_mixed_path_is_the_two_measured_calls_back_to_back() -> None:
    """siglip's 8 rows of 729 keys per tile on 6 workers: one round of 6
    whole rows, then the 2 left on the split path, each call with its own
    overhead; cheaper than a second whole round or 8 split rows, and what
    the kernel takes unless told."""
    c = C600.costs
    mixed = kernel_cycles(C600, "SOFTMAX", M=8, N=729, path=3)
    whole6 = kernel_cycles(C600, "SOFTMAX", M=6, N=729, path=1)
    split2 = kernel_cycles(C600, "SOFTMAX", M=2, N=729, path=2)
    assert mixed == whole6 + split2
    assert whole6 == c.softmax_call + 6 * (c.softmax_row + c.softmax_panel * math.ceil(729 / 16))
    assert mixed < kernel_cycles(C600, "SOFTMAX", M=8, N=729, path=2) \
        < kernel_cycles(C600, "SOFTMAX", M=8, N=729, path=1)
    assert kernel_cycles(C600, "SOFTMAX", M=8, N=729) == mixed
    # a block of full rounds has nothing left to split: mixed is whole
    assert kernel_cycles(C600, "SOFTMAX", M=12, N=729, path=3) == \
        kernel_cycles(C600, "SOFTMAX", M=12, N=729, path=1)


def test_layernorm_rows_share_the_workers() -> None:
    c = C600.costs
    w = C600.workers
    want = c.ln_call + 2 * (c.ln_row + c.ln_stats * math.ceil(1152 / (8 * w))
                            + c.ln_chunk * math.ceil(1152 / (4 * w)))
    assert kernel_cycles(C600, "LAYERNORM", M=2, N=1152) == want


def test_copy_call_and_bandwidth() -> None:
    c = C600.costs
    assert kernel_cycles(C600, "COPY", rows=1, row_bytes=8192) == \
        c.copy_call + 8192 // c.copy_bytes_per_cycle
    dense = kernel_cycles(C600, "COPY", rows=10, row_bytes=64)
    strided = kernel_cycles(C600, "COPY", rows=10, row_bytes=64, lds=128)
    assert strided == dense + 9 * c.copy_row


def _matmul(m: int, k: int, n: int, conflict: bool = False) -> int:
    a = BASE
    b = BASE + (64 if conflict else 4 * ELEM)
    c = BASE + 12 * ELEM
    args = by_name("MATMUL").make_args(a=a, lda=k, b=b, ldb=n, c=c, ldc=2 * n, M=m, K=k, N=n,
                                       in_dtype=DT_FP8, out_dtype=DT_FP16)
    return int(dispatch.vertex_cycles(abi.MATMUL, args, DESC))


def test_conflict_penalty_scales_the_work() -> None:
    plain = _matmul(64, 64, 64)
    clash = _matmul(64, 64, 64, conflict=True)
    call = C600.costs.mm_call
    assert clash == call + math.ceil((plain - call) * C600.costs.conflict_percent / 100)
    ln = by_name("LAYERNORM")
    far = ln.make_args(x=BASE, ldx=128, gamma=BASE + 3 * ELEM, beta=BASE + 5 * ELEM,
                       y=BASE + ELEM, ldy=128, M=8, N=64)
    near = ln.make_args(x=BASE, ldx=128, gamma=BASE + 3 * ELEM, beta=BASE + 5 * ELEM,
                        y=BASE + 2048, ldy=128, M=8, N=64)
    assert dispatch.vertex_conflict(abi.LAYERNORM, near, DESC)
    assert not dispatch.vertex_conflict(abi.LAYERNORM, far, DESC)
    assert ln.cycles(near, DESC) > ln.cycles(far, DESC)
    # a block that merely straddles an element boundary still conflicts with its neighbour
    edge = ln.make_args(x=BASE + ELEM - 128, ldx=128, gamma=BASE + 3 * ELEM,
                        beta=BASE + 5 * ELEM, y=BASE + ELEM + 512, ldy=128, M=8, N=64)
    assert dispatch.vertex_conflict(abi.LAYERNORM, edge, DESC)


def test_accumulate_reads_and_writes_c_without_self_conflict() -> None:
    mm = by_name("MATMUL")
    args = mm.make_args(a=BASE, lda=64, b=BASE + 4 * ELEM, ldb=64, c=BASE + 8 * ELEM, ldc=256,
                        M=16, K=64, N=64, in_dtype=DT_FP8, out_dtype=DT_FP32,
                        flags=abi.FLAG_ACCUMULATE)
    assert not dispatch.vertex_conflict(abi.MATMUL, args, DESC)


def _scaled(spec_name: str, args: np.ndarray, field: str, value: int) -> np.ndarray:
    a = args.copy()
    a[by_name(spec_name).arg_names.index(field)] = value
    return a


MONOTONE_FIELDS = {
    "MATMUL": ("M", "K", "N"), "BATCH_MATMUL": ("M", "K", "N", "batch"),
    "REDUCE": ("M", "N", "k"), "ADD": ("M", "N"), "BIAS_ADD": ("M", "N"),
    "LAYERNORM": ("M", "N"), "GELU": ("M", "N"), "SOFTMAX": ("M", "N"), "CAST": ("M", "N"),
    "COPY": ("rows", "row_bytes"), "TRANSPOSE": ("M", "N"), "RMSNORM": ("M", "N"),
    "ROPE": ("M", "N"),
}
# GELU's row width is monotone in whole blocks (a tail costs more than the next
# whole block: measured on the hardware), so its N steps by the block
STEP = {("GELU", "N"): C600.costs.gelu_block_elems}


@pytest.mark.parametrize("device", [C600, IDEAL], ids=["c600", "c600-ideal"])
@pytest.mark.parametrize("name", sorted(MONOTONE_FIELDS))
def test_monotone_in_every_size_argument(name: str, device: object) -> None:
    desc = device.tile_desc().as_array()  # type: ignore[attr-defined]
    spec = by_name(name)
    # operands far apart: no conflicts, so only the size changes; strided rows
    addr = {f: BASE + i * 4 * ELEM for i, f in enumerate(
        ("a", "b", "c", "x", "y", "parts", "out", "src", "dst", "bias", "gamma", "beta", "cos",
         "sin"))}
    named: dict[str, int] = {f: v for f, v in addr.items() if f in spec.arg_names}
    dtypes = {"in_dtype": DT_FP8, "out_dtype": DT_FP32, "dtype_a": DT_FP16, "dtype_b": DT_FP16,
              "dtype_c": DT_FP16, "dtype_x": DT_FP16, "dtype_y": DT_FP8, "elem_bytes": 2}
    named.update({f: v for f, v in dtypes.items() if f in spec.arg_names})
    named.update({f: 1 << 14 for f in ("lda", "ldb", "ldc", "ldx", "ldy", "lds", "ldd",
                                       "ld_parts", "ldo", "ldt") if f in spec.arg_names})
    if name == "ROPE":
        named["head_dim"] = 2
    base_args = spec.make_args(**named)
    rng = np.random.default_rng(SEED)
    for field in MONOTONE_FIELDS[name]:
        step = STEP.get((name, field), 1)
        for _ in range(20):
            sizes = {f: int(rng.integers(1, 40)) * STEP.get((name, f), 1)
                     for f in MONOTONE_FIELDS[name]}
            args = base_args.copy()
            for f, v in sizes.items():
                args = _scaled(name, args, f, v)
            prev = spec.cycles(args, desc)
            for bigger in range(sizes[field] + step, sizes[field] + 80 * step, 7 * step):
                cur = spec.cycles(_scaled(name, args, field, bigger), desc)
                assert cur >= prev, (field, sizes, bigger)
                prev = cur
        big = spec.cycles(_scaled(name, base_args, field, 4000 * step), desc)
        small = spec.cycles(_scaled(name, base_args, field, step), desc)
        assert big > small, field
    assert set(MONOTONE_FIELDS) == {s.name for s in KERNELS.values()}


def test_gelu_tails_cost_at_most_the_next_block_round() -> None:
    """Any row costs at most a row of the next round of whole blocks, on the
    checked path: the non-monotone steps are bounded."""
    for n in range(1, 400):
        here = kernel_cycles(C600, "GELU", M=1, N=n)
        blocks = -(-n // 16)
        bound = C600.costs.gelu_call + C600.costs.gelu_tail_setup + C600.costs.gelu_pair * 8 \
            + C600.costs.gelu_tail_block * -(-blocks // C600.workers)
        assert here <= bound, n
