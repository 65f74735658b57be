"""simulator.footprint's exchange-table model against its obvious numpy twin."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.footprint import follows_previous, xtable_bytes


def xtable_twin(dev: simulator.Device, x_step: np.ndarray, src_tile: np.ndarray,
                src_key: np.ndarray, dst_tile: np.ndarray, nbytes: np.ndarray,
                follows: np.ndarray) -> np.ndarray:
    """The module docstring's rule, in sorts and uniques."""
    c = dev.costs
    out = np.zeros(dev.tiles, dtype=np.int64)
    sends = np.unique(np.stack([x_step, src_tile, src_key, nbytes], axis=1), axis=0)
    np.add.at(out, sends[:, 1], c.xt_send_bytes)
    np.add.at(out, sends[sends[:, 3] > c.xt_long_bytes, 1], c.xt_send_long_bytes)
    np.add.at(out, dst_tile, c.xt_receive_bytes)
    np.add.at(out, dst_tile[~follows], c.xt_jump_bytes)
    phases = np.unique(np.concatenate([x_step * dev.tiles + src_tile,
                                       x_step * dev.tiles + dst_tile]))
    np.add.at(out, phases % dev.tiles, c.xt_phase_bytes)
    return out


def follows_twin(x_step: np.ndarray, dst_tile: np.ndarray, dst_key: np.ndarray,
                 dst_end: np.ndarray) -> np.ndarray:
    out = np.zeros(x_step.size, dtype=bool)
    last: dict[tuple[int, int], int] = {}
    for x in range(x_step.size):
        k = (int(x_step[x]), int(dst_tile[x]))
        out[x] = k in last and int(dst_key[x]) == last[k]
        last[k] = int(dst_end[x])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_xtable_and_follows_match_their_twins(seed: int) -> None:
    dev = simulator.load_device("tiny")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    step = np.sort(rng.integers(0, 6, n))
    src_tile = rng.integers(0, dev.tiles, n)
    dst_tile = rng.integers(0, dev.tiles, n)
    src_key = rng.integers(0, 5, n) * 64 + (rng.integers(0, 3, n) << 32)  # repeats: multicasts
    nbytes = rng.choice([8, 64, 256, 300, 4096], n)  # around xt_long_bytes
    dst_key = rng.integers(0, 8, n) * 8
    dst_end = dst_key + rng.choice([8, 16], n)
    follows = follows_previous(step, dst_tile, dst_key, dst_end)
    np.testing.assert_array_equal(follows, follows_twin(step, dst_tile, dst_key, dst_end))
    assert follows.any() and not follows.all()
    np.testing.assert_array_equal(
        xtable_bytes(dev, step, src_tile, src_key, dst_tile, nbytes, follows),
        xtable_twin(dev, step, src_tile, src_key, dst_tile, nbytes, follows))


def test_empty_program_has_no_tables() -> None:
    dev = simulator.load_device("tiny")
    e = np.zeros(0, dtype=np.int64)
    assert not xtable_bytes(dev, e, e, e, e, e, np.zeros(0, dtype=bool)).any()
    assert follows_previous(e, e, e, e).size == 0
