"""The Numba engine's per-transfer scratch, kept from one run to the next.

An exchange step's passes write a few arrays as long as the step (patched
addresses, check bits, the send order) or as the package's transfers (the
buffer row each end was found in); for siglip-so400m 1 layer on c600 (2.9M
transfers) about 75 MB.  Allocated inside the run, they were mapped and
unmapped every run, each page faulted in and zeroed by the kernel again:
22k minor faults a run, 5-6k with the scratch kept (measured with
`resource.getrusage` around `simulator.run` on the 2-core development
machine; the rest are the kernels' blocks and the outputs).
So `simulator.engines.numba.execute` takes them from here (`take`) and hands
them back (`give`): one slot, at most KEEP_BYTES, like simulator.image_pool.
A run in another thread while the slot is out gets fresh arrays.

Every array is written before it is read in a run (the engine's contract
for each is beside its use in `_superstep_loop`) except `xok`, which
`take` clears.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

KEEP_BYTES = 512 << 20


class Scratch(NamedTuple):
    """Scratch of one run (lengths at least those `take` was asked for)."""

    x_src: np.ndarray  # int64 [step]: patched source address per transfer
    x_dst: np.ndarray  # int64 [step]: patched destination address
    xflag: np.ndarray  # int8 [step]: check_transfer bits
    xbits: np.ndarray  # int8 [step]: check_ends bits
    xrow: np.ndarray  # int32 [2 x transfers]: access-index row of each end
    xok: np.ndarray  # bool [transfers]: checked clean without patches (cleared)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self)


_lock = threading.Lock()
_slot: list[Scratch] = []


def take(step: int, transfers: int) -> Scratch:
    """Scratch for a package whose largest exchange step has `step`
    transfers, `transfers` in all: the kept arrays when they are long
    enough, else new ones."""
    step, transfers = max(step, 1), max(transfers, 1)
    with _lock:
        kept = _slot.pop() if _slot else None
    if kept is None or kept.x_src.size < step or kept.xok.size < transfers:
        kept = Scratch(x_src=np.empty(step, dtype=np.int64),
                       x_dst=np.empty(step, dtype=np.int64),
                       xflag=np.empty(step, dtype=np.int8),
                       xbits=np.empty(step, dtype=np.int8),
                       xrow=np.empty(2 * transfers, dtype=np.int32),
                       xok=np.empty(transfers, dtype=np.bool_))
    kept.xok[:transfers] = False
    return kept


def give(scratch: Scratch) -> None:
    """Keep `scratch` (no longer used) for the next `take`."""
    if scratch.nbytes <= KEEP_BYTES:
        with _lock:
            _slot[:] = [scratch]


def release() -> None:
    """Drop the kept scratch."""
    with _lock:
        _slot.clear()
