"""Benchmark: fp8 MATMUL kernel — numeric throughput and modelled fraction of peak.

Question: is the simulator's numeric matmul body fast enough (target: at least
half the speed of a plain numpy float32 `@` of the same shape for blocks of
64x64x64 and larger), and how close to the AMP peak does the cycle model put
large fp8 blocks?

For each block shape M x K x N the script places fp8 operands in a tile image,
times `kernels.dispatch.vertex_execute` (fp8 x fp8 -> fp16, the planner's
common case) and numpy float32 `a @ b` on the same decoded values in the same
run (best of REPEATS), and reports GMAC/s for both, their ratio, and the cycle
model's fraction of the fp8 peak (M*K*N / (amp_macs_fp8 * cycles)).  Both BLAS
libraries run one thread (OPENBLAS_NUM_THREADS=1 unless already set), as the
kernels' BLAS always does (tilecommon.runtime).

Reproduce:  .venv/bin/python experiments/bench_kernels.py
Writes artifacts/bench_kernels.txt (the table) and artifacts/bench_kernels.png.
"""

# ruff: noqa: E402  (numpy's BLAS threads are fixed when numpy loads)
from __future__ import annotations

from tilecommon.runtime import pin_blas_env

# numpy's BLAS (the comparison) runs one thread, like the kernels': on a shared
# machine OpenBLAS threads spinning make timings meaningless
pin_blas_env()

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from experiments.common import publish, setup
from kernels import abi, dispatch
from kernels.dtypes import DT_FP8, DT_FP16, fp8_decode
from kernels.registry import by_name
from kernels.testing import TileImage, random_codes
from simulator.device import load_device
from tilecommon.tables import table

SEED = 0
DEVICE = load_device("c600")
SHAPES: tuple[tuple[int, int, int], ...] = ((32, 32, 32), (64, 64, 64), (128, 256, 128))
REPEATS = 30
OUT_DIR = Path("artifacts")
COMMAND = ".venv/bin/python experiments/bench_kernels.py"


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up (compilation, caches)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(shape: tuple[int, int, int], repeats: int, rng: np.random.Generator
            ) -> dict[str, float]:
    """One row of the table for an M x K x N fp8 matmul block."""
    m, k, n = shape
    desc = DEVICE.tile_desc()
    elem = desc.element_bytes
    img = TileImage(desc.element_bytes * 36)
    a = random_codes(rng, (m, k), DT_FP8)
    b = random_codes(rng, (k, n), DT_FP8)
    a_addr = img.put(a, at=img.base)
    b_addr = img.put(b, at=img.base + 8 * elem)  # separate elements: no conflict
    c_addr = img.alloc(m * n * 2, at=img.base + 16 * elem)
    args = by_name("MATMUL").make_args(a=a_addr, lda=k, b=b_addr, ldb=n, c=c_addr, ldc=2 * n,
                                       M=m, K=k, N=n, in_dtype=DT_FP8, out_dtype=DT_FP16)
    mem, base = img.mem, img.base

    def kernel() -> object:
        return dispatch.vertex_execute(abi.MATMUL, mem, base, args)

    a32 = np.ascontiguousarray(fp8_decode(a))
    b32 = np.ascontiguousarray(fp8_decode(b))

    def reference() -> object:
        return a32 @ b32

    macs = m * k * n
    t_kernel = _best_seconds(kernel, repeats)
    t_numpy = _best_seconds(reference, repeats)
    cycles = int(dispatch.vertex_cycles(abi.MATMUL, args, desc.as_array()))
    return {
        "kernel_gmacs": macs / t_kernel / 1e9,
        "numpy_gmacs": macs / t_numpy / 1e9,
        "ratio": t_numpy / t_kernel,
        "cycles": float(cycles),
        "peak_fraction": macs / (DEVICE.amp_macs_fp8 * cycles),
    }


def format_table(rows: Sequence[tuple[tuple[int, int, int], dict[str, float]]]) -> str:
    body = [(f"{m}x{k}x{n}", f"{r['kernel_gmacs']:.2f}", f"{r['numpy_gmacs']:.2f}",
             f"{r['ratio']:.2f}", int(r["cycles"]), f"{r['peak_fraction']:.1%}")
            for (m, k, n), r in rows]
    return (table(("M x K x N", "kernel GMAC/s", "numpy GMAC/s", "ratio", "model cycles",
                   "of fp8 peak"), body, left=()) + "\n"
            + f"fp8 -> fp16 MATMUL vertex vs numpy float32 @ (best of runs, "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}); "
            f"reproduce: {COMMAND}")


def plot(rows: Sequence[tuple[tuple[int, int, int], dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{m}x{k}x{n}" for (m, k, n), _ in rows]
    x = np.arange(len(rows))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(9, 3.5))
    ax0.bar(x - 0.2, [r["kernel_gmacs"] for _, r in rows], 0.4, label="MATMUL kernel (fp8)")
    ax0.bar(x + 0.2, [r["numpy_gmacs"] for _, r in rows], 0.4, label="numpy float32 @")
    ax0.set_xticks(x, labels)
    ax0.set_ylabel("GMAC/s (host)")
    ax0.legend()
    ax1.bar(x, [100 * r["peak_fraction"] for _, r in rows], 0.5)
    ax1.set_xticks(x, labels)
    ax1.set_ylabel("modelled % of fp8 AMP peak")
    ax1.set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(shapes: Sequence[tuple[int, int, int]] = SHAPES, repeats: int = REPEATS,
         out_dir: Path = OUT_DIR) -> str:
    """Run the benchmark, print and write the table and plot; returns the table."""
    setup()
    rng = np.random.default_rng(SEED)
    rows = [(shape, measure(shape, repeats, rng)) for shape in shapes]
    text = format_table(rows)
    print(text)
    publish("bench_kernels", "fp8 MATMUL kernel throughput", text, out_dir)
    plot(rows, out_dir / "bench_kernels.png")
    return text


if __name__ == "__main__":
    main()
