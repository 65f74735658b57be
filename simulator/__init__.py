"""The machine: device presets, package format, verifier and simulator engines.

Importing this package configures the numeric runtime first
(tilecommon.runtime.configure: Numba's cache keyed by the sources, BLAS
threads), as the CLI does, unless the application configured it already.
"""

from tilecommon.runtime import configure

configure(announce=True)  # before the jitted modules below are imported

from simulator.cost import kernel_cycles  # noqa: E402
from simulator.device import Device, load_device, preset_names  # noqa: E402
from simulator.hardware import (  # noqa: E402
    HardwareResult,
    crosscheck,
    load_hardware_result,
    save_hardware_result,
)
from simulator.package import Package, load_package, save_package  # noqa: E402
from simulator.run import ENGINES, Fault, SimResult, run  # noqa: E402
from simulator.verify import verify  # noqa: E402

__all__ = [
    "ENGINES",
    "Device",
    "Fault",
    "HardwareResult",
    "Package",
    "SimResult",
    "crosscheck",
    "kernel_cycles",
    "load_device",
    "load_hardware_result",
    "load_package",
    "preset_names",
    "run",
    "save_hardware_result",
    "save_package",
    "verify",
]
