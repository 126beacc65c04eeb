"""The CPU simulator: unchanged Pallas TPU core-level programs on the CPU, as a chosen TPU slice.

``simulate(chip, devices)`` is the entry point; see :mod:`coremesh.testing.sim.simulator`. Names
load on first use, so importing :mod:`coremesh.testing.sim.devices` (the pytest plugin does,
before jax starts) does not pull in jax's Pallas internals.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coremesh.testing.sim.deadlock import DEFAULT_DEADLINE_S
    from coremesh.testing.sim.devices import configure_host_devices
    from coremesh.testing.sim.errors import (
        LoweringRefusalError,
        MosaicRefusalError,
        NotSimulatedError,
        SimulationDeadlock,
        SimulationFault,
        SimulationRaceError,
        UnfinishedKernelError,
        UninitializedReadError,
    )
    from coremesh.testing.sim.patches import PATCH_NAMES
    from coremesh.testing.sim.schedule import Schedule
    from coremesh.testing.sim.simulator import SimParams, Simulator, simulate

_WHERE = {
    "DEFAULT_DEADLINE_S": "deadlock",
    "configure_host_devices": "devices",
    "LoweringRefusalError": "errors",
    "MosaicRefusalError": "errors",
    "NotSimulatedError": "errors",
    "SimulationDeadlock": "errors",
    "SimulationFault": "errors",
    "UnfinishedKernelError": "errors",
    "UninitializedReadError": "errors",
    "SimulationRaceError": "errors",
    "PATCH_NAMES": "patches",
    "Schedule": "schedule",
    "SimParams": "simulator",
    "Simulator": "simulator",
    "simulate": "simulator",
}

__all__ = [
    "DEFAULT_DEADLINE_S",
    "PATCH_NAMES",
    "LoweringRefusalError",
    "MosaicRefusalError",
    "NotSimulatedError",
    "Schedule",
    "SimParams",
    "SimulationDeadlock",
    "SimulationFault",
    "SimulationRaceError",
    "Simulator",
    "UnfinishedKernelError",
    "UninitializedReadError",
    "configure_host_devices",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
