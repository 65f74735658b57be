"""Shared fixtures: a micro ViT (fast for every test that needs a whole model),
and the check that every summary.json the suite writes matches the schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tilecommon.runtime import RUNTIME, configure

configure()  # before any jitted module is imported (tilecommon.runtime)

import planner  # noqa: E402
from planner.ir.graph import Graph  # noqa: E402
from planner.ir.models import zoo_path  # noqa: E402


@pytest.fixture(scope="session")
def micro_toml() -> Path:
    """Path of the zoo's micro ViT TOML (hidden 32, 2 heads, 10 tokens, 2 layers, batch 2)."""
    return zoo_path("vit-micro")


@pytest.fixture(scope="session")
def micro_graph(micro_toml: Path) -> Graph:
    """The fp8 graph of the micro ViT."""
    return planner.load_model(micro_toml)


@pytest.fixture(autouse=True)
def _quiet_cold_numba_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's first-compilation notice (stderr) depends on the state of
    NUMBA_CACHE_DIR, not on the test: off unless a test turns it on."""
    monkeypatch.setattr(RUNTIME, "cold", False)


@pytest.fixture(scope="session", autouse=True)
def _every_summary_matches_the_schema(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the session: every summary.json any test wrote (under the
    session's temporary directory) validates against the shipped schema
    (planner/schemas/summary.schema.json); the first that does not fails the
    session, naming the file and field."""
    yield
    from planner.report import check_summary

    for path in sorted(tmp_path_factory.getbasetemp().rglob("summary.json")):
        check_summary(json.loads(path.read_text()), str(path))
