"""Shared fixtures: a micro ViT (fast for every test that needs a whole model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.runtime import RUNTIME, configure

configure()  # before any jitted module is imported (kernels.runtime)

import planner  # noqa: E402
from planner.ir.graph import Graph  # noqa: E402

MICRO_TOML = """\
name = "vit-micro"
hidden = 32
heads = 2
mlp = 64
patch = 4
channels = 3
tokens = 10
layers = 2
batch = 2
eps = 1e-6
"""


@pytest.fixture(scope="session")
def micro_toml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a micro ViT model TOML (hidden 32, 2 heads, 10 tokens, 2 layers, batch 2)."""
    path = tmp_path_factory.mktemp("models") / "vit-micro.toml"
    path.write_text(MICRO_TOML)
    return path


@pytest.fixture(scope="session")
def micro_graph(micro_toml: Path) -> Graph:
    """The fp8 graph of the micro ViT."""
    return planner.load_model(micro_toml)


@pytest.fixture(autouse=True)
def _quiet_cold_numba_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's first-compilation notice (stderr) depends on the state of
    NUMBA_CACHE_DIR, not on the test: off unless a test turns it on."""
    monkeypatch.setattr(RUNTIME, "cold", False)
