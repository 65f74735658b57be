"""experiments/bench_numerics.py measures a planner package against the
reference: a row with a finite ratio, no faults and matching outputs."""

from __future__ import annotations

from experiments.bench_numerics import cells, measure


def test_a_row_of_the_micro_vit() -> None:
    row = measure(1, 1, model="vit-micro", device="tiny")
    layers, transfers, inv, t_ref, t_sim, ratio, rel, faults, rss = row
    assert layers == 1 and transfers > 0 and inv > 0 and faults == 0  # type: ignore[operator]
    assert t_ref > 0 and t_sim > 0 and ratio == t_sim / t_ref  # type: ignore[operator]
    assert rel < 1e-2 and rss > 0  # type: ignore[operator]
    assert cells(row)[5] == f"{ratio:.2f}x"
