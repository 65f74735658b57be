"""Static verifier: valid packages pass; each kind of corruption is rejected by name.

Corruptions that are statically invisible (a dropped or short transfer, a read
before any write) are run-time faults: see tests/test_engine.py and
test_read_before_write_is_caught_by_run_not_verify below.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels.abi import BUF_SUPPORT, COPY
from simulator import load_device, run, verify
from simulator.device import Device
from simulator.engines.base import F_NO_BUFFER, F_RACE, F_UNINIT
from simulator.package import Package
from simulator.testing import BLOCK_R, PackageBuilder, ksplit_matmul, repeat_program
from tilecommon.errors import PackageInvalid

TRIPS = 5


@pytest.fixture(scope="module")
def dev() -> Device:
    return load_device("tiny")


@pytest.fixture(scope="module")
def ksplit(dev: Device) -> Package:
    return ksplit_matmul(dev)[0]


@pytest.fixture(scope="module")
def looped(dev: Device) -> Package:
    return repeat_program(dev, TRIPS)


def _set(pkg: Package, name: str, index: tuple[int, ...] | int, value: int) -> Package:
    arr = pkg[name].copy()
    arr[index] = value
    return pkg.with_arrays(**{name: arr})


def _buf(pkg: Package, name: str) -> int:
    return pkg.buffer_names.index(name)


def test_valid_packages_pass(ksplit: Package, looped: Package, dev: Device) -> None:
    verify(ksplit)
    verify(looped)
    verify(repeat_program(dev, TRIPS, unrolled=True))


# ---- package mutation kinds ---------------------------------------------------------------


def test_buffer_shifted_past_the_end(ksplit: Package, dev: Device) -> None:
    b = _buf(ksplit, "out")
    bad = _set(ksplit, "buf_addr", b, dev.memory_end - 64)
    with pytest.raises(PackageInvalid,
                       match=r"buffer 'out' .*tile 0.*ends past memory end 0x5c000"):
        verify(bad)


def test_two_live_buffers_overlapping(looped: Package) -> None:
    a, b = _buf(looped, "A"), _buf(looped, "B")
    bad = _set(looped, "buf_addr", b, int(looped["buf_addr"][a]) + 8)
    with pytest.raises(PackageInvalid,
                       match=r"tile 0: buffer 'A' .* and buffer 'B' .* overlap at 0x.* while both "
                             r"live at step 0"):
        verify(bad)


def test_dead_buffers_may_share_addresses(ksplit: Package) -> None:
    # a0 (live at step 0 only) and out (live at step 2 only) at the same address: fine
    a0, out = _buf(ksplit, "a0"), _buf(ksplit, "out")
    assert int(ksplit["buf_last"][a0]) < int(ksplit["buf_first"][out])
    moved = _set(ksplit, "buf_addr", out, int(ksplit["buf_addr"][a0]))
    args = ksplit["v_args"].copy()
    args[-1, 4] = int(ksplit["buf_addr"][a0])
    io_addr = ksplit["io_addr"].copy()
    io_addr[-1] = int(ksplit["buf_addr"][a0])
    verify(moved.with_arrays(v_args=args, io_addr=io_addr))


def test_liveness_across_a_loop_boundary_covers_the_whole_loop(looped: Package) -> None:
    # a buffer live from before the loop into its first body step only is live for
    # the whole loop: it may not share bytes with one used at the END of the body
    b = _buf(looped, "x")
    bad = looped.with_arrays(
        buf_last=_set(looped, "buf_last", b, 2)["buf_last"],
        buf_addr=_set(looped, "buf_addr", b, int(looped["buf_addr"][_buf(looped, "y")]))[
            "buf_addr"])
    with pytest.raises(PackageInvalid, match=r"buffer 'x' .* and buffer 'y' .* overlap"):
        verify(bad)


def test_wrong_transfer_size_too_large(ksplit: Package) -> None:
    bad = _set(ksplit, "x_bytes", 1, int(ksplit["x_bytes"][1]) + 64)
    with pytest.raises(PackageInvalid,
                       match=r"step 1 \(EXCHANGE\), tile 2, address 0x4c300: transfer 1 source "
                             r"\(576 bytes\) is not inside one buffer live at this step"):
        verify(bad)


def test_transfer_into_a_dead_buffer(ksplit: Package) -> None:
    # the landing buffer starts living only at step 2: the exchange at step 1 misses it
    bad = _set(ksplit, "buf_first", _buf(ksplit, "parts"), 2)
    with pytest.raises(PackageInvalid, match=r"step 0 \(COMPUTE\), tile 0.*vertex 0"):
        verify(bad)


def test_wrong_trip_count(looped: Package) -> None:
    loop = int(np.flatnonzero(looped["step_trips"])[0])
    bad = _set(looped, "step_trips", loop, TRIPS + 1)
    with pytest.raises(PackageInvalid, match=rf"patch 0: table length {TRIPS} != {TRIPS + 1}"):
        verify(bad)


def test_wrong_patch_stride(looped: Package) -> None:
    p = int(np.flatnonzero(looped["p_stride"] == BLOCK_R)[0])  # the w[i] patch
    bad = _set(looped, "p_stride", p, 2 * BLOCK_R)
    with pytest.raises(PackageInvalid,
                       match=r"step 2 \(COMPUTE\), tile 0, address 0x4c.*, iteration 4 of loop at "
                             r"step 1: vertex 1 \(kernel 4\) operand region of 64 bytes"):
        verify(bad)


def test_two_writers_in_one_step(ksplit: Package) -> None:
    dst = ksplit["x_dst_addr"].copy()
    dst[2] = dst[1]
    bad = ksplit.with_arrays(x_dst_addr=dst)
    with pytest.raises(PackageInvalid,
                       match=r"step 1 \(EXCHANGE\), tile 0, address 0x4c.*: race: transfer 1 and "
                             r"transfer 2"):
        verify(bad)


def test_writer_and_reader_in_one_step(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 512, "activation")
    b.buffer("c", 0, base + 512, 512, "activation")
    cp = {1: 64, 3: 64, 4: 4, 5: 64}
    # vertex 1 reads rows of c that vertex 0 writes in the same step
    b.compute((0, COPY, {**cp, 0: base, 2: base + 512}),
              (0, COPY, {**cp, 0: base + 512 + 128, 2: base + 256}))
    with pytest.raises(PackageInvalid, match=r"race: vertex \d \(kernel 10\) and vertex \d"):
        verify(b.build())


def test_read_before_write_is_caught_by_run_not_verify(looped: Package) -> None:
    args = looped["v_args"].copy()
    args[0, 2] = args[1, 4]  # the first COPY fills B; the loop reads A first
    bad = looped.with_arrays(v_args=args)
    verify(bad)
    res = run(bad, params={"w": np.ones((TRIPS, 4, 8), np.float32)},
              inputs={"x": np.ones((4, 8), np.float32)})
    assert res.faults[0].code == F_UNINIT and res.faults[0].step == 2


def test_two_writers_are_also_a_run_fault(ksplit: Package, dev: Device) -> None:
    dst = ksplit["x_dst_addr"].copy()
    dst[2] = dst[1]
    _, params, inputs, _ = ksplit_matmul(dev)
    res = run(ksplit.with_arrays(x_dst_addr=dst), params=params, inputs=inputs)
    assert F_RACE in [f.code for f in res.faults]


# ---- structure, patches, footprint, io -----------------------------------------------------


def test_unmatched_repeat(looped: Package) -> None:
    end = int(np.flatnonzero(looped["step_kind"] == 3)[0])
    bad = _set(looped, "step_kind", end, 0)
    with pytest.raises(PackageInvalid, match=r"REPEAT_BEGIN never closed|step_match"):
        verify(bad)


def test_patch_driven_by_a_loop_that_does_not_enclose_it(looped: Package) -> None:
    bad = _set(looped, "p_loop", 0, 0)
    with pytest.raises(PackageInvalid, match=r"patch 0: p_loop 0 is not a Repeat enclosing"):
        verify(bad)


def test_patch_iteration0_must_equal_unpatched_arg(looped: Package) -> None:
    p = int(np.flatnonzero(looped["p_stride"] == BLOCK_R)[0])
    bad = _set(looped, "p_base", p, int(looped["p_base"][p]) + 8)
    with pytest.raises(PackageInvalid, match=rf"patch {p} .*iteration-0 value"):
        verify(bad)


def test_table_outside_support_buffer(looped: Package) -> None:
    p = int(np.flatnonzero(looped["p_mode"] == 1)[0])
    bad = _set(looped, "p_table_addr", p, int(looped["buf_addr"][_buf(looped, "w")]))
    with pytest.raises(PackageInvalid, match=rf"patch {p}: table at tile 0 .* support buffer"):
        verify(bad)


def test_footprint_must_agree_with_buffers(ksplit: Package) -> None:
    bad = _set(ksplit, "fp_support", 1, int(ksplit["fp_support"][1]) - 8)
    with pytest.raises(PackageInvalid, match="tile 1: fp_support = .* its support buffers hold"):
        verify(bad)


def test_code_buffer_too_small(ksplit: Package) -> None:
    b = int(np.flatnonzero((ksplit["buf_kind"] == 4) & (ksplit["buf_tile"] == 2))[0])
    small = _set(ksplit, "buf_bytes", b, 16)
    bad = small.with_arrays(fp_code=_set(ksplit, "fp_code", 2, 16)["fp_code"])
    with pytest.raises(PackageInvalid, match=r"tile 2: fp_code = 16 < 2064 required"):
        verify(bad)


def test_footprint_over_memory(ksplit: Package, dev: Device) -> None:
    bad = ksplit.with_arrays(
        fp_tensor_hi=_set(ksplit, "fp_tensor_hi", 3, dev.memory_end)["fp_tensor_hi"],
        fp_tensor=_set(ksplit, "fp_tensor", 3, dev.memory_end - dev.memory_base)["fp_tensor"])
    with pytest.raises(PackageInvalid, match=r"tile 3: footprint \d+ bytes .* exceeds memory_size"):
        verify(bad)


def test_misaligned_buffer(ksplit: Package) -> None:
    b = _buf(ksplit, "bias")
    bad = _set(ksplit, "buf_addr", b, int(ksplit["buf_addr"][b]) + 2)
    with pytest.raises(PackageInvalid, match=r"buffer 'bias' .* not aligned to 8"):
        verify(bad)


def test_io_block_outside_buffers(ksplit: Package) -> None:
    bad = _set(ksplit, "io_addr", 0, int(ksplit["io_addr"][0]) + 4096)
    with pytest.raises(PackageInvalid, match=r"io block 0 of 'a' \(input\): tile 0"):
        verify(bad)


def test_support_buffer_of_table_must_cover_loop(looped: Package) -> None:
    b = int(np.flatnonzero((looped["buf_kind"] == BUF_SUPPORT) & (looped["buf_tile"] == 0))[0])
    # live only inside the body (steps 2..3): not over the whole loop 1..4
    bad = _set(_set(looped, "buf_last", b, 3), "buf_first", b, 2)
    with pytest.raises(PackageInvalid, match="support buffer live over loop steps 1..4"):
        verify(bad)


# ---- the jitted region helpers against slow, obvious twins ---------------------------------


def _naive_race(regs: np.ndarray, tiles: np.ndarray, owner: np.ndarray) -> bool:
    """Byte map per tile: a race iff some byte has writers from two owners, or a
    writer and a reader from different owners."""
    touched: dict[tuple[int, int], list[tuple[int, bool]]] = {}
    for k in range(regs.shape[0]):
        addr, outer, ostride, rows, ld, nb, w = (int(v) for v in regs[k])
        for o in range(outer):
            for r in range(rows):
                start = addr + o * ostride + r * ld
                for byte in range(start, start + nb):
                    touched.setdefault((int(tiles[k]), byte), []).append((int(owner[k]), w != 0))
    for users in touched.values():
        for i, (oi, wi) in enumerate(users):
            for oj, wj in users[i + 1:]:
                if oi != oj and (wi or wj):
                    return True
    return False


def test_find_race_agrees_with_a_byte_map() -> None:
    from simulator.access import find_race

    rng = np.random.default_rng(11)
    out = np.zeros(3, dtype=np.int64)
    races = 0
    for _ in range(300):
        n = int(rng.integers(2, 7))
        regs = np.zeros((n, 7), dtype=np.int64)
        regs[:, 0] = rng.integers(0, 96, n)  # addr
        regs[:, 1] = rng.integers(1, 3, n)  # outer
        regs[:, 2] = rng.integers(0, 3, n) * 40  # outer stride
        regs[:, 3] = rng.integers(1, 4, n)  # rows
        regs[:, 4] = rng.integers(1, 3, n) * 12  # ld
        regs[:, 5] = rng.integers(1, 9, n)  # row bytes
        regs[:, 6] = rng.integers(0, 2, n)  # write?
        tiles = rng.integers(0, 2, n).astype(np.int64)
        owner = rng.integers(0, 3, n).astype(np.int64)
        want = _naive_race(regs, tiles, owner)
        got = bool(find_race(regs, tiles, owner, n, out))
        assert got == want, (regs, tiles, owner)
        if got:
            a, b = int(out[0]), int(out[1])
            assert owner[a] != owner[b] and tiles[a] == tiles[b]
            assert regs[a, 6] or regs[b, 6]
        races += got
    assert 50 < races < 250  # both outcomes are exercised


def test_find_buffer_agrees_with_a_scan(dev: Device) -> None:
    from simulator.access import BufferIndex, find_buffer

    rng = np.random.default_rng(5)
    b = PackageBuilder(dev)
    for k in range(40):
        tile = int(rng.integers(0, 3))
        addr = dev.memory_base + 8 * int(rng.integers(0, 64))
        first = int(rng.integers(0, 4))
        b.buffer(f"b{k}", tile, addr, 8 * int(rng.integers(1, 16)), "activation", first,
                 first + int(rng.integers(0, 3)))
    for _ in range(6):
        b.compute()
    pkg = b.build(support=False)
    a = pkg.arrays
    idx = BufferIndex(pkg, a["buf_first"], a["buf_last"])
    for _ in range(500):
        tile, step = int(rng.integers(0, 3)), int(rng.integers(0, 6))
        lo = dev.memory_base + int(rng.integers(0, 600))
        hi = lo + int(rng.integers(1, 64))
        got = int(find_buffer(tile, lo, hi, step, *idx.args()))
        end = a["buf_addr"] + a["buf_bytes"]
        ok = ((a["buf_tile"] == tile) & (a["buf_addr"] <= lo) & (end >= hi)
              & (a["buf_first"] <= step) & (a["buf_last"] >= step))
        assert (got >= 0) == bool(ok.any())
        if got >= 0:
            assert ok[got]


def test_garbage_row_count_is_rejected_not_looped_over(dev: Device) -> None:
    b = PackageBuilder(dev)
    base = dev.memory_base
    b.buffer("a", 0, base, 64, "activation")
    b.buffer("c", 0, base + 64, 64, "activation")
    # 10**9 rows of 8 bytes with stride 0: inside the buffers' spans, absurd as data
    (v,) = b.compute((0, COPY, {0: base, 1: 0, 2: base + 64, 3: 0, 4: 10**9, 5: 8}))
    pkg = b.build()
    with pytest.raises(PackageInvalid, match=rf"vertex {v} \(kernel 10\) operand region has "
                                             r"1000000000 rows"):
        verify(pkg)
    x = b.io("a", "input", (16,), "fp32")
    b.io_block(x, 0, base, (0,), (16,), 0, 0)
    res = run(b.build(), inputs={"a": np.ones(16, np.float32)})
    assert [f.code for f in res.faults] == [F_NO_BUFFER, F_NO_BUFFER]  # both operands


def test_vertices_may_not_touch_code_or_support_memory(looped: Package) -> None:
    # point the first COPY's source at the tile's support buffer (live all program)
    sup = int(np.flatnonzero((looped["buf_kind"] == BUF_SUPPORT) & (looped["buf_tile"] == 0))[0])
    bad = _set(looped, "v_args", (0, 0), int(looped["buf_addr"][sup]))
    with pytest.raises(PackageInvalid, match=r"step 0 \(COMPUTE\), tile 0, address .*: vertex 0 "
                                             r"\(kernel 10\) operand region"):
        verify(bad)
