"""Hand-built symbolic Programs for the back-end tests (schedule, allocate, link).

`loop_program(trips)` on the `tiny` device computes y = x + Σ_i w[i] (fp16,
rounded after every add) with:

- an exchange: x (tile 0) → a landing buffer on tile 1;
- a compute phase copying the landing buffer into ping buffer A on tile 1,
  and an independent copy of input s on tile 2 (the scheduler merges the two);
- a Repeat of `trips` iterations on tile 1: ADD(P[i % 2], w[i]) → P[(i+1) % 2]
  where P = (A, B) is a ping-pong pair addressed by `seq` refs and w[i] is an
  iterated parameter addressed by `iter_stride` (64 bytes per layer);
- an exchange of the final buffer back to the output y on tile 0.

With 3 trips the ping-pong addresses (A, B, A) are not an arithmetic sequence
(a table patch); with 2 trips (A, B) they are (an arithmetic patch).
"""

from __future__ import annotations

import numpy as np

from kernels.abi import ADD, COPY
from planner.lowering.expand_redist import Loc, loc_bufs, ref
from planner.lowering.program import NARGS, IOBlock, LoopMark, Phase, Program, Ref, Transfer, Vertex

ROWS, COLS = 4, 8
NBYTES = ROWS * COLS * 2  # fp16
LD = COLS * 2
FP16 = 1


def _args(values: dict[int, int]) -> tuple[int, ...]:
    a = [0] * 16
    for k, v in values.items():
        a[k] = v
    return tuple(a)


def dict_vertex(tile: int, kid: int, args: dict[int, int], reads: dict[int, Loc],
                writes: dict[int, Loc], extra: dict[int, int] | None = None) -> Vertex:
    """The obvious twin of `planner.lowering.expand_ops.make_vertex`: scalar `args`,
    address args from `reads`/`writes` locs (arg index → loc, plus `extra`
    byte offsets)."""
    a = [0] * NARGS
    for k, v in args.items():
        a[k] = int(v)
    extra = extra or {}
    refs = tuple(ref(k, loc, extra.get(k, 0)) for k, loc in sorted({**reads, **writes}.items()))
    rb = tuple(sorted({b for loc in reads.values() for b in loc_bufs(loc)}))
    wb = tuple(sorted({b for loc in writes.values() for b in loc_bufs(loc)}))
    return Vertex(tile, kid, tuple(a), refs, rb, wb)


def copy_vertex(tile: int, src: int, dst: int) -> Vertex:
    args = _args({1: LD, 3: LD, 4: ROWS, 5: LD})
    return Vertex(tile, COPY, args, (Ref(0, src), Ref(2, dst)), (src,), (dst,))


def loop_program(trips: int) -> Program:
    p = Program()
    x = p.new_buf(0, NBYTES, "activation", "x", persistent=True)
    y = p.new_buf(0, NBYTES, "activation", "y", persistent=True)
    w = p.new_buf(1, trips * NBYTES, "parameter", "w", persistent=True)
    land = p.new_buf(1, NBYTES, "exchange-landing", "x@1")
    a = p.new_buf(1, NBYTES, "activation", "ping")
    b = p.new_buf(1, NBYTES, "activation", "pong")
    side_in = p.new_buf(2, NBYTES, "activation", "side_in", persistent=True)
    side_out = p.new_buf(2, NBYTES, "activation", "side_out")
    pair = (a, b)

    p.items.append(Phase("exchange", "x to tile 1", transfers=[Transfer(Ref(1, x), Ref(1, land),
                                                                        NBYTES)]))
    p.items.append(Phase("compute", "x into ping", vertices=[copy_vertex(1, land, a)]))
    p.items.append(Phase("compute", "side copy", vertices=[copy_vertex(2, side_in, side_out)]))
    p.items.append(LoopMark(True, trips, "layers"))
    src_seq = tuple((pair[i % 2], 0) for i in range(trips))
    dst_seq = tuple((pair[(i + 1) % 2], 0) for i in range(trips))
    add = Vertex(
        1, ADD, _args({1: LD, 3: LD, 5: LD, 6: ROWS, 7: COLS, 8: FP16, 9: FP16, 10: FP16}),
        (Ref(0, a, seq=src_seq), Ref(2, w, iter_stride=NBYTES), Ref(4, b, seq=dst_seq)),
        (a, b, w), (a, b),
    )
    p.items.append(Phase("compute", "add w[i]", vertices=[add]))
    p.items.append(LoopMark(False, trips, "layers"))
    final = pair[trips % 2]
    p.items.append(Phase("exchange", "to y", transfers=[Transfer(Ref(1, final), Ref(1, y),
                                                                  NBYTES)]))
    p.io_tensors = [
        {"name": "x", "role": "input", "shape": [ROWS, COLS], "dtype": "fp16", "scale_exp": 0},
        {"name": "w", "role": "parameter", "shape": [trips, ROWS, COLS], "dtype": "fp16",
         "scale_exp": 0},
        {"name": "s", "role": "input", "shape": [ROWS, COLS], "dtype": "fp16", "scale_exp": 0},
        {"name": "y", "role": "output", "shape": [ROWS, COLS], "dtype": "fp16", "scale_exp": 0},
    ]
    p.io = [
        IOBlock("x", "input", x, 0, (0, 0, 0), (1, ROWS, COLS), NBYTES, LD),
        IOBlock("w", "parameter", w, 0, (0, 0, 0), (trips, ROWS, COLS), NBYTES, LD),
        IOBlock("s", "input", side_in, 0, (0, 0, 0), (1, ROWS, COLS), NBYTES, LD),
        IOBlock("y", "output", y, 0, (0, 0, 0), (1, ROWS, COLS), NBYTES, LD),
    ]
    return p


def loop_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x + w[0] + ... with fp16 rounding after every add."""
    h = x.astype(np.float16)
    for i in range(w.shape[0]):
        h = (h.astype(np.float32) + w[i].astype(np.float16).astype(np.float32)).astype(np.float16)
    return h
