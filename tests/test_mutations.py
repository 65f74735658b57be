"""The mutation suite: every kind in simulator.mutate.MUTATIONS is rejected by
verify AND reported as a fault by both engines when the package runs with
verification skipped, the two engines agreeing on every fault; the CLI
does the same with `tileplan simulate` (verify first) and `--no-verify`."""

from __future__ import annotations

import re

import pytest

from experiments.mutations import apply_first, first_key, outcome, subjects
from simulator import save_package
from simulator.engines.base import (
    F_ARGS,
    F_DST_BUFFER,
    F_MISALIGNED,
    F_NO_BUFFER,
    F_OUTPUT,
    F_PATCH,
    F_RACE,
    F_SCHEDULE,
    F_SRC_BUFFER,
)
from simulator.mutate import MUTATIONS, mutation
from simulator.package import Package
from tilecommon.errors import PackageInvalid

# the fault each kind must raise first (numerics on)
EXPECTED = {
    "vertex-dead-output": F_NO_BUFFER, "vertex-dead-input": F_NO_BUFFER,
    "vertex-overrun": F_NO_BUFFER, "vertex-misaligned": F_MISALIGNED,
    "vertex-into-support": F_NO_BUFFER, "vertex-from-code": F_NO_BUFFER,
    "cast-dtype-7": F_ARGS, "cast-rows-negative": F_ARGS, "matmul-accumulate-fp16": F_ARGS,
    "matmul-dtype-7": F_ARGS, "matmul-k-zero": F_ARGS,
    "buffer-past-end": F_NO_BUFFER, "buffer-shrunk": F_NO_BUFFER,
    "buffers-overlap": F_NO_BUFFER,
    "transfer-dead-source": F_SRC_BUFFER, "transfer-dead-destination": F_DST_BUFFER,
    "transfer-overrun-4k": F_SRC_BUFFER, "transfer-overrun-source": F_SRC_BUFFER,
    "transfer-misaligned": F_MISALIGNED, "transfer-into-support": F_DST_BUFFER,
    "transfer-from-code": F_SRC_BUFFER, "transfer-race": F_RACE,
    "patch-stride": F_NO_BUFFER, "patch-table-entry": F_NO_BUFFER, "output-moved": F_OUTPUT,
    "patch-twice": F_PATCH, "output-uncovered": F_OUTPUT,
    "schedule-piece-dropped": F_SCHEDULE, "schedule-start-moved": F_SCHEDULE,
    "schedule-port-double-booked": F_SCHEDULE,
}
NUMERICS_ONLY = (F_RACE, F_OUTPUT)  # seen only when bytes are tracked


@pytest.fixture(scope="module")
def packages() -> tuple[Package, ...]:
    return subjects()


def test_every_kind_has_an_expected_fault() -> None:
    assert len(MUTATIONS) >= 20
    assert sorted(m.name for m in MUTATIONS) == sorted(EXPECTED)


@pytest.mark.parametrize("name", [m.name for m in MUTATIONS])
def test_mutation_is_rejected_by_verify_and_faulted_by_both_engines(
        name: str, packages: tuple[Package, ...]) -> None:
    subject, bad = apply_first(mutation(name), packages)
    o = outcome(subject, bad)
    assert o.verify, f"{name}: verify accepted the mutated package"
    numba, simpy = o.faults["numba"], o.faults["simpy"]
    assert numba and numba[0].code == EXPECTED[name], (name, numba[:1])
    assert [first_key(f) for f in simpy] == [first_key(f) for f in numba], (name, numba, simpy)
    if EXPECTED[name] not in NUMERICS_ONLY:  # the timing-only path checks the same
        timing = outcome(subject, bad, engines=("numba",), numerics=False)
        assert timing.faults["numba"] and first_key(timing.faults["numba"][0]) == \
            first_key(numba[0])


def test_the_subjects_themselves_are_clean(packages: tuple[Package, ...]) -> None:
    for pkg in packages:
        o = outcome(pkg, pkg, engines=("numba",))
        assert o.verify == "" and o.faults["numba"] == ()


def test_simulate_verifies_first_and_no_verify_reaches_the_engine(
        packages: tuple[Package, ...], tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from planner.cli import main

    _, bad = apply_first(mutation("transfer-dead-source"), packages)
    path = tmp_path / "bad"
    save_package(bad, path)
    assert main(["simulate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(r"transfer \d+ source", err) and "not inside" in err
    assert main(["simulate", str(path), "--no-verify"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^faults [1-9]", out, re.M), out
    assert re.search(r"transfer source outside every live tensor buffer at step \d+", out), out


def test_verify_names_the_overrun_before_the_footprint(packages: tuple[Package, ...]) -> None:
    # a longer transfer also needs a longer exchange table; the access is named
    _, bad = apply_first(mutation("transfer-overrun-4k"), packages)
    with pytest.raises(PackageInvalid, match=r"transfer 0 source \(\d+ bytes\) is not inside"):
        from simulator import verify

        verify(bad)
