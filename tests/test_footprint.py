"""simulator.footprint's exchange-table model against its obvious numpy twin."""

from __future__ import annotations

import numpy as np
import pytest

import simulator
from simulator.footprint import follows_previous, xtable_bytes
from simulator.xschedule import send_leaders


def xtable_twin(dev: simulator.Device, x_step: np.ndarray, src_tile: np.ndarray,
                dst_tile: np.ndarray, follows: np.ndarray, receives: np.ndarray,
                send_tile: np.ndarray, send_bytes: np.ndarray) -> np.ndarray:
    """The module docstring's rule, in sorts and uniques."""
    c = dev.costs
    out = np.zeros(dev.tiles, dtype=np.int64)
    np.add.at(out, send_tile, c.xt_send_bytes)
    np.add.at(out, send_tile[send_bytes > c.xt_long_bytes], c.xt_send_long_bytes)
    np.add.at(out, dst_tile, c.xt_receive_bytes * receives)
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
    # the scheduler's sends, each cut into one or two pieces (send rows); a
    # transfer is a receive row per piece of its send
    xptr = np.searchsorted(step, np.arange(7))
    lead = send_leaders(xptr, src_tile, dst_tile, nbytes, src_key, np.zeros(n, np.int64),
                        dev.tiles)
    sends = np.flatnonzero(lead == np.arange(n))
    cuts = rng.integers(1, 3, sends.size)
    q_send = np.repeat(sends, cuts)  # the send each piece belongs to
    send_tile = np.repeat(src_tile[sends], cuts)
    half = nbytes[sends] // 2
    send_bytes = np.concatenate([[b] if k == 1 else [h, b - h]
                                 for b, h, k in zip(nbytes[sends], half, cuts, strict=True)])
    receives = np.zeros(n, dtype=np.int64)
    receives[sends] = cuts
    receives = receives[lead]
    assert (receives == 2).any()  # cut sends
    np.testing.assert_array_equal(
        xtable_bytes(dev, step, src_tile, dst_tile, follows, lead, q_send, send_bytes),
        xtable_twin(dev, step, src_tile, dst_tile, follows, receives, send_tile, send_bytes))


def test_empty_program_has_no_tables() -> None:
    dev = simulator.load_device("tiny")
    e = np.zeros(0, dtype=np.int64)
    assert not xtable_bytes(dev, e, e, e, np.zeros(0, dtype=bool), e, e, e).any()
    assert follows_previous(e, e, e, e).size == 0


def test_transfers_out_of_step_order_count_the_same() -> None:
    """Transfers not laid out step by step (a hand-made program) get what
    their step-by-step order gets: the one-pass counts sort them first."""
    dev = simulator.load_device("tiny")
    rng = np.random.default_rng(7)
    n = 300
    step = rng.integers(0, 5, n)
    assert (np.diff(step) < 0).any()
    src_tile = rng.integers(0, dev.tiles, n)
    dst_tile = rng.integers(0, dev.tiles, n)
    dst_key = rng.integers(0, 8, n) * 8
    dst_end = dst_key + rng.choice([8, 16], n)
    follows = follows_previous(step, dst_tile, dst_key, dst_end)
    np.testing.assert_array_equal(follows, follows_twin(step, dst_tile, dst_key, dst_end))
    assert follows.any()
    lead = np.arange(n)  # unicasts, one piece each
    nbytes = rng.choice([8, 300, 4096], n)
    got = xtable_bytes(dev, step, src_tile, dst_tile, follows, lead, lead, nbytes)
    want = xtable_twin(dev, step, src_tile, dst_tile, follows, np.ones(n, np.int64),
                       src_tile, nbytes)
    np.testing.assert_array_equal(got, want)
