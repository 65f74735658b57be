"""experiments/bench_numerics.py measures a planner package against the
reference: a row with a finite ratio, no faults and matching outputs."""

from __future__ import annotations

from experiments.bench_numerics import measure


def test_a_row_of_the_micro_vit() -> None:
    layers, transfers, inv, t_ref, t_sim, ratio, rel, faults, rss = measure(
        1, 1, model="vit-micro", device="tiny")
    assert layers == 1 and int(transfers) > 0 and int(inv) > 0 and faults == 0
    assert float(t_ref) >= 0 and float(t_sim) > 0 and float(ratio.rstrip("x")) > 0
    assert float(rel) < 1e-2 and float(rss) > 0
