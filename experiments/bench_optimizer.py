"""How much does the bounded local optimizer gain over the baseline, and at
what planning cost?

For each case (model, layers) on DEVICE this runs `planner.plan` with
STEPS optimization steps (baseline policy → build → timing simulation, then
at most STEPS ordered proposals, each built completely and simulated) and
reports baseline cycles, final cycles, the improvement (% fewer cycles than
the baseline), planning seconds (wall time of the whole `planner.plan` call,
baseline included), evaluated and accepted proposals, and the kinds that
were accepted.  With `--jobs N` later proposals are built speculatively in
N worker processes, or with `--executor thread` in N threads (same final
package as serial; the table also shows the speculative builds that were
discarded).  Threads share one interpreter: the expand/allocate/link stages
are Python and hold the GIL, so processes are expected to win on 2 cores.

One untimed warm-up (WARMUP: its baseline only) runs first, so no row pays
numba's one-time compilation; the optimizer's build caches are emptied after
it (the catalogue's per-op cache stays warm for ops of the same shapes).

Targets (issue 6): ≥ 15% fewer cycles than the baseline on siglip-so400m 1
layer; vit-tiny (2 layers) 8 steps planned in ≤ 3 s.  Planning is
deterministic, so no seed is involved.

`--scratch` expands every build from scratch instead of resuming from the
longest common lowered-step prefix of a recent expansion (the A/B baseline
of incremental expansion; both give identical packages); `--compare` runs
each case both ways in one process.

Usage: python experiments/bench_optimizer.py [--small] [--jobs N]
       [--executor process|thread] [--scratch | --compare] [--out PATH]
Writes the table to artifacts/bench_optimizer.txt (or PATH) and prints it.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

from kernels.exceptions import BuildFailure
from planner import cache, expand
from planner.lower import lower
from planner.models import load_model
from planner.optimize import plan
from planner.pipeline import PipelineConfig
from simulator.device import Device, load_device

DEVICE = "c600"
STEPS = 8
CASES = (("vit-tiny", 2), ("siglip-so400m", 1))
SMALL_CASES = (("vit-tiny", 1),)
SMALL_STEPS = 2
WARMUP = ("vit-tiny", 1)
OUT = Path("artifacts/bench_optimizer.txt")
HEADER = ("model", "layers", "steps", "baseline cycles", "final cycles", "improvement",
          "plan s", "evaluated", "accepted", "discarded", "accepted kinds")


def bench_case(model: str, layers: int, device: Device, steps: int, jobs: int,
               executor: Executor | None = None) -> tuple[str, ...]:
    """One table row (HEADER); `executor` None: serial or a process pool."""
    graph = load_model(model, layers=layers)
    t0 = time.perf_counter()
    try:
        res = plan(graph, device, PipelineConfig(optimization_steps=steps, jobs=jobs),
                   executor=executor)
    except BuildFailure as e:
        secs = time.perf_counter() - t0
        return (model, str(layers), str(steps), "-", "-", "-", f"{secs:.2f}", "-", "-", "-",
                "baseline failed: " + " ".join(str(e).split()))
    secs = time.perf_counter() - t0
    accepted = [r for r in res.history if r.accepted]
    kinds = ",".join(sorted({r.kind for r in accepted})) or "-"
    gain = 100.0 * (res.baseline_cycles - res.cycles) / res.baseline_cycles
    return (model, str(layers), str(steps), f"{res.baseline_cycles:,}", f"{res.cycles:,}",
            f"{gain:.1f}%", f"{secs:.2f}", str(len(res.history)), str(len(accepted)),
            str(res.stats.get("speculative_discarded", 0)), kinds)


def table(rows: list[tuple[str, ...]]) -> str:
    cells = [HEADER, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADER) - 1)]
    lines = []
    for r in cells:
        parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:],
                                                                      strict=True)]
        lines.append("  ".join(parts + [r[-1]]))
    return "\n".join(lines)


def fresh(scratch: bool) -> None:
    """Empty the optimizer's build caches, the recent lowerings and expansions;
    `scratch`: keep no expansions (every build expands from scratch)."""
    cache.SHARED = cache.BuildCache()
    lower.cache_clear()
    expand.RECENT = expand.PrefixStore(0 if scratch else expand.PrefixStore().max_entries)


def compare(cases: tuple[tuple[str, int], ...], device: Device, steps: int) -> str:
    """Serial rows of every case from scratch and then incremental, in this
    process (same code, same machine load period): the A/B of incremental
    expansion.  Both must reach the same final cycles."""
    rows = []
    for model, layers in cases:
        for scratch in (True, False):
            fresh(scratch)
            row = bench_case(model, layers, device, steps, 1)
            tag = "scratch" if scratch else "incremental"
            rows.append((row[0] + f" ({tag})", *row[1:]))
    return f"local optimizer on {DEVICE}, serial, expansion from scratch vs incremental\n" \
        + table(rows)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="run SMALL_CASES with SMALL_STEPS")
    ap.add_argument("--jobs", type=int, default=1, help="speculative build processes")
    ap.add_argument("--executor", choices=("process", "thread"), default="process",
                    help="speculative builds in processes (default) or threads")
    ap.add_argument("--scratch", action="store_true",
                    help="expand every build from scratch (no incremental expansion)")
    ap.add_argument("--compare", action="store_true",
                    help="each case from scratch, then incremental, in this one process")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    device = load_device(DEVICE)
    cases, steps = (SMALL_CASES, SMALL_STEPS) if args.small else (CASES, STEPS)
    bench_case(*WARMUP, device, 0, 1)  # numba compiles (or loads its cache), untimed
    if args.compare:
        text = compare(cases, device, steps)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(text)
        return text
    fresh(args.scratch)
    if args.executor == "thread" and args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = [bench_case(m, n, device, steps, args.jobs, pool) for m, n in cases]
    else:
        rows = [bench_case(m, n, device, steps, args.jobs) for m, n in cases]
    mode = f"{args.executor} pool" if args.jobs > 1 else "serial"
    reuse = "from scratch" if args.scratch else "incremental"
    store = expand.RECENT
    text = (f"local optimizer on {DEVICE}, jobs {args.jobs} ({mode}), expansion {reuse}: "
            f"{store.steps_reused} lowered steps reused, {store.steps_expanded} expanded\n"
            + table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    return text


if __name__ == "__main__":
    main()
