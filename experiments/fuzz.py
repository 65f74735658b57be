"""Fuzzing the whole path: random small models of every family on random devices.

    python -m experiments.fuzz --cases 10000 --seed 1 --workers 2
    python -m experiments.fuzz --seed 1 --case 417      # one case, with its TOMLs

Case i of seed S draws from `numpy.random.default_rng([S, i])`, so any case
can be re-run alone.  A case is a model table (hidden = heads x head_dim up to
64, MLP, tokens up to 17, 1-3 layers, batch 1-3, eps) of one of the families
of planner.ir.models — half ViTs (patch and channels drawn; a tanh, erf or
quick GELU; a MAP head in one of five), a quarter BERT-style encoders
(post-LN, positions from a longer table, token types, the key-padding mask
in most, the pooler in half), a quarter Llama-style decoders (RMSNorm,
SwiGLU, RoPE, causal attention with a drawn number of kv heads, the LM head
over the last positions, tied or not) — and a
device table on a shipped preset (tiles 4-256, memory 32-624 KiB, alignment
1-64, workers 1-8, and a few cost constants drawn within their ranges; one
case in twenty carries a deliberately invalid field), planned from the
`default` baseline policy (half the cases), `element` or `capacity`, with 0-2
optimizer steps.  Every case must end as one of

- ok: the package verifies, simulates with zero faults and its outputs match
  `planner.reference` within tolerance (simulator.run with numerics);
- build-failure: a typed BuildFailure (the baseline does not fit);
- config-error: a typed ConfigError (the drawn table is invalid).

Anything else — another exception, a fault, outputs outside tolerance — is a
bug: the run prints the case (seed, index, both TOMLs) and exits 1.
tests/test_fuzz.py runs 200 cases of seed 1 under `make test`; `make fuzz`
runs 2,000; README quotes a 10,000-case run.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.common import setup
from tilecommon.errors import BuildFailure, ConfigError

OUTCOMES = ("ok", "build-failure", "config-error")
BAD_FIELDS = (("alignment", 6), ("tiles", 0), ("memory_size", 100), ("workers", 0),
              ("heads", 3), ("tokens", 0))


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    model: dict[str, Any]
    device: dict[str, Any]
    optimization_steps: int
    baseline: str = "default"

    def describe(self) -> str:
        def toml(d: dict[str, Any]) -> str:
            flat = [f"{k} = {v!r}" for k, v in d.items() if not isinstance(v, dict)]
            tables = [f"\n[{k}]\n" + "\n".join(f"{kk} = {vv!r}" for kk, vv in v.items())
                      for k, v in d.items() if isinstance(v, dict)]
            return "\n".join(flat) + "".join(tables)
        return (f"fuzz case {self.index} of seed {self.seed} (optimization_steps "
                f"{self.optimization_steps}, baseline {self.baseline})\n"
                f"# model\n{toml(self.model)}\n# device\n{toml(self.device)}")


def draw(seed: int, index: int) -> Case:
    """Case `index` of the run with `seed`."""
    rng = np.random.default_rng([seed, index])

    def pick(*values: Any) -> Any:
        return values[int(rng.integers(len(values)))]

    heads = int(rng.integers(1, 5))
    family = pick("vit", "vit", "bert", "llama")
    model: dict[str, Any] = {
        "name": f"fuzz{index}", "hidden": heads * pick(2, 4, 8, 16), "heads": heads,
        "mlp": int(rng.integers(1, 129)), "patch": int(rng.integers(1, 5)),
        "channels": int(rng.integers(1, 4)), "tokens": int(rng.integers(1, 18)),
        "layers": int(rng.integers(1, 4)), "batch": int(rng.integers(1, 4)),
        "eps": float(pick(1e-6, 1e-5, 1e-3)),
    }
    model.update(_family(family, model, rng, pick))
    alignment = pick(1, 2, 4, 8, 16, 32, 64)
    memory = int(rng.integers(32, 625)) * 1024 // alignment * alignment
    base = "c600" if memory >= 256 * 1024 and rng.random() < 0.5 else "tiny"
    costs: dict[str, int] = {}
    for name, lo, hi in (("sync_cycles", 0, 2000), ("exchange_setup_cycles", 0, 500),
                         ("exchange_in_bytes_per_cycle", 1, 16),
                         ("exchange_out_bytes_per_cycle", 1, 16), ("send_cycles", 0, 16),
                         ("loop_overhead_cycles", 0, 200), ("mm_panel", 0, 200),
                         ("mm_row", 0, 16), ("ln_row", 0, 400), ("softmax_row", 0, 200),
                         ("vertex_code_bytes", 0, 1024)):
        if rng.random() < 0.3:
            costs[name] = int(rng.integers(lo, hi + 1))
    device: dict[str, Any] = {
        "name": f"fuzz{index}", "base": base, "tiles": int(rng.integers(4, 257)),
        "memory_size": memory, "alignment": alignment, "workers": int(rng.integers(1, 9)),
    }
    if costs:
        device["costs"] = costs
    if rng.random() < 0.05:
        field, value = BAD_FIELDS[int(rng.integers(len(BAD_FIELDS)))]
        (model if field in model else device)[field] = value
    steps = int(pick(0, 0, 0, 1, 2))
    return Case(seed, index, model, device, steps, pick("default", "default", "element",
                                                        "capacity"))


def _family(family: str, model: dict[str, Any], rng: np.random.Generator,
            pick: Any) -> dict[str, Any]:
    """The fields that make `model` a ViT (any MLP activation, sometimes a
    MAP head), a BERT-style encoder or a Llama-style decoder
    (planner.ir.models)."""
    if family == "vit":
        extra: dict[str, Any] = {"activation": pick("gelu_tanh", "gelu_erf", "quick_gelu")}
        if rng.random() < 0.2:
            extra["pool"] = "map"
        return extra
    del model["patch"], model["channels"]
    if family == "bert":
        return {"input": "embeddings", "block": "post_ln", "activation": "gelu_erf",
                "max_positions": model["tokens"] + int(rng.integers(0, 8)),
                "type_vocab": int(rng.integers(1, 3)), "embed_norm": True,
                "final_norm": False, "attention_mask": bool(rng.random() < 0.7),
                "pool": pick("none", "pooler"), "vocab": int(rng.integers(8, 64))}
    heads = model["heads"]
    return {"input": "embeddings", "norm": "rmsnorm", "activation": "swiglu",
            "attention": "causal", "rope_theta": float(pick(100.0, 10000.0)),
            "kv_heads": pick(*[k for k in range(1, heads + 1) if heads % k == 0]),
            "bias": pick("qkv", "none", "all"), "pool": "last",
            "vocab": int(rng.integers(8, 64)), "tied_embeddings": bool(rng.random() < 0.5)}


def run_case(case: Case) -> tuple[str, str]:
    """(outcome, detail): an OUTCOMES entry, or "bug" with what went wrong."""
    from planner import PipelineConfig
    from planner.ir.models import build_model, parse_config
    from planner.pipeline import run_model
    from simulator.device import Device

    try:
        cfg = parse_config(dict(case.model), f"fuzz model {case.index}")
        dev = Device.from_dict(dict(case.device), f"fuzz device {case.index}")
        out = run_model(build_model(cfg), dev, PipelineConfig(
            optimization_steps=case.optimization_steps, baseline=case.baseline),
            numerics=True, seed=case.index)
    except BuildFailure as e:
        return "build-failure", str(e)
    except ConfigError as e:
        return "config-error", str(e)
    except Exception:  # noqa: BLE001 - every other exception is what the fuzzer looks for
        return "bug", traceback.format_exc()
    s = out.summary
    if s["faults"] or not s["numerics_ok"]:
        return "bug", (f"faults {s['faults']}, rel. error {s.get('rel_frobenius')}, "
                       f"non-finite {s.get('nonfinite')}")
    return "ok", f"{s['cycles']} cycles"


def _worker(args: tuple[int, int]) -> tuple[int, str, str]:
    seed, index = args
    outcome, detail = run_case(draw(seed, index))
    return index, outcome, detail


def _init() -> None:
    setup()


def fuzz(cases: int, seed: int, workers: int = 1, progress: bool = True
         ) -> tuple[Counter[str], list[tuple[int, str]]]:
    """Run cases 0..cases-1 of `seed`; (outcome counts, [(index, bug detail)])."""
    counts: Counter[str] = Counter()
    bugs: list[tuple[int, str]] = []
    jobs = [(seed, i) for i in range(cases)]
    if workers > 1:
        pool = ProcessPoolExecutor(workers, initializer=_init)
        results = pool.map(_worker, jobs, chunksize=8)
    else:
        setup()
        pool, results = None, map(_worker, jobs)
    try:
        from tqdm import tqdm

        for index, outcome, detail in tqdm(results, total=cases, disable=not progress,
                                           desc="fuzz", unit="case"):
            counts[outcome] += 1
            if outcome == "bug":
                bugs.append((index, detail))
    finally:
        if pool is not None:
            pool.shutdown()
    return counts, bugs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.fuzz", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--case", type=int, default=None, help="run only this case and print it")
    args = ap.parse_args(argv)
    if args.case is not None:
        setup()
        case = draw(args.seed, args.case)
        print(case.describe())
        outcome, detail = run_case(case)
        print(f"outcome: {outcome}: {detail}")
        return 1 if outcome == "bug" else 0
    t0 = time.perf_counter()
    counts, bugs = fuzz(args.cases, args.seed, args.workers)
    seconds = time.perf_counter() - t0
    print(f"{args.cases} cases of seed {args.seed} in {seconds:.0f} s "
          f"({args.workers} worker(s)): " + ", ".join(f"{o} {counts[o]}" for o in
                                                     OUTCOMES + ("bug",)))
    for index, detail in bugs[:10]:
        print(f"\nBUG in case {index}:\n{draw(args.seed, index).describe()}\n{detail}",
              file=sys.stderr)
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
