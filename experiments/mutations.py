"""The mutation table: every kind of package corruption in
`simulator.mutate.MUTATIONS`, what `simulator.verify` says about it, and the
fault both engines report when the package runs unverified.

    python -m experiments.mutations

A mutation is applied to the first subject it fits: the planner's vit-micro
package on the tiny device, then two hand-built packages (a Repeat loop with
table patches, a K-split matmul).  Each run has numerics on (races and
unwritten outputs are seen only then) and seeded values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiments.common import ARTIFACTS, publish, setup
from simulator import load_device, run, verify
from simulator.hardware import seeded_values
from simulator.mutate import MUTATIONS, Mutation, NotApplicable
from simulator.package import Package
from simulator.run import Fault
from tilecommon.errors import PackageInvalid
from tilecommon.tables import table

SEED = 0


def subjects() -> tuple[Package, ...]:
    """The valid packages mutations are applied to, in order of preference."""
    from planner import PipelineConfig, load_model, plan
    from simulator.testing import ksplit_matmul, repeat_program

    dev = load_device("tiny")
    micro = plan(load_model("vit-micro"), dev, PipelineConfig(optimization_steps=0)).package
    return micro, repeat_program(dev, 5), ksplit_matmul(dev)[0]


def apply_first(m: Mutation, packages: tuple[Package, ...]) -> tuple[Package, Package]:
    """(subject, mutated copy) for the first subject `m` applies to."""
    reasons = []
    for pkg in packages:
        try:
            return pkg, m.apply(pkg)
        except NotApplicable as e:
            reasons.append(f"{pkg.name}: {e}")
    raise NotApplicable(f"{m.name} fits no subject ({'; '.join(reasons)})")


@dataclass(frozen=True)
class Outcome:
    verify: str  # verify's message ("" when it accepted the package)
    faults: dict[str, tuple[Fault, ...]]  # engine -> faults of the unverified run


def outcome(subject: Package, bad: Package, engines: tuple[str, ...] = ("numba", "simpy"),
            numerics: bool = True) -> Outcome:
    try:
        verify(bad)
        said = ""
    except PackageInvalid as e:
        said = str(e)
    params, inputs = seeded_values(subject, SEED) if numerics else ({}, {})
    faults = {name: run(bad, params=params, inputs=inputs, numerics=numerics,
                        engine=name).faults for name in engines}
    return Outcome(said, faults)


def first_key(f: Fault) -> tuple[int, ...]:
    """What two engines must agree on about a fault."""
    return f.code, f.step, f.tile, f.address, f.loop, f.iteration, f.item


def main(out_dir: Path = ARTIFACTS) -> str:
    setup()
    packages = subjects()
    rows = []
    for m in MUTATIONS:
        subject, bad = apply_first(m, packages)
        o = outcome(subject, bad)
        numba, simpy = o.faults["numba"], o.faults["simpy"]
        agree = bool(numba) and bool(simpy) and first_key(numba[0]) == first_key(simpy[0])
        said = o.verify.split(": ", 1)[-1] if o.verify else "ACCEPTED"
        rows.append((m.name, subject.name, said[:58], numba[0].kind if numba else "none",
                     "yes" if agree else "NO"))
        print(f"{m.name}: done", flush=True)
    text = (table(("mutation", "subject", "verify rejects it with", "engine fault",
                   "numba = simpy"), rows, left=(0, 1, 2, 3))
            + f"\n{len(rows)} kinds; engine fault = the first fault of simulator.run with "
              "numerics on and verification skipped; numba = simpy: both engines report that "
              "fault at the same step, tile, address, item and Repeat iteration\n")
    print(text)
    publish("mutations", "Package mutations: verify and the engines", text, out_dir)
    return text


if __name__ == "__main__":
    main()
