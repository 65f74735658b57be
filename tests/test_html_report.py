"""The interactive HTML profile (planner/html_report.py): self-contained
(plotly.js embedded, nothing from the network), its figures' data adds up to
the run, and, in headless Chromium (slow), a hovered tile map cell names its
tile and the timeline has one lane per step kind."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from planner import PipelineConfig, load_model, run_model
from planner.cli import main
from planner.html_report import LANES, fullest_tile, write_report
from simulator import load_device


def page_data(text: str) -> dict[str, Any]:
    """The JSON the page draws its figures from."""
    m = re.search(r"<script type='application/json' id='report-data'>(.*?)</script>", text,
                  re.S)
    assert m, "no report-data block"
    return json.loads(m.group(1))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, Any]:
    out = run_model(load_model("vit-micro"), load_device("tiny"),
                    PipelineConfig(optimization_steps=2), numerics=False)
    path = tmp_path_factory.mktemp("html") / "r.html"
    write_report(path, out.result.package, out.summary)
    return path, out.summary, out.result.package


def test_self_contained_with_every_section(report: tuple[Path, dict, Any]) -> None:
    path, summary, pkg = report
    text = path.read_text()
    # nothing is fetched: no script, stylesheet or image from an address
    assert not re.search(r"""<(script|img|link|iframe)[^>]+(src|href)=['"]?(https?:)?//""",
                         text, re.I)
    assert "Plotly.newPlot" in text and text.count("<script") >= 3  # plotly.js inline
    rows = re.findall(r"<tr>", text.split("id='ops'")[1].split("<tbody>")[1].split("</table>")[0])
    assert len(rows) == len(summary["ops"])
    for op in summary["ops"]:
        assert f"<td>{op['op']}</td>" in text
    for name in ("timeline", "map-busy", "map-bytes_in", "map-bytes_out", "map-peak",
                 "liveness", "memmap", "hover-tile", "tile-input"):
        assert f"id='{name}'" in text, name
    assert text.split("id='history'")[1].split("<tbody>")[1].count("<tr>") == 2


def test_figures_add_up_to_the_run(report: tuple[Path, dict, Any]) -> None:
    path, summary, pkg = report
    d = page_data(path.read_text())
    tl = d["timeline"]
    # expanded: the lanes tile the run, one bar per execution piece
    lanes = {t["name"]: t for t in tl["expanded"] if t["y"] and t["x"][0] is not None}
    assert set(lanes) == set(LANES)
    assert sum(sum(t["x"]) for t in lanes.values()) == summary["cycles"]
    spans = sorted((b, b + x) for t in lanes.values() for b, x in zip(t["base"], t["x"],
                                                                      strict=True))
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert sum(lanes["sync"]["x"]) == sum(o["sync"] for o in summary["ops"])
    # collapsed: each body once, shaded with its trip count
    assert tl["loops"] and tl["start"] == "collapsed"
    assert any("Repeat x" in a["text"] for a in tl["annotations"]["collapsed"])
    # tile maps: every tile once, hottest first, values the simulation's
    for m in d["maps"]:
        ids = [t for row in m["tile"] for t in row if t >= 0]
        assert sorted(ids) == list(range(pkg.tiles))
        flat = [v for row in m["z"] for v in row if v is not None]
        assert m["hottest"][0][1] == max(flat)
        assert [v for _, v in m["hottest"]] == sorted((v for _, v in m["hottest"]),
                                                      reverse=True)
    peak = next(m for m in d["maps"] if m["key"] == "peak")
    assert peak["hottest"][0][0] == fullest_tile(pkg) == d["tile"]
    # memory: every buffer, grouped by tile
    mem = d["memory"]
    assert len(mem["kind"]) == pkg.arrays["buf_tile"].size and mem["ptr"][-1] == len(mem["kind"])
    t = d["tile"]
    assert np.array_equal(np.sort(mem["addr"][mem["ptr"][t]:mem["ptr"][t + 1]]),
                          np.sort(pkg.arrays["buf_addr"][pkg.arrays["buf_tile"] == t]))
    live = d["liveness"]["data"]
    assert len(live[0]["y"]) == pkg.n_steps and max(live[0]["y"]) >= max(live[1]["y"])


def test_cli_report_html_and_tile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, html = tmp_path / "run", tmp_path / "r.html"
    assert main(["plan", "vit-micro", "--device", "tiny", "--optimization-steps", "0",
                 "--out", str(run_dir), "--report", str(html)]) == 0
    assert html.stat().st_size > 10_000
    assert main(["report", str(run_dir), "--html", str(tmp_path / "t3.html"), "--tile",
                 "3"]) == 0
    assert page_data((tmp_path / "t3.html").read_text())["tile"] == 3
    capsys.readouterr()
    assert main(["report", str(run_dir), "--html", str(tmp_path / "x.html"), "--tile",
                 "99"]) == 2
    assert "--tile" in capsys.readouterr().err


