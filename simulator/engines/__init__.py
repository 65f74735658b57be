"""Simulator engines behind one interface (simulator.engines.base)."""

from simulator.engines.base import (
    ENGINES,
    FAULT_NAMES,
    Engine,
    EngineOutput,
    MemoryImage,
    engine,
)

__all__ = ["ENGINES", "FAULT_NAMES", "Engine", "EngineOutput", "MemoryImage", "engine"]
