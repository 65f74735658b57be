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
- exchange tables (the encoded send/receive rows of each exchange phase):
  per send `xt_send_bytes`, plus `xt_send_long_bytes` when it carries more than
  `xt_long_bytes`; per receive `xt_receive_bytes`, plus `xt_jump_bytes` when
  its destination does not follow the previous receive of the tile in that
  phase; `xt_phase_bytes` per phase in which the tile sends or receives.  A
  send is one distinct (source address, bytes) of a tile in a phase (a
  multicast is one send); every transfer is a receive on its destination.

Callers describe the program with flat arrays; `follows` marks the receives
whose destination continues the previous receive of that tile and phase (the
planner marks only what it knows before allocation: the same buffer at the
next offset, so its count is an upper bound of the package's).
"""

from __future__ import annotations

import numpy as np

from kernels.registry import KERNELS
from simulator.device import Device


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


def xtable_bytes(dev: Device, x_step: np.ndarray, src_tile: np.ndarray, src_key: np.ndarray,
                 dst_tile: np.ndarray, nbytes: np.ndarray, follows: np.ndarray) -> np.ndarray:
    """int64 [tiles] exchange-table bytes (module docstring).  `src_key`
    identifies a transfer's source region within its tile (an address, or a
    buffer * 2**32 + offset): transfers of one step with equal (src tile,
    src_key, bytes) are one send."""
    c = dev.costs
    tiles = dev.tiles
    out = np.zeros(tiles, dtype=np.int64)
    if x_step.size == 0:
        return out
    order = np.lexsort((nbytes, src_key, src_tile, x_step))
    k = (x_step[order], src_tile[order], src_key[order], nbytes[order])
    first = np.ones(order.size, dtype=bool)
    first[1:] = (k[0][1:] != k[0][:-1]) | (k[1][1:] != k[1][:-1]) | (k[2][1:] != k[2][:-1]) \
        | (k[3][1:] != k[3][:-1])
    send_tile, send_bytes = k[1][first], k[3][first]
    out += np.bincount(send_tile, minlength=tiles) * c.xt_send_bytes
    out += np.bincount(send_tile[send_bytes > c.xt_long_bytes], minlength=tiles) \
        * c.xt_send_long_bytes
    out += np.bincount(dst_tile, minlength=tiles) * c.xt_receive_bytes
    out += np.bincount(dst_tile[~follows], minlength=tiles) * c.xt_jump_bytes
    phases = np.unique(np.concatenate([x_step * tiles + src_tile, x_step * tiles + dst_tile]))
    out += np.bincount(phases % tiles, minlength=tiles) * c.xt_phase_bytes
    return out


def follows_previous(x_step: np.ndarray, dst_tile: np.ndarray, dst_key: np.ndarray,
                     dst_end: np.ndarray) -> np.ndarray:
    """bool [X]: the receive starts where the previous receive of its tile in
    its step ended (transfers in their given order).  `dst_key` is the start
    and `dst_end` the end of each destination in one address space (absolute
    addresses, or buffer * 2**32 + offset)."""
    n = x_step.size
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    order = np.lexsort((np.arange(n), dst_tile, x_step))
    s, t = x_step[order], dst_tile[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = (s[1:] == s[:-1]) & (t[1:] == t[:-1])
    cont = np.zeros(n, dtype=bool)
    cont[1:] = same[1:] & (dst_key[order][1:] == dst_end[order][:-1])
    out[order] = cont
    return out
