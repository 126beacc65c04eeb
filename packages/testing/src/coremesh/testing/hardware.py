"""Running the simulator's suites on real TPUs: ``simulate()``'s stand-in on a TPU VM.

With ``COREMESH_TARGET=hardware`` (``pytest --coremesh-target=hardware``, which ``nox -s
tpu_tests`` passes), ``simulate(chip, devices)`` returns a :class:`HardwareRun` over the local
TPU devices instead of the simulator, with the same API, so every test that runs kernels through
``simulate()`` runs them on the chip. A test asking for another chip, more devices than the VM
has, or another core mode raises :class:`NotOnThisHardwareError`, which the pytest plugin reports
as a skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import CoremeshError
from coremesh.core.targets import HardwareTarget

ENV = "COREMESH_TARGET"


class NotOnThisHardwareError(CoremeshError):
    """The test asked for a slice this TPU VM is not."""


#: Set by the pytest plugin for the length of one session (``--coremesh-target``); wins over ENV.
_override: list[str] = []


def hardware_requested() -> bool:
    where = _override[-1] if _override else os.environ.get(ENV, "sim")
    return where.lower() == "hardware"


def push_target(where: str) -> None:
    """Run ``simulate()`` on ``where`` ("sim" or "hardware") until :func:`pop_target`."""
    _override.append(where)


def pop_target() -> None:
    _override.pop()


class HardwareRun(HardwareTarget):
    """The local TPU devices behind the simulator's API (``mesh``, ``device_mesh``, ``run``)."""

    def __init__(self, chip: str | Chip, devices: int, cores_per_device: int | None = None) -> None:
        want = get_chip(chip)
        found = HardwareTarget.detect()
        if found is None:
            raise CoremeshError(
                f"{ENV}=hardware but this machine has no TPU",
                rule="hardware runs need the TPU devices they run on",
                chip=want.name,
                fix=f"unset {ENV} (or drop --coremesh-target=hardware) to use the simulator",
            )
        cores = cores_per_device or want.default_cores_per_device
        if found.chip is not want or found.num_devices < devices or found.cores_per_device != cores:
            raise NotOnThisHardwareError(
                f"the test wants {devices} x {want.name} with {cores} core(s) per device; this VM "
                f"has {found.num_devices} x {found.chip.name} with {found.cores_per_device}",
                rule="on hardware a test runs only on the slice it asks for",
                chip=found.chip.name,
                fix="run it on a matching TPU VM, or on the simulator",
            )
        super().__init__(found.chip, devices, found.cores_per_device)
        self._entered: list[contextlib.AbstractContextManager[object]] = []

    @property
    def devices(self) -> tuple[Any, ...]:
        import jax

        return tuple(jax.devices("tpu")[: self.num_devices])

    @property
    def race_reports(self) -> tuple[str, ...]:
        return ()  # hardware has no race detector

    def mesh(self, axis_name: str = "device") -> Any:
        """Like the simulator's: an ``Explicit`` mesh, as ``jax.make_mesh`` makes it."""
        import jax

        return jax.make_mesh((self.num_devices,), (axis_name,), devices=self.devices)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import jax

        return jax.block_until_ready(fn(*args, **kwargs))

    def __enter__(self) -> HardwareRun:
        ctx = self.activate()
        ctx.__enter__()
        self._entered.append(ctx)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered.pop().__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"HardwareRun({self.chip.name}, devices={self.num_devices})"
