"""experiments/bench_kernels.py: the tiny variant runs and writes its table and plot."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_kernels as mod


def test_bench_kernels_tiny(tmp_path: Path) -> None:
    shapes = ((8, 32, 8), (48, 64, 40))
    table = mod.main(shapes=shapes, repeats=2, out_dir=tmp_path)
    assert (tmp_path / "bench_kernels.txt").read_text().strip() == table.strip()
    assert (tmp_path / "bench_kernels.png").stat().st_size > 1000
    rows = table.splitlines()[1:3]
    assert [r.split()[0] for r in rows] == ["8x32x8", "48x64x40"]
    for row in rows:
        cells = row.split()
        assert float(cells[1]) > 0 and float(cells[2]) > 0  # GMAC/s
        assert int(cells[4]) > 0  # modelled cycles
    small, large = (float(r.split()[5].rstrip("%")) for r in rows)
    assert 0 < small < large <= 100  # larger blocks use the AMP better
