"""The package-level timing constants both engines use (docs/contracts.md §3),
and the planner's estimate of an exchange.

- EXCHANGE step: `sync_cycles + exchange_setup_cycles` + the step's scheduled
  transfer window (`step_xcycles`, simulator.xschedule).  The window is never
  shorter than the step's **endpoint bound** (`endpoint_bound`): the max over
  tiles of max(in cycles, out cycles), where a tile's
      in  = max(ceil(bytes in / in_bw),  receives * receive_cycles)
      out = max(ceil(bytes out / out_bw), send instructions * send_cycles)
  bytes in / receives count every transfer landing on the tile; bytes out and
  sends count each distinct (src tile, src addr, bytes) once (a multicast
  leaves its tile once), and a send of b bytes takes ceil(b / send_max_bytes)
  instructions.  The payload streams while the supervisor issues the control
  instructions, so each direction costs the larger of the two.  The planner
  estimates an exchange as the bound plus one arrival latency
  (`exchange_estimate`).
- REPEAT_END: `loop_overhead_cycles` per iteration, and before each jump back
  `patch_word_cycles` x the patched words of the loop on its busiest tile
  (`loop_patch_words`).  A patched word is an address word of the tile's code
  that the Repeat's patch helper rewrites: a vertex patch is one word on the
  vertex's tile; a destination patch one word on the destination tile (every
  receive has its own pointer); a source patch rewrites the address of each
  send instruction of its send on the source tile, ceil(bytes /
  `send_max_bytes`) words, and a multicast is one send, so the transfers of
  one step that share (source tile, source address, bytes) and the same patch
  (arithmetic stride, or table) count once, as they do for bytes out and
  send instructions above.
"""

from __future__ import annotations

import numpy as np

from kernels.abi import PATCH_VERTEX_ARG, PATCH_XFER_SRC
from simulator.device import Device
from simulator.package import Package

# engine scalar array layout (`device_scalars`)
DV_BASE, DV_SIZE, DV_SYNC, DV_LOOP, DV_PATCH = range(5)


def device_scalars(dev: Device) -> np.ndarray:
    """int64 [5]: the constants the engine loop reads (DV_* indices); DV_SYNC
    holds sync + exchange setup (an exchange step's transfer window is its
    schedule's, simulator.xschedule)."""
    c = dev.costs
    return np.array([dev.memory_base, dev.memory_size, c.sync_cycles + c.exchange_setup_cycles,
                     c.loop_overhead_cycles, c.patch_word_cycles], dtype=np.int64)


