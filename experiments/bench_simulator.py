"""Benchmark: simulator throughput, timing-only and with numerics.

Question: how fast does the Numba engine run a whole-chip package?  Targets:
at least 1e7 vertex invocations per second timing-only, and, with
numerics, at most 3x the time of a plain numpy float32 computation of the same
matmuls, measured in the same run.

The synthetic package (built here, not by the planner) uses every tile of the
device.  With (M, K, N) = SHAPE, each tile holds an fp8 activation block
A [2M, K], a window of WINDOW fp8 weight blocks W [WINDOW, K, N] and an fp16
output C [2M, N].  One Repeat of `trips` iterations runs, per iteration:

- COMPUTE: two MATMUL vertices per tile, C[rows h] = A[rows h] @ W[i % WINDOW]
  (fp8 x fp8 -> fp16); the weight address is a table patch (the window wraps,
  so it is not arithmetic), the tables live in the tiles' support buffers;
- EXCHANGE: every tile sends its C block to the next tile's landing buffer
  (a ring; invariant addresses).

The timing-only run uses enough iterations for MIN_INVOCATIONS vertex
invocations; it is run twice, with the weight-address patches (every vertex
patched: its cycles are recomputed and its regions re-checked each iteration)
and without (unpatched vertices' and exchanges' cycles and checks are done
once and reused).  The run-time invariant checks are on in every figure; what
they cost is the patched package's engine time with them against without
(`simulator.engines.numba.execute(pkg, checks=False)`, which only this
benchmark uses).  Verification
time of the patched package is reported too (every iteration's patched
addresses are checked).  The numerics run uses
TRIPS_NUMERICS iterations; the numpy twin computes the same matmuls as one
batched float32 `np.matmul` per iteration over all tiles (operands decoded
once, outside the timed region), and the simulator's output is checked
against it (fp16 rounding of the same fp32 sums).  "run" time includes the
memory image (encoding and placing A and W) and reading C back; "engine only"
is the jitted superstep loop.  Every timed region is the best of REPEATS.

The planner-package case (`--layers`, default 1; `--layers 1,27` for the
whole tower): siglip-so400m on c600, the default baseline (no optimizer
steps), `planner.reference` against `simulator.run(..., numerics=True)` with
the run-time checks on (they always are with numerics), one untimed warm-up
of each, then `--repeats` timed runs alternating; medians and their ratio
(target <= 1.5x).  Like any run after a run in one process, the timed runs
reuse the memory image's mappings (simulator.image_pool); a process's first
numerics run also faults them in (1 layer: about 70k pages, 0.1-0.2 s
here).  Peak RSS is the process's high-water mark after that row
(`resource.getrusage`), so it only grows down the table (the kept mappings
of the 1-layer image count in the 27-layer row's reference runs).  The outputs are
checked against the reference (relative Frobenius error).  Then the profile
of the first row's last run (`SimResult.profile`): host seconds per phase of
the engine loop, the memory image and reading the outputs back.

Reproduce:  .venv/bin/python experiments/bench_simulator.py [--layers 1,27] [--repeats 3]
Writes artifacts/bench_simulator.txt (the tables).
"""

# ruff: noqa: E402  (the BLAS thread variables must be set before numpy loads)
from __future__ import annotations

from tilecommon.runtime import pin_blas_env

# Single-threaded BLAS on both sides (numpy's and the one numba's np.dot uses):
# on a shared 2-core machine, spinning BLAS threads make timings meaningless.
pin_blas_env()

import argparse
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from experiments.common import publish, setup
from kernels.abi import (
    BUF_ACTIVATION,
    BUF_CODE,
    BUF_LANDING,
    BUF_PARAMETER,
    BUF_SUPPORT,
    BUF_XTABLE,
    IO_DIMS,
    MATMUL,
    N_ARGS,
    PATCH_TABLE,
    STEP_COMPUTE,
    STEP_EXCHANGE,
    STEP_REPEAT_BEGIN,
    STEP_REPEAT_END,
    TABLE_ENTRY_BYTES,
)
from kernels.dtypes import fp8_decode, fp8_encode
from simulator import load_device, run, verify
from simulator.device import Device
from simulator.engines.numba import execute
from simulator.package import IoTensor, Package
from simulator.run import build_image
from simulator.verify import required_bytes
from tilecommon.tables import table

T = TypeVar("T")

