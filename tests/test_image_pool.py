"""simulator.image_pool: a reused image is indistinguishable from a fresh one."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from simulator import image_pool, load_device, run
from simulator.engines.base import F_OUTPUT
from simulator.testing import ksplit_matmul


@pytest.fixture(autouse=True)
def empty_pool():  # type: ignore[no-untyped-def]
    image_pool.release()
    yield
    image_pool.release()


def dirty(mem: np.ndarray, bits: np.ndarray, sizes: list[int]) -> None:
    """Fill each row's window (and its bitmap words) with ones, as a run may."""
    for r, n in enumerate(sizes):
        mem[r, :n] = 0xFF
        bits[r, : -(-n // 64)] = np.uint64(2**64 - 1)


def test_take_gives_zeroed_arrays_of_the_asked_shape() -> None:
    mem, bits = image_pool.take(3, 100)
    assert image_pool.kept_bytes() == 0
    assert mem.shape == (3, 100) and mem.dtype == np.uint8
    assert bits.shape == (3, 2) and bits.dtype == np.uint64
    assert not mem.any() and not bits.any()


@pytest.mark.parametrize("rows, width", [(3, 128), (2, 150), (5, 64)])
def test_a_kept_image_comes_back_zeroed_in_a_new_geometry(rows: int, width: int) -> None:
    mem, bits = image_pool.take(4, 160)
    dirty(mem, bits, [160, 37, 0, 99])
    image_pool.give(mem, bits, np.array([160, 37, 0, 99]))
    again, again_bits = image_pool.take(rows, width)
    assert np.shares_memory(again, mem) and np.shares_memory(again_bits, bits)  # reused
    assert again.shape == (rows, width) and again_bits.shape == (rows, -(-width // 64))
    assert not again.any() and not again_bits.any()


def test_a_marked_image_is_zeroed_where_its_bitmap_says() -> None:
    """After a run without faults only the 64-byte blocks under non-zero
    bitmap words are zeroed; a byte written but not marked (only a failed
    kernel leaves one) would survive, which is why a faulted run is given
    back unmarked."""
    mem, bits = image_pool.take(3, 300)
    for r, (a, n) in enumerate([(5, 200), (64, 1), (130, 170)]):
        mem[r, a:a + n] = 0xA5
        for b in range(a, a + n):
            bits[r, b // 64] |= np.uint64(1 << (b % 64))
    mem[2, 0] = 0x11  # written, never marked
    image_pool.give(mem, bits, np.array([300, 300, 300]), marked=True)
    again, again_bits = image_pool.take(3, 300)
    assert np.shares_memory(again, mem) and not again_bits.any()
    assert np.flatnonzero(again).tolist() == [2 * 300]  # the unmarked byte only
    again[2, 0] = 0x11
    image_pool.give(again, again_bits, np.array([300, 300, 300]), marked=False)
    assert not image_pool.take(3, 300)[0].any()


def test_an_image_larger_than_the_kept_one_is_a_new_mapping() -> None:
    mem, bits = image_pool.take(2, 64)
    dirty(mem, bits, [64, 64])
    image_pool.give(mem, bits, np.array([64, 64]))
    big, big_bits = image_pool.take(4, 64)
    assert not np.shares_memory(big, mem) and not big.any() and not big_bits.any()


def test_only_the_pools_own_mappings_are_kept(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    own = np.zeros((2, 64), np.uint8), np.zeros((2, 1), np.uint64)
    image_pool.give(*own, np.array([64, 64]))  # a caller's arrays: not the pool's to keep
    assert not np.shares_memory(image_pool.take(2, 64)[0], own[0])
    mem, bits = image_pool.take(2, 64)
    monkeypatch.setattr(image_pool, "KEEP_BYTES", mem.nbytes)  # with the bitmap: too large
    image_pool.give(mem, bits, np.array([64, 64]))
    assert not np.shares_memory(image_pool.take(2, 64)[0], mem)


def test_a_reuse_from_another_thread_is_zeroed_too() -> None:
    mem, bits = image_pool.take(3, 256)
    dirty(mem, bits, [256, 256, 5])
    image_pool.give(mem, bits, np.array([256, 256, 5]))
    got: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: got.extend(image_pool.take(3, 256)))
    worker.start()
    worker.join()
    assert np.shares_memory(got[0], mem) and not got[0].any() and not got[1].any()


def test_a_run_after_a_run_reads_nothing_the_last_one_wrote() -> None:
    pkg, params, inputs, expected = ksplit_matmul(load_device("tiny"))
    good = run(pkg, params=params, inputs=inputs)
    np.testing.assert_array_equal(good.outputs["out"], expected["out"])
    assert image_pool.kept_bytes() > 0  # the run handed its image back
    # the same package without its REDUCE never writes the output: on the
    # previous run's mappings it must still read as unwritten
    sv = pkg["step_vtx"].copy()
    sv[-1] = pkg.n_vertices - 1
    bad = pkg.with_arrays(step_vtx=sv, v_tile=pkg["v_tile"][:-1],
                          v_kernel=pkg["v_kernel"][:-1], v_args=pkg["v_args"][:-1])
    res = run(bad, params=params, inputs=inputs)
    assert [f.code for f in res.faults] == [F_OUTPUT]
    assert np.isnan(res.outputs["out"]).all()
    again = run(pkg, params=params, inputs=inputs)
    np.testing.assert_array_equal(again.outputs["out"], expected["out"])
