"""The simulator benchmark runs end to end at a tiny size and writes its table."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_simulator


def test_bench_simulator_tiny(tmp_path: Path) -> None:
    table = bench_simulator.main(["--layers", "0"], device="tiny", min_invocations=500,
                                 trips_numerics=2,
                                 shape=bench_simulator.SMALL_SHAPE, out_dir=tmp_path,
                                 repeats=1)
    text = (tmp_path / "bench_simulator.txt").read_text()
    assert text.strip() == table.strip()
    rows = dict(line.split("  ", 1) for line in table.splitlines()[:-1])
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["device tiles"] == "16"
    # 16 tiles x 2 vertices x 16 trips >= 500
    assert rows["timing-only: Repeat trips"] == "16"
    assert rows["timing-only: vertex invocations"] == "512"
    assert rows["numerics: vertex invocations"] == "64"
    # the simulator reproduces numpy's fp32 sums rounded to fp16 exactly
    assert rows["numerics: max |sim - numpy| / max|C|"] == "0.00e+00"


def test_trips_for_reaches_the_minimum() -> None:
    dev = bench_simulator.load_device("c600")
    trips = bench_simulator.trips_for(dev, 1_000_000)
    assert 2 * dev.tiles * trips >= 1_000_000 > 2 * dev.tiles * (trips - 1)


def test_planner_case_row_and_profile_of_the_micro_vit() -> None:
    row, profile = bench_simulator.measure_planner(1, 1, model="vit-micro", device="tiny")
    layers, transfers, inv, t_ref, t_sim, ratio, rel, faults, rss = row
    assert layers == 1 and transfers > 0 and inv > 0 and faults == 0  # type: ignore[operator]
    assert t_ref > 0 and t_sim > 0 and ratio == t_sim / t_ref  # type: ignore[operator]
    assert rel < 1e-2 and rss > 0  # type: ignore[operator]
    assert bench_simulator.planner_cells(row)[5] == f"{ratio:.2f}x"
    # the profile names the engine's phases and the kernels that ran; its parts
    # add up to about the run (the rest is Python around the engine call)
    assert {"image: build", "outputs: read", "exchange: copies", "execute: MATMUL",
            "other"} <= set(profile)
    assert all(v >= 0 for v in profile.values())
    assert 0.5 * t_sim < sum(profile.values()) < 2 * t_sim  # type: ignore[operator]
    text = bench_simulator.profile_table(profile)
    assert text.splitlines()[-1].split()[0] == "total"
