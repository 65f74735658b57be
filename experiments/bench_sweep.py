"""Benchmark: one sweep's wall time on 1 and 2 workers, local processes and a
Dask LocalCluster, in the same process (the ratio is the figure to quote).

    python experiments/bench_sweep.py

The sweep: vit-tiny on c600, layers 1-2 x batch 1-2 x 0 or 2 optimizer
steps, timing only (8 cases).  Each executor starts its workers
inside the timed region (process start-up and the Numba cache load are part
of a sweep's cost).  Rows must agree across executors (package hashes).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from experiments.common import publish, setup
from planner.sweep import parse_sweep, run_sweep
from tilecommon.tables import table

SWEEP = {"sweep": {"name": "bench", "model": ["vit-tiny"], "device": ["c600"],
                   "layers": [1, 2], "batch": [1, 2], "optimization_steps": [0, 2],
                   "numerics": [False]}}
RUNS = (("local", 1), ("local", 2), ("dask", 2))


def main(out_dir: Path = Path("artifacts")) -> str:
    setup()
    sweep = parse_sweep(SWEEP, "bench_sweep", Path.cwd())
    rows, hashes = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        warm = parse_sweep({"sweep": {**SWEEP["sweep"], "layers": [1], "batch": [1],
                                      "optimization_steps": [0]}}, "warm", Path.cwd())
        run_sweep(warm, Path(tmp) / "warm", workers=1, progress=False)  # Numba cache warm
        for executor, workers in RUNS:
            t0 = time.perf_counter()
            res = run_sweep(sweep, Path(tmp) / f"{executor}{workers}", executor=executor,
                            workers=workers, progress=False)
            seconds = time.perf_counter() - t0
            assert all(r["status"] == "ok" for r in res.rows), res.rows
            hashes.add(tuple(sorted(r["package_hash"] for r in res.rows)))
            rows.append([executor, workers, len(res.rows), f"{seconds:.1f}"])
    assert len(hashes) == 1, "executors disagree on the packages"
    base = float(rows[0][3])
    for r in rows:
        r.append(f"{base / float(r[3]):.2f}x")
    text = (table(("executor", "workers", "cases", "wall s", "speed-up vs local x1"), rows,
                  left=(0,))
            + f"\n{len(sweep.cases)} cases (vit-tiny on c600, layers 1-2 x batch 1-2 x 0/2 "
              "optimizer steps, timing only); same packages on every executor; reproduce: "
              "python experiments/bench_sweep.py\n")
    print(text)
    publish("bench_sweep", "Sweep wall time by executor and workers", text, out_dir)
    return text


if __name__ == "__main__":
    main()
