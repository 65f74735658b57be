"""The studies that are sweeps: experiments/sweeps/*.toml, each run by
`tileplan sweep` and published as a block of docs/results.md.

    python experiments/run_sweeps.py [NAME ...] [--workers N]

NAME is a file stem under experiments/sweeps/ (default: all of them):
scaling-layers, scaling-batch and scaling-devices (how the baseline scales
with layers, batch and tiles) and baseline-policies (the two built-in
policies side by side).  Each writes artifacts/sweeps/<name>/ (results.jsonl,
results.csv, its plot) and artifacts/<name>.txt (the table); a directory
holding an earlier run of the same sweep is finished with --resume, so
re-running after an interruption skips the cases already done.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.common import ARTIFACTS, ROOT, publish, setup
from planner.sweep import load_sweep, run_sweep, table_rows
from tilecommon.tables import table

SWEEPS = ROOT / "experiments" / "sweeps"


def run_one(path: Path, workers: int, out_root: Path = ARTIFACTS) -> str:
    sweep = load_sweep(path)
    out = out_root / "sweeps" / sweep.name
    res = run_sweep(sweep, out, workers=workers, resume=True)
    header, cells = table_rows(sweep, res.rows)
    text = table(header, cells, left=tuple(range(len(header) - len(sweep.metrics))))
    errors = [r for r in res.rows if r["status"] != "ok"]
    notes = "".join(f"\n{r['status']} ({', '.join(str(r.get(a)) for a in sweep.varying())}): "
                    f"{r.get('error')}" for r in errors)
    text += (f"\n{len(res.rows)} cases, {workers} worker(s), {res.seconds:.0f} s for the "
             f"{res.ran} run now; plot and CSV in {out}{notes}\n")
    print(text)
    rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    publish(sweep.name, f"Sweep {sweep.name}", text, out_root,
            command=f"tileplan sweep {rel} --workers {workers}")
    return text


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="sweep file stems (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    setup()
    names = args.names or sorted(p.stem for p in SWEEPS.glob("*.toml"))
    return [run_one(SWEEPS / f"{n}.toml", args.workers) for n in names]


if __name__ == "__main__":
    main()
