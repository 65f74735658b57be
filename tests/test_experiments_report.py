"""experiments/bench_report.py: the small variant times and sizes both outputs."""

from __future__ import annotations

from pathlib import Path

from experiments import bench_report as mod


def test_bench_report_small(tmp_path: Path) -> None:
    text = mod.main(["--small", "--steps", "0", "--repeats", "1", "--out-dir", str(tmp_path)])
    assert (tmp_path / "bench_report.txt").read_text().strip() == text.strip()
    lines = text.splitlines()[2:]
    assert [" ".join(line.split()[3:5]) for line in lines] == [
        "timing simulation", "HTML report", "full-chip trace"]
    html = lines[1].split()
    assert float(html[5]) > 0 and float(html[7]) > 1.0  # plotly.js alone is ~4.7 MB
    assert float(lines[2].split()[7]) > 0  # the trace's MB column
