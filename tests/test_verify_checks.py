"""The verifier's array checks (patches, footprint, I/O) against slow, obvious
twins, and the faults they name."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.abi import STEP_REPEAT_BEGIN, STEP_REPEAT_END
from kernels.registry import KERNELS
from simulator import load_device, verify
from simulator.access import region_span
from simulator.device import Device
from simulator.package import Package
from simulator.testing import ksplit_matmul, repeat_program
from simulator.verify import io_block_spans, patch_index, required_bytes
from tilecommon.errors import PackageInvalid


@pytest.fixture(scope="module")
def dev() -> Device:
    return load_device("tiny")


@pytest.fixture(scope="module")
def looped(dev: Device) -> Package:
    return repeat_program(dev, 4)


def _set(pkg: Package, name: str, index: tuple[int, ...] | int, value: int) -> Package:
    arr = pkg[name].copy()
    arr[index] = value
    return pkg.with_arrays(**{name: arr})


def test_required_bytes_agrees_with_a_loop(dev: Device) -> None:
    """The footprint model (simulator.footprint) against a plain loop over a
    random program, with every footprint constant non-zero."""
    dev = dev.with_costs(runtime_bytes=1000, step_code_bytes=24, loop_code_bytes=40,
                         xt_jump_bytes=4, xt_phase_bytes=8, xt_send_long_bytes=4,
                         xt_long_bytes=48)
    c = dev.costs
    rng = np.random.default_rng(3)
    kinds = sorted(KERNELS) + [999]  # an unknown kernel has no image
    n_steps, nv, nx = 12, 300, 200
    kind = np.array([STEP_REPEAT_BEGIN] + [0, 1] * 5 + [STEP_REPEAT_END], dtype=np.int64)
    v_step = np.sort(rng.choice(np.flatnonzero(kind == 0), nv))
    x_step = np.sort(rng.choice(np.flatnonzero(kind == 1), nx))
    arrays = {
        "step_kind": kind,
        "step_vtx": np.searchsorted(v_step, np.arange(n_steps + 1)),
        "step_xfer": np.searchsorted(x_step, np.arange(n_steps + 1)),
        "v_tile": rng.integers(0, dev.tiles, nv),
        "v_kernel": rng.choice(kinds, nv),
        "x_src_tile": rng.integers(0, dev.tiles, nx),
        "x_src_addr": dev.memory_base + 8 * rng.integers(0, 4, nx),
        "x_dst_tile": rng.integers(0, dev.tiles, nx),
        "x_dst_addr": dev.memory_base + 8 * rng.integers(0, 8, nx),
        "x_bytes": 8 * rng.integers(1, 9, nx),
        "buf_tile": np.array([0], dtype=np.int64),
    }
    code, xt = required_bytes(dev, arrays)
    used = set(arrays["v_tile"].tolist()) | set(arrays["x_src_tile"].tolist()) \
        | set(arrays["x_dst_tile"].tolist()) | {0}
    want_code = [0] * dev.tiles
    want_xt = [0] * dev.tiles
    for tile in range(dev.tiles):
        on = arrays["v_tile"] == tile
        ks = arrays["v_kernel"][on].tolist()
        want_code[tile] = (c.runtime_bytes + c.loop_code_bytes if tile in used else 0) \
            + c.vertex_code_bytes * len(ks) + sum(c.image_bytes(k) for k in set(ks)
                                                   if k in KERNELS) \
            + c.step_code_bytes * len(set(v_step[on].tolist()))
        phases = set()
        # a send: one (step, address, bytes) of the tile, heard once per tile
        # (a second transfer to a tile it reaches starts another send)
        heard: dict[tuple[int, int, int], dict[int, int]] = {}
        prev_end: dict[int, int] = {}
        for x in range(nx):
            s = int(x_step[x])
            if arrays["x_src_tile"][x] == tile:
                key = (s, int(arrays["x_src_addr"][x]), int(arrays["x_bytes"][x]))
                d = int(arrays["x_dst_tile"][x])
                heard.setdefault(key, {})[d] = heard.get(key, {}).get(d, 0) + 1
                phases.add(s)
            if arrays["x_dst_tile"][x] == tile:
                phases.add(s)
                want_xt[tile] += c.xt_receive_bytes
                a0 = int(arrays["x_dst_addr"][x])
                if prev_end.get(s) != a0:
                    want_xt[tile] += c.xt_jump_bytes
                prev_end[s] = a0 + int(arrays["x_bytes"][x])
        want_xt[tile] += sum(max(by_tile.values()) * (
            c.xt_send_bytes + (c.xt_send_long_bytes if nb > c.xt_long_bytes else 0))
            for (_, _, nb), by_tile in heard.items())
        want_xt[tile] += c.xt_phase_bytes * len(phases)
    assert code.tolist() == want_code and xt.tolist() == want_xt
    assert code.dtype == xt.dtype == np.int64


def test_io_block_spans_agree_with_region_span(dev: Device, looped: Package) -> None:
    for pkg in (looped, ksplit_matmul(dev)[0]):
        a = pkg.arrays
        lo, hi = io_block_spans(pkg)
        for i in range(a["io_tensor"].shape[0]):
            ext = a["io_hi"][i] - a["io_lo"][i]
            esize = {"fp8": 1, "fp16": 2, "fp32": 4}[pkg.io[int(a["io_tensor"][i])].dtype]
            reg = np.array([a["io_addr"][i], ext[0], a["io_ld0"][i], ext[1], a["io_ld1"][i],
                            ext[2] * esize, 0], dtype=np.int64)
            assert (int(lo[i]), int(hi[i])) == tuple(int(v) for v in region_span(reg))
            assert hi[i] > lo[i]


def test_patch_index_lists_each_items_patches(looped: Package) -> None:
    a = looped.arrays
    vp_ptr, vp_list, xp_ptr, xp_list = patch_index(looped)
    for ptr, lst, n, is_v in ((vp_ptr, vp_list, looped.n_vertices, True),
                              (xp_ptr, xp_list, looped.n_transfers, False)):
        assert ptr.shape == (n + 1,) and ptr.dtype == lst.dtype == np.int64
        for item in range(n):
            want = [p for p in range(looped.n_patches)
                    if (a["p_target"][p] == 0) == is_v and a["p_index"][p] == item]
            assert lst[ptr[item]:ptr[item + 1]].tolist() == want


def test_two_patches_of_one_argument(looped: Package) -> None:
    p = int(np.flatnonzero(looped["p_arg"] == 2)[0])  # the w[i] patch of vertex 1
    other = int(np.flatnonzero((looped["p_target"] == 0) & (looped["p_arg"] == 0))[0])
    bad = _set(looped, "p_arg", other, 2)
    assert p != other
    with pytest.raises(PackageInvalid, match=r"patches: patches \d+ and \d+ both rewrite "
                                             r"target 0 item 1 arg 2"):
        verify(bad)


def test_arithmetic_patch_with_a_table_location(looped: Package) -> None:
    p = int(np.flatnonzero(looped["p_mode"] == 0)[0])
    bad = _set(looped, "p_table_tile", p, 0)
    with pytest.raises(PackageInvalid, match=rf"patch {p}: arithmetic patch with a table"):
        verify(bad)


def test_io_slice_outside_the_shape(looped: Package) -> None:
    bad = _set(looped, "io_hi", (1, 0), 5)  # w has 4 trips
    with pytest.raises(PackageInvalid, match=r"io block 1 of 'w': slice \[0, 0, 0\]\.\.\[5, "
                                             r"4, 8\] outside shape \[4, 4, 8\]"):
        verify(bad)


def test_output_covered_twice(dev: Device) -> None:
    pkg = ksplit_matmul(dev)[0]
    a = pkg.arrays
    out = int(np.flatnonzero([t.role == "output" for t in pkg.io])[0])
    blocks = np.flatnonzero(a["io_tensor"] == out)
    grown = {k: np.concatenate([a[k], a[k][blocks[:1]]])
             for k in ("io_tensor", "io_tile", "io_addr", "io_lo", "io_hi", "io_ld0", "io_ld1")}
    with pytest.raises(PackageInvalid, match=rf"io tensor '{pkg.io[out].name}' \(output\): "
                                             r"blocks cover \d+ of \d+ elements \(outputs"):
        verify(pkg.with_arrays(**grown))
