"""simulator.engines.numba_scratch: the engine's per-transfer scratch, kept
between runs, never carries one run's state into the next."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_device, run
from simulator.engines import numba_scratch
from simulator.engines.base import F_SRC_BUFFER
from simulator.testing import ksplit_matmul


@pytest.fixture(autouse=True)
def empty_slot():  # type: ignore[no-untyped-def]
    numba_scratch.release()
    yield
    numba_scratch.release()


def test_kept_scratch_is_reused_and_its_clean_marks_cleared() -> None:
    first = numba_scratch.take(10, 40)
    assert first.x_src.size == 10 and first.xrow.size == 80 and first.xok.size == 40
    first.xok[:] = True
    numba_scratch.give(first)
    again = numba_scratch.take(6, 30)
    assert again.x_src is first.x_src  # long enough: the same arrays
    assert not again.xok[:30].any()
    numba_scratch.give(again)
    bigger = numba_scratch.take(6, 41)
    assert bigger.xok is not first.xok and bigger.xok.size == 41 and not bigger.xok.any()


def test_a_transfer_checked_clean_in_one_run_is_checked_again_in_the_next() -> None:
    pkg, params, inputs, expected = ksplit_matmul(load_device("tiny"))
    good = run(pkg, params=params, inputs=inputs)
    assert good.ok and pkg.n_transfers > 0
    src = pkg["x_src_addr"].copy()
    src[0] = 1 << 20  # outside every buffer of its tile
    bad = run(pkg.with_arrays(x_src_addr=src), params=params, inputs=inputs)
    assert F_SRC_BUFFER in [f.code for f in bad.faults]
    again = run(pkg, params=params, inputs=inputs)
    assert again.ok
    np.testing.assert_array_equal(again.outputs["out"], expected["out"])
