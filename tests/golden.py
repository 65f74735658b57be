"""The golden builds: package hashes and cycles of a few plans, kept in
tests/golden_cycles.json so that any change of a cycle or of a package is a
visible diff.  `make golden` rewrites the file on purpose (after a change
that is meant to move them); tests/test_golden.py compares against it.

Usage: python tests/golden.py [--write]   (without --write: print the diff)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FILE = Path(__file__).resolve().parent / "golden_cycles.json"
# (model, layers or None for the TOML's, device, optimization steps)
CASES = (("vit-micro", None, "tiny", 0), ("vit-micro", None, "tiny", 8),
         ("vit-micro", None, "c600", 0), ("vit-tiny", 2, "c600", 0), ("vit-tiny", 2, "c600", 8))


def key(model: str, layers: int | None, device: str, steps: int) -> str:
    return f"{model}/{layers or 'toml'}/{device}/{steps} steps"


def measure() -> dict[str, dict[str, object]]:
    """{case key: {"cycles", "baseline_cycles", "package_hash"}} of every case."""
    import planner
    import simulator

    planner.configure()
    out = {}
    for model, layers, device, steps in CASES:
        res = planner.plan(planner.load_model(model, layers=layers),
                           simulator.load_device(device),
                           planner.PipelineConfig(optimization_steps=steps))
        out[key(model, layers, device, steps)] = {
            "cycles": res.cycles, "baseline_cycles": res.baseline_cycles,
            "package_hash": res.package.content_hash()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite tests/golden_cycles.json")
    args = ap.parse_args(argv)
    now = measure()
    old = json.loads(FILE.read_text()) if FILE.exists() else {}
    for k in sorted(set(now) | set(old)):
        if now.get(k) != old.get(k):
            print(f"{k}: {old.get(k)} -> {now.get(k)}")
    if args.write:
        FILE.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
