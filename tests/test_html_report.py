"""The HTML profile (planner/html_report.py): self-contained, with the per-op
table, timeline, heat maps and memory map; and, in headless Chromium (slow),
actually rendered."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from planner import PipelineConfig, load_model, run_model
from planner.cli import main
from planner.html_report import fullest_tile, write_report
from simulator import load_device


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = run_model(load_model("vit-micro"), load_device("tiny"),
                    PipelineConfig(optimization_steps=2), numerics=False)
    path = tmp_path_factory.mktemp("html") / "r.html"
    write_report(path, out.result.package, out.summary)
    return path, out.summary


def test_self_contained_with_every_section(report: tuple[Path, dict]) -> None:
    path, summary = report
    text = path.read_text()
    assert "http://" not in text and "https://" not in text  # no network
    rows = re.findall(r"<tr>", text.split("id='ops'")[1].split("<tbody>")[1].split("</table>")[0])
    assert len(rows) == len(summary["ops"])
    for op in summary["ops"]:
        assert f"<td>{op['op']}</td>" in text
    for name in ("timeline", "heatmaps", "memmap"):
        src = re.search(rf"id='{name}' alt='[^']*' src='data:image/png;base64,([^']+)'", text)
        assert src and base64.b64decode(src.group(1))[:8] == b"\x89PNG\r\n\x1a\n"
    assert text.split("id='history'")[1].split("<tbody>")[1].count("<tr>") == 2


def test_cli_report_html_and_tile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, html = tmp_path / "run", tmp_path / "r.html"
    assert main(["plan", "vit-micro", "--device", "tiny", "--optimization-steps", "0",
                 "--out", str(run_dir), "--report", str(html)]) == 0
    assert html.stat().st_size > 10_000
    assert main(["report", str(run_dir), "--html", str(tmp_path / "t3.html"), "--tile",
                 "3"]) == 0
    assert "Memory map of tile 3" in (tmp_path / "t3.html").read_text()
    capsys.readouterr()
    assert main(["report", str(run_dir), "--html", str(tmp_path / "x.html"), "--tile",
                 "99"]) == 2
    assert "--tile" in capsys.readouterr().err


@pytest.mark.slow
def test_renders_in_headless_chromium(tmp_path: Path) -> None:
    """The report of a vit-tiny run (2 layers on c600, 2 optimizer steps)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    out = run_model(load_model("vit-tiny", layers=2), load_device("c600"),
                    PipelineConfig(optimization_steps=2), numerics=False)
    path, summary = tmp_path / "vit-tiny.html", out.summary
    write_report(path, out.result.package, summary)
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert re.search(r'data-images-rendered="3"', dom), dom[:500]
    assert re.search(rf'data-op-rows="{len(summary["ops"])}"', dom)


def test_fullest_tile_is_the_peak(report: tuple[Path, dict]) -> None:
    from planner.html_report import peak_memory

    out = run_model(load_model("vit-micro"), load_device("tiny"),
                    PipelineConfig(optimization_steps=0), numerics=False)
    pkg = out.result.package
    assert peak_memory(pkg)[fullest_tile(pkg)] == peak_memory(pkg).max()


def test_a_baseline_that_does_not_fit_writes_the_failure_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = tmp_path / "small.toml"
    dev.write_text('name = "small"\nbase = "tiny"\nmemory_size = 16384\n')
    html = tmp_path / "fail.html"
    assert main(["plan", "vit-micro", "--device", str(dev), "--report", str(html)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "need" in err
    text = html.read_text()
    assert "the baseline did not build" in text and "needs" in text
    assert "id='memmap'" in text and "data:image/png;base64," in text
