"""The fuzzer (experiments/fuzz.py): 120 random small models on random devices
end as verified, fault-free, reference-matching packages or as typed
BuildFailure / ConfigError; and the fuzzer itself can see a bug."""

from __future__ import annotations

import pytest

from experiments import fuzz


def test_120_cases_of_seed_1() -> None:
    # 120 (was 200): the suite's budget; seed 1's first 120 reach every outcome
    counts, bugs = fuzz.fuzz(120, seed=1, workers=1, progress=False)
    assert not bugs, "\n".join(f"{fuzz.draw(1, i).describe()}\n{d}" for i, d in bugs[:3])
    assert sum(counts.values()) == 120
    # the generator reaches every outcome, mostly packages that run
    assert counts["ok"] >= 100 and counts["build-failure"] >= 1 and counts["config-error"] >= 1


def test_cases_are_reproducible_one_by_one() -> None:
    assert fuzz.draw(3, 17) == fuzz.draw(3, 17)
    assert fuzz.draw(3, 17) != fuzz.draw(3, 18) != fuzz.draw(4, 17)
    text = fuzz.draw(3, 17).describe()
    assert "fuzz case 17 of seed 3" in text and "hidden = " in text and "tiles = " in text


OK_CASE = 2  # case 2 of seed 0 plans and runs cleanly (asserted below)


def test_the_ok_case_is_ok() -> None:
    assert fuzz.run_case(fuzz.draw(0, OK_CASE))[0] == "ok"


@pytest.mark.parametrize("failure", ["raise", "fault", "wrong"])
def test_anything_but_the_three_outcomes_is_a_bug(failure: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.pipeline

    real = planner.pipeline.run_model

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        if failure == "raise":
            raise IndexError("planner bug")
        out = real(*args, **kwargs)
        out.summary["faults" if failure == "fault" else "numerics_ok"] = \
            3 if failure == "fault" else False
        return out

    monkeypatch.setattr(planner.pipeline, "run_model", broken)
    outcome, detail = fuzz.run_case(fuzz.draw(0, OK_CASE))
    assert outcome == "bug"
    assert {"raise": "IndexError: planner bug", "fault": "faults 3",
            "wrong": "faults 0"}[failure] in detail
