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
    _follows(x_step.astype(i64, copy=False), dst_tile.astype(i64, copy=False),
             dst_key.astype(i64, copy=False), dst_end.astype(i64, copy=False), out)
    return out


@kjit
def _group_order(step, tile):  # type: ignore[no-untyped-def]
    """Stable order of the transfers by (step, tile) — a counting sort over
    the (step, tile) pairs that occur — and the start of each group in it
    (int64 [groups + 1])."""
    n = step.shape[0]
    s_lo, s_hi, t_hi = step.min(), step.max(), tile.max() + 1
    width = t_hi
    nkeys = (s_hi - s_lo + 1) * width
    count = np.zeros(nkeys + 1, dtype=np.int64)
    for x in range(n):
        count[(step[x] - s_lo) * width + tile[x] + 1] += 1
    groups = 0
    for k in range(1, nkeys + 1):
        if count[k] > 0:
            groups += 1
        count[k] += count[k - 1]
    order = np.empty(n, dtype=np.int64)
    pos = count[:nkeys].copy()
    for x in range(n):
        k = (step[x] - s_lo) * width + tile[x]
        order[pos[k]] = x
        pos[k] += 1
    starts = np.empty(groups + 1, dtype=np.int64)
    g = 0
    for k in range(nkeys):
        if count[k + 1] > count[k]:
            starts[g] = count[k]
            g += 1
    starts[groups] = n
    return order, starts


@kjit
def _xtable(step, src_tile, dst_tile, follows, receives, send_tile, send_bytes, xt, out):  # type: ignore[no-untyped-def]
    """`xtable_bytes` into `out`; xt = (send, send long, long bytes, receive,
    jump, phase) bytes."""
    n = step.shape[0]
    for k in range(send_tile.shape[0]):
        out[send_tile[k]] += xt[0]
        if send_bytes[k] > xt[2]:
            out[send_tile[k]] += xt[1]
    # the phase entry of each tile that sends in a step
    order, starts = _group_order(step, src_tile)
    for g in range(starts.shape[0] - 1):
        out[src_tile[order[starts[g]]]] += xt[5]
    # receives; and the phase entry of a tile that only receives in a step
    for x in range(n):
        out[dst_tile[x]] += xt[3] * receives[x]
        if not follows[x]:
            out[dst_tile[x]] += xt[4]
    s_order, s_starts = order, starts
    order, starts = _group_order(step, dst_tile)
    si = 0
    for g in range(starts.shape[0] - 1):
        x = order[starts[g]]
        st, t = step[x], dst_tile[x]
        # was tile t a sender in step st? (both group lists ascend by (step, tile))
        while si < s_starts.shape[0] - 1:
            y = s_order[s_starts[si]]
            if step[y] < st or (step[y] == st and src_tile[y] < t):
                si += 1
            else:
                break
        sent = False
        if si < s_starts.shape[0] - 1:
            y = s_order[s_starts[si]]
            sent = step[y] == st and src_tile[y] == t
        if not sent:
            out[t] += xt[5]


@kjit
def _follows(step, dst_tile, dst_key, dst_end, out):  # type: ignore[no-untyped-def]
    """`follows_previous` into `out`."""
    order, starts = _group_order(step, dst_tile)
    for g in range(starts.shape[0] - 1):
        for k in range(starts[g] + 1, starts[g + 1]):
            out[order[k]] = dst_key[order[k]] == dst_end[order[k - 1]]
