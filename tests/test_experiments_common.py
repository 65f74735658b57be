"""experiments/common.py: result blocks replace themselves in docs/results.md;
experiments/fit_c600.py (the fit only) publishes its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import common, fit_c600


def test_blocks_replace_only_themselves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nintro kept\n")
    monkeypatch.setenv(common.RESULTS_ENV, str(doc))
    common.publish("a", "Table A", "one", tmp_path, command="python a.py")
    common.publish("b", "Table B", "| x |\n|---|\n| 1 |", tmp_path, command="python b.py",
                   markdown=True)
    common.publish("a", "Table A", "two", tmp_path, command="python a.py --again")
    text = doc.read_text()
    assert text.startswith("# Results\n\nintro kept\n")
    assert text.count("<!-- results:a -->") == 1 and "one" not in text
    assert text.index("results:a") < text.index("results:b")  # a keeps its place
    assert "```text\ntwo\n```" in text and "`python a.py --again` — " in text
    assert "| x |\n|---|\n| 1 |\n<!-- /results:b -->" in text
    assert (tmp_path / "a.txt").read_text() == "two\n"
    assert "commit " in text and "load " in text


def test_no_results_file_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(common.RESULTS_ENV, raising=False)
    common.publish("c", "C", "text", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_fit_c600_small(tmp_path: Path) -> None:
    text = fit_c600.main(["--small", "--out-dir", str(tmp_path)])
    assert (tmp_path / "fit_c600.txt").read_text().strip() == text.strip()
    assert (tmp_path / "fit_c600.png").stat().st_size > 1000
    assert "held out" in text and "median" in text
