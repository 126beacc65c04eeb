"""coremesh.testing: verify core-level Pallas TPU programs without a TPU."""

from __future__ import annotations

from typing import Any

# First: libtpu reads its environment once, when it loads; quiet it on a machine without a TPU.
from coremesh.testing import libtpu_env as _libtpu_env  # noqa: F401  # isort: skip

__version__ = "0.1.0"

# The simulator imports jax's Pallas internals; load it on first use so the pytest plugin
# (which imports this package) stays cheap.
_LAZY = {
    "simulate": "coremesh.testing.sim",
    "Simulator": "coremesh.testing.sim",
    "SimulationDeadlock": "coremesh.testing.sim",
    "NotSimulatedError": "coremesh.testing.sim",
    "SimulationFault": "coremesh.testing.sim",
    "UninitializedReadError": "coremesh.testing.sim",
    "Schedule": "coremesh.testing.sim",
    "explore": "coremesh.testing.exploration",
    "Exploration": "coremesh.testing.exploration",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'coremesh.testing' has no attribute {name!r}")
