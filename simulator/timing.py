"""The package-level timing constants both engines use (docs/contracts.md §3).

- EXCHANGE step: `sync_cycles + exchange_setup_cycles` + the max over tiles
  of max(in cycles, out cycles), where a tile's
      in  = max(ceil(bytes in / in_bw),  receives * receive_cycles)
      out = max(ceil(bytes out / out_bw), send instructions * send_cycles)
  bytes in / receives count every transfer landing on the tile; bytes out and
  sends count each distinct (src tile, src addr, bytes) once (a multicast
  leaves its tile once), and a send of b bytes takes ceil(b / send_max_bytes)
  instructions.  The payload streams while the supervisor issues the control
  instructions, so each direction costs the larger of the two.
- REPEAT_END: `loop_overhead_cycles` per iteration, and before each jump back
  `patch_word_cycles` x the patched words of the loop on its busiest tile
  (`loop_patch_words`: a vertex patch counts on the vertex's tile, a transfer
  source patch on the source tile, a destination patch on the destination).
"""

from __future__ import annotations

import numpy as np

from kernels.abi import PATCH_VERTEX_ARG, PATCH_XFER_SRC
from simulator.device import Device
from simulator.package import Package

# engine scalar array layout (`device_scalars`)
DV_BASE, DV_SIZE, DV_IN_BW, DV_OUT_BW, DV_SYNC, DV_LOOP, DV_SEND, DV_SEND_MAX, DV_RECV, \
    DV_PATCH = range(10)


def device_scalars(dev: Device) -> np.ndarray:
    """int64 [10]: the constants the engine loop reads (DV_* indices); DV_SYNC
    holds sync + exchange setup."""
    c = dev.costs
    return np.array([dev.memory_base, dev.memory_size, c.exchange_in_bytes_per_cycle,
                     c.exchange_out_bytes_per_cycle, c.sync_cycles + c.exchange_setup_cycles,
                     c.loop_overhead_cycles, c.send_cycles, c.send_max_bytes, c.receive_cycles,
                     c.patch_word_cycles], dtype=np.int64)


def loop_patch_words(pkg: Package) -> np.ndarray:
    """int64 [steps]: at each REPEAT_BEGIN, the patches its counter drives on
    the tile with the most of them (0 elsewhere)."""
    a = pkg.arrays
    out = np.zeros(pkg.n_steps, dtype=np.int64)
    if pkg.n_patches == 0:
        return out
    target, index = a["p_target"], a["p_index"]
    tile = np.where(target == PATCH_VERTEX_ARG, a["v_tile"][np.where(
        target == PATCH_VERTEX_ARG, index, 0)] if pkg.n_vertices else 0, 0)
    if pkg.n_transfers:
        xi = np.where(target != PATCH_VERTEX_ARG, index, 0)
        tile = np.where(target == PATCH_XFER_SRC, a["x_src_tile"][xi], tile)
        tile = np.where(target > PATCH_XFER_SRC, a["x_dst_tile"][xi], tile)
    key = a["p_loop"] * pkg.tiles + tile
    keys, counts = np.unique(key, return_counts=True)
    np.maximum.at(out, keys // pkg.tiles, counts)
    return out