def endpoint_bound(dev: Device, bytes_in: np.ndarray | int, bytes_out: np.ndarray | int,
                   receives: np.ndarray | int = 0, sends: np.ndarray | int = 0) -> int:
    """The endpoint bound of one exchange step's transfer window from its
    per-tile loads (module docstring): max over tiles of max(in, out).  The
    planner's estimate of an exchange (its catalogue and tile-load model) and
    the yardstick the schedule is measured against (the schedule's window is
    never shorter: simulator.xschedule)."""
    c = dev.costs
    if all(isinstance(v, int | np.integer) for v in (bytes_in, bytes_out, receives, sends)):
        # one tile's loads (the catalogue asks ~10⁵ times a plan): plain ints
        return max(0, -(-int(bytes_in) // c.exchange_in_bytes_per_cycle),
                   int(receives) * c.receive_cycles,
                   -(-int(bytes_out) // c.exchange_out_bytes_per_cycle),
                   int(sends) * c.send_cycles)
    cin = np.maximum(-(-np.asarray(bytes_in) // c.exchange_in_bytes_per_cycle),
                     np.asarray(receives) * c.receive_cycles)
    cout = np.maximum(-(-np.asarray(bytes_out) // c.exchange_out_bytes_per_cycle),
                      np.asarray(sends) * c.send_cycles)
    return int(np.maximum(cin, cout).max(initial=0))


def exchange_estimate(dev: Device, bytes_in: np.ndarray | int, bytes_out: np.ndarray | int,
                      receives: np.ndarray | int = 0, sends: np.ndarray | int = 0) -> int:
    """The planner's cycles for one exchange step: sync and setup, the
    `endpoint_bound`, and (when anything moves) the arrival latency of a
    receiver on the sender's row (the scheduled window's last arrival is at
    least that late)."""
    bound = endpoint_bound(dev, bytes_in, bytes_out, receives, sends)
    return dev.exchange_fixed_cycles + bound + (dev.costs.arrival_latency_cycles if bound else 0)


def package_bounds(pkg: Package) -> np.ndarray:
    """int64 [S]: `endpoint_bound` of every exchange step of `pkg` at its
    unpatched (iteration-0) addresses (0 elsewhere)."""
    a, dev = pkg.arrays, pkg.device
    out = np.zeros(pkg.n_steps, dtype=np.int64)
    if pkg.n_transfers == 0:
        return out
    c, tiles = dev.costs, pkg.tiles
    step = np.repeat(np.arange(pkg.n_steps, dtype=np.int64), np.diff(a["step_xfer"]))
    nb = a["x_bytes"]
    din = step * tiles + a["x_dst_tile"]
    # a send: each distinct (step, src tile, src address, bytes)
    send = np.unique(np.stack([step, a["x_src_tile"], a["x_src_addr"], nb]), axis=1)
    dout = send[0] * tiles + send[1]
    n = pkg.n_steps * tiles
    b_in = np.bincount(din, weights=nb, minlength=n).astype(np.int64)
    r_in = np.bincount(din, minlength=n)
    b_out = np.bincount(dout, weights=send[3], minlength=n).astype(np.int64)
    s_out = np.bincount(dout, weights=-(-send[3] // c.send_max_bytes), minlength=n)
    cin = np.maximum(-(-b_in // c.exchange_in_bytes_per_cycle), r_in * c.receive_cycles)
    cout = np.maximum(-(-b_out // c.exchange_out_bytes_per_cycle),
                      s_out.astype(np.int64) * c.send_cycles)
    return np.maximum(cin, cout).reshape(pkg.n_steps, tiles).max(axis=1)


def loop_patch_words(pkg: Package) -> np.ndarray:
    """int64 [steps]: at each REPEAT_BEGIN, the words its counter patches on
    the tile with the most of them (0 elsewhere; module docstring)."""
    a = pkg.arrays
    out = np.zeros(pkg.n_steps, dtype=np.int64)
    if pkg.n_patches == 0:
        return out
    target, index, loop = a["p_target"], a["p_index"], a["p_loop"]
    src = target == PATCH_XFER_SRC
    rest = ~src
    tile = np.zeros(target.size, dtype=np.int64)
    vm = target == PATCH_VERTEX_ARG
    tile[vm] = a["v_tile"][index[vm]]
    dm = target > PATCH_XFER_SRC
    tile[dm] = a["x_dst_tile"][index[dm]]
    keys = [loop[rest] * pkg.tiles + tile[rest]]
    words = [np.ones(int(rest.sum()), dtype=np.int64)]
    if src.any():
        x = index[src]
        step = np.searchsorted(a["step_xfer"], x, side="right") - 1
        # one send: (loop, step, tile, address, bytes, mode, stride, table
        # address); packed into five sort keys (loop and step, tile and
        # address, bytes and mode fit 64 bits) and kept where one differs
        tile = a["x_src_tile"][x]
        nbytes = a["x_bytes"][x]
        cols = (a["p_table_addr"][src], a["p_stride"][src], nbytes * 2 + a["p_mode"][src],
                (tile << 32) | (a["x_src_addr"][x] & 0xFFFFFFFF), (loop[src] << 32) | step)
        order = np.lexsort(cols)
        first = np.ones(order.size, dtype=bool)
        for c in cols:
            sc = c[order]
            first[1:] &= sc[1:] == sc[:-1]
        first = ~first
        first[0] = True
        sel = order[first]
        keys.append(loop[src][sel] * pkg.tiles + tile[sel])
        words.append(-(-nbytes[sel] // pkg.device.costs.send_max_bytes))
    key, w = np.concatenate(keys), np.concatenate(words)
    uk, inv = np.unique(key, return_inverse=True)
    per = np.bincount(inv, weights=w).astype(np.int64)
    np.maximum.at(out, uk // pkg.tiles, per)
    return out