SEED = 0
DEVICE = "c600"
SHAPE = (128, 256, 128)  # M rows per vertex, K reduction, N columns (fp8 x fp8 -> fp16)
SMALL_SHAPE = (16, 32, 16)  # for the `tiny` device in tests
WINDOW = 2  # weight blocks resident per tile
MIN_INVOCATIONS = 1_000_000  # timing-only run: trips chosen to reach this
TRIPS_NUMERICS = 4  # each weight block is used twice
REPEATS = 3  # best-of for every timed region (the machine is shared)
PLANNER_MODEL = "siglip-so400m"
OUT_DIR = Path("artifacts")
COMMAND = ".venv/bin/python experiments/bench_simulator.py"


def trips_for(dev: Device, minimum: int) -> int:
    """Smallest trip count giving at least `minimum` vertex invocations."""
    return max(1, -(-minimum // (2 * dev.tiles)))


def build_package(dev: Device, trips: int, patched: bool = True,
                  shape: tuple[int, int, int] = SHAPE) -> Package:
    """The synthetic whole-chip package of the module docstring.  `patched=False`
    drops the weight-address patches (every iteration uses window slot 0)."""
    tiles, base, i64 = dev.tiles, dev.memory_base, np.int64
    M, K, N = shape
    a_bytes, w_bytes, c_bytes = 2 * M * K, K * N, 2 * M * N * 2
    a_at = base
    w_at = a_at + a_bytes
    c_at = w_at + WINDOW * w_bytes
    land_at = c_at + c_bytes
    top = land_at + c_bytes
    t = np.arange(tiles, dtype=i64)
    # steps: BEGIN, COMPUTE, EXCHANGE, END
    arrays: dict[str, np.ndarray] = {
        "step_kind": np.array([STEP_REPEAT_BEGIN, STEP_COMPUTE, STEP_EXCHANGE, STEP_REPEAT_END],
                              dtype=i64),
        "step_vtx": np.array([0, 0, 2 * tiles, 2 * tiles, 2 * tiles], dtype=i64),
        "step_xfer": np.array([0, 0, 0, tiles, tiles], dtype=i64),
        "step_trips": np.array([trips, 0, 0, 0], dtype=i64),
        "step_match": np.array([3, -1, -1, 0], dtype=i64),
    }
    v_tile = np.repeat(t, 2)
    half = np.tile(np.arange(2, dtype=i64), tiles)
    args = np.zeros((2 * tiles, N_ARGS), dtype=i64)
    args[:, 0] = a_at + half * M * K
    args[:, 1] = K
    args[:, 2] = w_at
    args[:, 3] = N
    args[:, 4] = c_at + half * M * N * 2
    args[:, 5] = N * 2
    args[:, 6], args[:, 7], args[:, 8] = M, K, N
    args[:, 9], args[:, 10] = 0, 1  # fp8 in, fp16 out
    arrays.update(v_tile=v_tile, v_kernel=np.full(2 * tiles, MATMUL, dtype=i64), v_args=args)
    arrays.update(x_src_tile=t, x_src_addr=np.full(tiles, c_at, dtype=i64),
                  x_dst_tile=(t + 1) % tiles, x_dst_addr=np.full(tiles, land_at, dtype=i64),
                  x_bytes=np.full(tiles, c_bytes, dtype=i64))
    # table patches: vertex v's weight address = W + (i % WINDOW) * w_bytes
    n_p = 2 * tiles if patched else 0
    table = w_at + (np.arange(trips, dtype=i64) % WINDOW) * w_bytes
    code, xtab = required_bytes(dev, arrays)
    code_n = int(-(-code.max() // dev.alignment) * dev.alignment)
    xt_n = int(-(-xtab.max() // dev.alignment) * dev.alignment)
    tab_bytes = 2 * trips * TABLE_ENTRY_BYTES if patched else 0
    sup_n = dev.costs.support_bytes + int(-(-tab_bytes // dev.alignment) * dev.alignment)
    sup_at = dev.memory_end - sup_n
    code_at = sup_at - code_n
    xt_at = code_at - xt_n
    assert top <= xt_at, "synthetic package does not fit the device"
    arrays.update(
        p_target=np.zeros(n_p, dtype=i64), p_index=np.arange(n_p, dtype=i64),
        p_arg=np.full(n_p, 2, dtype=i64), p_loop=np.zeros(n_p, dtype=i64),
        p_mode=np.full(n_p, PATCH_TABLE, dtype=i64), p_base=np.zeros(n_p, dtype=i64),
        p_stride=np.zeros(n_p, dtype=i64),
        p_table=np.arange(n_p + 1, dtype=i64) * trips, table_values=np.tile(table, n_p),
        p_table_tile=v_tile[:n_p].copy(),
        p_table_addr=(sup_at + dev.costs.support_bytes + half * trips * TABLE_ENTRY_BYTES)[:n_p],
    )
    # buffers per tile: A, W, C, landing, code, xtable, support
    kinds = [BUF_ACTIVATION, BUF_PARAMETER, BUF_ACTIVATION, BUF_LANDING, BUF_CODE, BUF_XTABLE,
             BUF_SUPPORT]
    addrs = [a_at, w_at, c_at, land_at, code_at, xt_at, sup_at]
    sizes = [a_bytes, WINDOW * w_bytes, c_bytes, c_bytes, code_n, xt_n, sup_n]
    names = ["A", "W", "C", "land", "code", "xtable", "support"]
    nb = len(kinds)
    arrays.update(
        buf_tile=np.repeat(t, nb), buf_addr=np.tile(np.array(addrs, dtype=i64), tiles),
        buf_bytes=np.tile(np.array(sizes, dtype=i64), tiles),
        buf_kind=np.tile(np.array(kinds, dtype=i64), tiles),
        buf_first=np.zeros(nb * tiles, dtype=i64), buf_last=np.full(nb * tiles, 3, dtype=i64),
    )
    buffer_names = tuple(f"{n}@{tile}" for tile in range(tiles) for n in names)
    # io: A input [tiles*2M, K], W parameter [tiles, WINDOW*K, N], C output [tiles*2M, N]
    io = (IoTensor("A", "input", (tiles * 2 * M, K), "fp8"),
          IoTensor("W", "parameter", (tiles, WINDOW * K, N), "fp8"),
          IoTensor("C", "output", (tiles * 2 * M, N), "fp16"))
    lo = np.zeros((3 * tiles, IO_DIMS), dtype=i64)
    hi = np.zeros((3 * tiles, IO_DIMS), dtype=i64)
    lo[:tiles, 1] = t * 2 * M
    hi[:tiles] = np.stack([np.ones(tiles, i64), (t + 1) * 2 * M, np.full(tiles, K)], axis=1)
    lo[tiles:2 * tiles, 0] = t
    hi[tiles:2 * tiles] = np.stack([t + 1, np.full(tiles, WINDOW * K), np.full(tiles, N)], axis=1)
    lo[2 * tiles:, 1] = t * 2 * M
    hi[2 * tiles:] = np.stack([np.ones(tiles, i64), (t + 1) * 2 * M, np.full(tiles, N)], axis=1)
    arrays.update(
        io_tensor=np.repeat(np.arange(3, dtype=i64), tiles), io_tile=np.tile(t, 3),
        io_addr=np.repeat(np.array([a_at, w_at, c_at], dtype=i64), tiles), io_lo=lo, io_hi=hi,
        io_ld0=np.zeros(3 * tiles, dtype=i64),
        io_ld1=np.repeat(np.array([K, N, 2 * N], dtype=i64), tiles),
    )
    arrays.update(
        fp_code=np.full(tiles, code_n, dtype=i64), fp_xtable=np.full(tiles, xt_n, dtype=i64),
        fp_support=np.full(tiles, sup_n, dtype=i64),
        fp_tensor_lo=np.full(tiles, a_at, dtype=i64), fp_tensor_hi=np.full(tiles, top, dtype=i64),
        fp_tensor=np.full(tiles, top - a_at, dtype=i64),
    )
    return Package(name=f"bench-{dev.name}-{trips}", device=dev, io=io,
                   buffer_names=buffer_names, arrays=arrays, meta={"experiment": "bench"})


def random_operands(dev: Device, rng: np.random.Generator,
                    shape: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """A [tiles*2M, K] and W [tiles, WINDOW*K, N] as fp8-representable float32."""
    M, K, N = shape
    a = fp8_decode(fp8_encode(rng.standard_normal((dev.tiles * 2 * M, K)).astype(np.float32)))
    w = fp8_decode(fp8_encode(
        (rng.standard_normal((dev.tiles, WINDOW * K, N)) * 0.1).astype(np.float32)))
    return a, w


def best_of(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """(best wall seconds over `repeats` calls, last result)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def numpy_twin(a: np.ndarray, w: np.ndarray, trips: int,
               shape: tuple[int, int, int]) -> np.ndarray:
    """The same matmuls in numpy float32 (one batched matmul over all tiles per
    iteration); returns the last C, fp16-rounded."""
    tiles = w.shape[0]
    M, K, N = shape
    a3 = np.ascontiguousarray(a.reshape(tiles, 2 * M, K))
    w4 = np.ascontiguousarray(w.reshape(tiles, WINDOW, K, N).transpose(1, 0, 2, 3))
    c = np.empty((tiles, 2 * M, N), np.float32)
    for i in range(trips):
        np.matmul(a3, w4[i % WINDOW], out=c)
    return c.reshape(tiles * 2 * M, N).astype(np.float16).astype(np.float32)


def measure(device: str, min_invocations: int, trips_numerics: int,
            shape: tuple[int, int, int] = SHAPE, repeats: int = REPEATS) -> dict[str, float]:
    dev = load_device(device)
    rng = np.random.default_rng(SEED)
    warm = build_package(dev, 2, shape=shape)
    verify(warm)
    run(warm, numerics=False)  # compile / load the cache outside the timed regions
    trips = trips_for(dev, min_invocations)
    pkg = build_package(dev, trips, shape=shape)
    t_verify, _ = best_of(lambda: verify(pkg), 1)
    t_timing, timing = best_of(lambda: run(pkg, numerics=False), repeats)
    assert timing.ok and timing.vertex_invocations == 2 * dev.tiles * trips
    t_checked, _ = best_of(lambda: execute(pkg), repeats)
    t_unchecked, _ = best_of(lambda: execute(pkg, checks=False), repeats)
    fixed = build_package(dev, trips, patched=False, shape=shape)
    t_fixed, timing_fixed = best_of(lambda: run(fixed, numerics=False), repeats)
    small = build_package(dev, trips_numerics, shape=shape)
    a, w = random_operands(dev, rng, shape)
    # warm the numerics path (compilation) outside the timed region
    run(build_package(dev, 1, shape=shape), params={"W": w}, inputs={"A": a})
    t_num, res = best_of(lambda: run(small, params={"W": w}, inputs={"A": a}), repeats)
    image = build_image(small, {"W": w}, {"A": a})
    t_engine, _ = best_of(lambda: execute(small, image), 1)  # the image is reused: once
    t_np, c_np = best_of(lambda: numpy_twin(a, w, trips_numerics, shape), repeats)
    assert res.ok, res.faults[:3]
    err = float(np.abs(res.outputs["C"] - c_np).max())
    scale = float(np.abs(c_np).max())
    return {
        "tiles": dev.tiles, "trips": trips, "invocations": timing.vertex_invocations,
        "cycles": timing.cycles, "verify_s": t_verify, "timing_s": t_timing,
        "inv_per_s": timing.vertex_invocations / t_timing,
        "cycles_per_s": timing.cycles / t_timing,
        "inv_per_s_fixed": timing_fixed.vertex_invocations / t_fixed,
        "checked_s": t_checked, "unchecked_s": t_unchecked,
        "num_trips": trips_numerics, "num_invocations": res.vertex_invocations,
        "numerics_s": t_num, "engine_s": t_engine, "numpy_s": t_np, "ratio": t_num / t_np,
        "engine_ratio": t_engine / t_np,
        "max_abs_err_rel": err / scale,
    }


def format_table(r: dict[str, float], shape: tuple[int, int, int]) -> str:
    rows = [
        ("device tiles", f"{int(r['tiles'])}"),
        ("timing-only: Repeat trips", f"{int(r['trips'])}"),
        ("timing-only: vertex invocations", f"{int(r['invocations']):,}"),
        ("timing-only: simulated cycles", f"{int(r['cycles']):,}"),
        ("verify (every iteration) seconds", f"{r['verify_s']:.2f}"),
        ("timing-only seconds", f"{r['timing_s']:.3f}"),
        ("timing-only invocations/s, all patched", f"{r['inv_per_s']:.3g}  (target >= 1e7)"),
        ("timing-only simulated cycles/s", f"{r['cycles_per_s']:.3g}"),
        ("timing-only invocations/s, no patches", f"{r['inv_per_s_fixed']:.3g}"),
        ("timing-only engine seconds, checks on / off",
         f"{r['checked_s']:.3f} / {r['unchecked_s']:.3f}  (checks cost "
         f"{r['checked_s'] / max(r['unchecked_s'], 1e-9):.2f}x)"),
        ("numerics: Repeat trips", f"{int(r['num_trips'])}"),
        ("numerics: vertex invocations", f"{int(r['num_invocations']):,}"),
        ("numerics: simulator seconds (run)", f"{r['numerics_s']:.3f}"),
        ("numerics: numpy float32 seconds", f"{r['numpy_s']:.3f}"),
        ("numerics: engine only seconds", f"{r['engine_s']:.3f}"),
        ("numerics: simulator (run) / numpy", f"{r['ratio']:.2f}x  (target <= 3x)"),
        ("numerics: engine only / numpy", f"{r['engine_ratio']:.2f}x"),
        ("numerics: max |sim - numpy| / max|C|", f"{r['max_abs_err_rel']:.2e}"),
    ]
    M, K, N = shape
    return (table(("measure", "value"), rows, left=(0, 1)).split("\n", 1)[1] + "\n"
            + f"MATMUL {M}x{K}x{N} fp8->fp16, 2 per tile per iteration + ring exchange; "
            f"reproduce: {COMMAND}")


def measure_planner(layers: int, repeats: int, model: str = PLANNER_MODEL,
                    device: str = DEVICE) -> tuple[list[object], dict[str, float]]:
    """One row of the planner-package table (module docstring) and the last
    run's profile."""
    from planner import PipelineConfig, init_inputs, init_params, load_model, plan, reference

    g = load_model(model, layers=layers)
    res = plan(g, load_device(device), PipelineConfig(optimization_steps=0))
    params, inputs = init_params(g, seed=0), init_inputs(g, seed=1)
    ref = reference(g, params, inputs)
    sim = run(res.package, params=params, inputs=inputs)
    t_ref, t_sim = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ref = reference(g, params, inputs)
        t_ref.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sim = run(res.package, params=params, inputs=inputs)
        t_sim.append(time.perf_counter() - t0)
    y, r = sim.outputs["out"].astype(np.float64), ref["out"].astype(np.float64)
    rel = float(np.linalg.norm(y - r) / max(np.linalg.norm(r), 1e-30))
    m_ref, m_sim = statistics.median(t_ref), statistics.median(t_sim)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return ([layers, res.package.n_transfers, sim.vertex_invocations, m_ref, m_sim,
             m_sim / m_ref, rel, sim.n_faults, rss_gb], sim.profile)


def planner_cells(row: list[object]) -> list[object]:
    """A `measure_planner` row as the table prints it."""
    layers, transfers, inv, m_ref, m_sim, ratio, rel, faults, rss = row
    return [layers, transfers, inv, f"{m_ref:.2f}", f"{m_sim:.2f}", f"{ratio:.2f}x",
            f"{rel:.2e}", faults, f"{rss:.2f}"]


def profile_table(profile: dict[str, float]) -> str:
    """The phases of one run, largest first, with their share of the run."""
    total = sum(profile.values())
    rows = [(name, f"{sec:.3f}", f"{100 * sec / max(total, 1e-12):.1f}%")
            for name, sec in sorted(profile.items(), key=lambda kv: -kv[1])]
    rows.append(("total", f"{total:.3f}", "100.0%"))
    return table(("phase", "seconds", "share"), rows, left=(0,))


def planner_text(layer_counts: list[int], repeats: int, model: str = PLANNER_MODEL,
                 device: str = DEVICE) -> str:
    """The planner-package table and the first row's profile (module docstring)."""
    rows, profiles = [], []
    for n in layer_counts:
        row, prof = measure_planner(n, repeats, model, device)
        rows.append(planner_cells(row))
        profiles.append(prof)
    layers = ",".join(str(n) for n in layer_counts)
    return (table(("layers", "transfers", "vertex inv.", "reference s", "simulator s",
                   "sim / ref", "rel. Frobenius", "faults", "peak RSS GB"), rows)
            + f"\n{model} on {device}, default baseline; medians of {repeats} (same process, "
              "alternating, after a warm-up; target sim / ref <= 1.5x)\n\n"
            + f"profile of one {model} {layer_counts[0]}-layer run with numerics "
              "(engine phases on both cores where they run there):\n"
            + profile_table(profiles[0])
            + f"\nreproduce: {COMMAND} --layers {layers} --repeats {repeats}")


def main(argv: list[str] | None = None, device: str = DEVICE,
         min_invocations: int = MIN_INVOCATIONS, trips_numerics: int = TRIPS_NUMERICS,
         shape: tuple[int, int, int] = SHAPE, out_dir: Path = OUT_DIR,
         repeats: int = REPEATS, planner_model: str = PLANNER_MODEL) -> str:
    """Run the benchmark, print and write the tables; returns them."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="1",
                    help="planner-package layer counts, comma-separated (default 1; "
                         "0 skips the case)")
    ap.add_argument("--repeats", type=int, default=repeats)
    args = ap.parse_args(argv)
    setup()
    text = format_table(measure(device, min_invocations, trips_numerics, shape, args.repeats),
                        shape)
    counts = [int(n) for n in args.layers.split(",") if int(n) > 0]
    if counts:
        text += "\n\n" + planner_text(counts, args.repeats, planner_model, device)
    print(text)
    publish("bench_simulator", "Simulator throughput (synthetic whole-chip package) and "
            "numerics on planner packages", text, out_dir)
    return text


if __name__ == "__main__":
    main()