def _browser() -> Any:
    """Headless Debian chromium driven by its chromedriver (selenium)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    driver = shutil.which("chromedriver")
    if driver is None or not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium "
                    "chromium-driver)")
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,3000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.mark.slow
def test_hover_a_tile_in_headless_chromium(tmp_path: Path) -> None:
    """The report of siglip-so400m-map (1 layer, c600, 2 optimizer steps):
    hovering a tile map cell shows that cell's tile id on the page; the
    timeline has one lane per step kind, in both views.  With
    TILEPLAN_SCREENSHOT=PATH the page is also saved as a PNG there (README's
    picture)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    out = run_model(load_model("siglip-so400m-map", layers=1), load_device("c600"),
                    PipelineConfig(optimization_steps=2), numerics=False)
    path = tmp_path / "siglip.html"
    write_report(path, out.result.package, out.summary)
    width = page_data(path.read_text())["width"]
    d = _browser()
    try:
        d.get(path.as_uri())
        deadline = time.time() + 60
        while d.execute_script("return document.body.dataset.rendered") is None:
            assert time.time() < deadline, "the page never finished drawing"
            time.sleep(0.2)
        assert [e for e in d.get_log("browser") if e["level"] == "SEVERE"] == []
        assert int(d.execute_script("return document.body.dataset.rendered")) >= 7
        assert int(d.execute_script("return document.body.dataset.opRows")) == \
            len(out.summary["ops"])
        lanes = ("return document.getElementById('timeline').data.filter("
                 "t => t.y.length && t.x[0] !== null).map(t => t.name)")
        assert d.execute_script(lanes) == list(LANES)
        d.find_element(By.CSS_SELECTOR, "button[data-view='expanded']").click()
        assert d.execute_script(lanes) == list(LANES)
        div = d.find_element(By.ID, "map-busy")
        d.execute_script("arguments[0].scrollIntoView()", div)
        drag = div.find_element(By.CSS_SELECTOR, ".nsewdrag")
        box = drag.rect
        for col, row in ((0, 0), (5, 2), (width - 1, 1)):
            x = (col + 0.5) * box["width"] / width - box["width"] / 2
            y = (row + 0.5) * box["height"] / 23 - box["height"] / 2  # 1472 tiles: 23 rows
            ActionChains(d).move_to_element_with_offset(drag, int(x), int(y)).perform()
            time.sleep(0.3)
            assert d.find_element(By.ID, "hover-tile").text == str(row * width + col)
        ActionChains(d).click().perform()  # a click shows that tile's memory
        time.sleep(0.3)
        assert d.find_element(By.ID, "memmap").get_attribute("data-tile") == \
            str(1 * width + width - 1)
        shot = os.environ.get("TILEPLAN_SCREENSHOT")
        if shot:
            d.execute_script("window.scrollTo(0, 0)")
            d.set_window_size(1400, 2300)
            d.find_element(By.CSS_SELECTOR, "button[data-view='collapsed']").click()
            d.execute_script("document.getElementById('timeline').scrollIntoView();"
                             "window.scrollBy(0, -90)")
            d.save_screenshot(shot)
    finally:
        d.quit()


@pytest.mark.slow
def test_a_27_layer_report_is_small(tmp_path: Path) -> None:
    """siglip-so400m-map, 27 layers: under 20 MB (its writing time is measured
    by experiments/bench_report.py)."""
    out = run_model(load_model("siglip-so400m-map"), load_device("c600"),
                    PipelineConfig(optimization_steps=0), numerics=False)
    path = write_report(tmp_path / "s.html", out.result.package, out.summary)
    assert path.stat().st_size < 20e6
    d = page_data(path.read_text())
    assert len(d["memory"]["kind"]) == out.result.package.arrays["buf_tile"].size


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
    stated = re.search(r"The bars add up to ([\d,]+) bytes \(the tile holds ([\d,]+)", text)
    bars = re.search(r"Plotly.newPlot\('failure-bars', (\[\{.*?\}\]), \{\"height", text)
    assert stated and bars, text[-2000:]
    values = json.loads(bars.group(1))[0]["x"]
    assert sum(values) == int(stated.group(1).replace(",", "")) > 0
    assert int(stated.group(2).replace(",", "")) == 16384


def test_out_writes_the_per_tile_arrays(tmp_path: Path) -> None:
    from planner.breakdown import TILE_ARRAYS
    from planner.html_report import peak_memory
    from simulator import load_package, run
    from simulator.trace import live_tensor_bytes

    assert main(["plan", "vit-micro", "--device", "tiny", "--optimization-steps", "1",
                 "--out", str(tmp_path / "run"), "--quiet"]) == 0
    with np.load(tmp_path / "run" / "tiles.npz") as z:
        got = {k: z[k] for k in z.files}
    assert sorted(got) == sorted(TILE_ARRAYS)
    pkg = load_package(tmp_path / "run" / "package")
    sim = run(pkg, numerics=False)
    assert all(v.dtype == np.int64 and v.shape == (pkg.tiles,) for v in got.values())
    assert np.array_equal(got["busy_cycles"], sim.tile_busy)
    assert np.array_equal(got["bytes_in"], sim.tile_bytes_in)
    assert got["bytes_in"].sum() > 0
    fixed = got["code_bytes"] + got["exchange_table_bytes"] + got["support_bytes"]
    assert np.array_equal(fixed + got["tensor_range_bytes"], peak_memory(pkg))
    live = live_tensor_bytes(pkg, np.arange(pkg.tiles))
    assert np.array_equal(got["peak_tensor_bytes"], live.max(axis=1))
    kinds = [got[f"peak_{k}_bytes"] for k in ("parameter", "activation", "scratch", "landing")]
    assert np.all(got["peak_tensor_bytes"] >= np.max(kinds, axis=0))
    assert np.all(got["peak_tensor_bytes"] <= np.sum(kinds, axis=0))
    assert np.all(got["peak_tensor_bytes"] <= got["tensor_range_bytes"])
