"""The machine: device presets, package format, verifier and simulator engines."""

from simulator.cost import kernel_cycles
from simulator.device import Device, load_device, preset_names
from simulator.hardware import (
    HardwareResult,
    crosscheck,
    load_hardware_result,
    save_hardware_result,
)
from simulator.package import Package, load_package, save_package
from simulator.run import ENGINES, Fault, SimResult, run
from simulator.verify import verify

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
