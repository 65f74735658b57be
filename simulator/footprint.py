"""The footprint model: the code and exchange-table bytes a tile must hold.

One definition, used by the planner's link (to reserve the bytes before
allocation, from its program) and by the verifier (to check a package's
reservation, from its arrays), with the device's `[costs]` constants:

- code (every tile that holds anything): `runtime_bytes` (the linked runtime)
  + `kernel_image_bytes` of each distinct kernel the tile runs + generated
  program bytes: `vertex_code_bytes` per vertex on the tile (a Repeat body's
  vertices once: every iteration runs the same code), `step_code_bytes` per
  compute step in which the tile has a vertex, `loop_code_bytes` per Repeat
  loop of the program;
- exchange tables (the encoded send/receive rows of each exchange phase, as
  the exchange schedule issues them, simulator.xschedule): per send (a piece
  of the schedule: a multicast is one) `xt_send_bytes`, plus
  `xt_send_long_bytes` when it carries more than `xt_long_bytes`; per receive
  (each piece a transfer hears) `xt_receive_bytes`, plus `xt_jump_bytes` when
  the transfer's destination does not follow the previous receive of the tile
  in that phase; `xt_phase_bytes` per phase in which the tile sends or
  receives.

Callers describe the program with flat arrays; `follows` marks the receives
whose destination continues the previous receive of that tile and phase (the
planner marks only what it knows before allocation: the same buffer at the
next offset, so its count is an upper bound of the package's).
"""

from __future__ import annotations

import numpy as np

from kernels.registry import KERNELS
from simulator.device import Device
from tilecommon.jit import kjit


def code_bytes(dev: Device, used: np.ndarray, v_tile: np.ndarray, v_kernel: np.ndarray,
               v_step: np.ndarray, loops: int) -> np.ndarray:
    """int64 [tiles] code bytes (module docstring); `used` bool [tiles]."""
    c = dev.costs
    tiles = dev.tiles
    out = np.where(used, c.runtime_bytes + loops * c.loop_code_bytes, 0).astype(np.int64)
    out += np.bincount(v_tile, minlength=tiles) * c.vertex_code_bytes
    if v_tile.size:
        steps = np.unique(v_step * tiles + v_tile)
        out += np.bincount(steps % tiles, minlength=tiles) * c.step_code_bytes
    known = np.array(sorted(KERNELS), dtype=np.int64)
    image = np.array([c.image_bytes(int(k)) for k in known.tolist()], dtype=np.int64)
    pos = np.minimum(np.searchsorted(known, v_kernel), known.size - 1)
    ok = known[pos] == v_kernel  # unknown kernels have no image
    runs = np.zeros((tiles, known.size), dtype=np.int64)  # 1 where a tile runs a kernel
    runs[v_tile[ok], pos[ok]] = 1
    return out + runs @ image


def xtable_bytes(dev: Device, x_step: np.ndarray, src_tile: np.ndarray, dst_tile: np.ndarray,
                 follows: np.ndarray, x_send: np.ndarray, q_send: np.ndarray,
                 q_bytes: np.ndarray) -> np.ndarray:
    """int64 [tiles] exchange-table bytes (module docstring) of the sends
    the schedule issues: transfer x belongs to the send led by transfer
    `x_send[x]`; piece k of the schedule (a send row: a multicast is one)
    is a piece of the send led by `q_send[k]` and carries `q_bytes[k]`.  A
    transfer's destination holds a receive row per piece of its send."""
    c = dev.costs
    out = np.zeros(dev.tiles, dtype=np.int64)
    if x_step.size == 0:
        return out
    i64 = np.int64
    receives = np.bincount(q_send, minlength=x_send.size)[x_send]
    send_tile, send_bytes = src_tile[q_send], q_bytes
    order = _by_step(x_step)
    if order is not None:  # the phase entries count (step, tile) pairs step by step
        x_step, src_tile, dst_tile = x_step[order], src_tile[order], dst_tile[order]
        follows, receives = follows[order], receives[order]
    _xtable(x_step.astype(i64, copy=False), src_tile.astype(i64, copy=False),
            dst_tile.astype(i64, copy=False), follows.astype(np.bool_, copy=False),
            receives.astype(i64, copy=False), send_tile.astype(i64, copy=False),
            send_bytes.astype(i64, copy=False),
            np.array([c.xt_send_bytes, c.xt_send_long_bytes, c.xt_long_bytes,
                      c.xt_receive_bytes, c.xt_jump_bytes, c.xt_phase_bytes], dtype=i64),
            out)
    return out


def follows_previous(x_step: np.ndarray, dst_tile: np.ndarray, dst_key: np.ndarray,
                     dst_end: np.ndarray) -> np.ndarray:
    """bool [X]: the receive starts where the previous receive of its tile in
    its step ended (transfers in their given order).  `dst_key` is the start
    and `dst_end` the end of each destination in one address space (absolute
    addresses, or buffer * 2**32 + offset)."""
    out = np.zeros(x_step.size, dtype=np.bool_)
    if x_step.size == 0:
        return out
    i64 = np.int64
    order = _by_step(x_step)
    if order is not None:
        x_step, dst_tile, dst_key, dst_end = (a[order] for a in (x_step, dst_tile, dst_key,
                                                                  dst_end))
    _follows(x_step.astype(i64, copy=False), dst_tile.astype(i64, copy=False),
             dst_key.astype(i64, copy=False), dst_end.astype(i64, copy=False), out)
    if order is not None:
        back = np.empty_like(out)
        back[order] = out
        out = back
    return out


def _by_step(x_step: np.ndarray) -> np.ndarray | None:
    """None when the transfers come step by step (a package's and a
    program's do: CSR by step), else the stable order that makes them."""
    if x_step.size < 2 or bool((x_step[1:] >= x_step[:-1]).all()):
        return None
    return np.argsort(x_step, kind="stable")


@kjit
def _xtable(step, src_tile, dst_tile, follows, receives, send_tile, send_bytes, xt, out):  # type: ignore[no-untyped-def]
    """`xtable_bytes` into `out`, the transfers step by step (`step`
    ascending); xt = (send, send long, long bytes, receive, jump, phase)
    bytes.  One pass: a tile's phase entry is counted at its first transfer
    (sent or heard) of each step."""
    for k in range(send_tile.shape[0]):
        out[send_tile[k]] += xt[0]
        if send_bytes[k] > xt[2]:
            out[send_tile[k]] += xt[1]
    phase = np.full(out.shape[0], -1, dtype=np.int64)  # last step counted, per tile
    for x in range(step.shape[0]):
        s, ts, td = step[x], src_tile[x], dst_tile[x]
        if phase[ts] != s:
            phase[ts] = s
            out[ts] += xt[5]
        if phase[td] != s:
            phase[td] = s
            out[td] += xt[5]
        out[td] += xt[3] * receives[x]
        if not follows[x]:
            out[td] += xt[4]


@kjit
def _follows(step, dst_tile, dst_key, dst_end, out):  # type: ignore[no-untyped-def]
    """`follows_previous` into `out`, the transfers step by step: one pass
    keeping each tile's last receive (its step and end)."""
    tiles = dst_tile.max() + 1
    last_step = np.full(tiles, -1, dtype=np.int64)
    last_end = np.zeros(tiles, dtype=np.int64)
    for x in range(step.shape[0]):
        t = dst_tile[x]
        out[x] = last_step[t] == step[x] and dst_key[x] == last_end[t]
        last_step[t] = step[x]
        last_end[t] = dst_end[x]
