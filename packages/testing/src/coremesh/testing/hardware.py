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
from coremesh.core.targets import HardwareTarget, using_target

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


class HardwareRun:
    """The local TPU devices behind the simulator's API (``mesh``, ``device_mesh``, ``run``)."""

    name = "hardware"

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
        self._chip, self._n, self._cores = found.chip, devices, found.cores_per_device
        self._stack: list[contextlib.ExitStack] = []

    @property
    def chip(self) -> Chip:
        return self._chip

    @property
    def num_devices(self) -> int:
        return self._n

    @property
    def cores_per_device(self) -> int:
        return self._cores

    @property
    def devices(self) -> tuple[Any, ...]:
        import jax

        return tuple(jax.devices("tpu")[: self._n])

    @property
    def race_reports(self) -> tuple[str, ...]:
        return ()  # hardware has no race detector

    def mesh(self, axis_name: str = "device") -> Any:
        import jax

        return jax.make_mesh((self._n,), (axis_name,), devices=self.devices)

    def device_mesh(self, axis_name: str = "device") -> Any:
        import jax

        return jax.make_mesh(
            (self._n,),
            (axis_name,),
            devices=self.devices,
            axis_types=(jax.sharding.AxisType.Auto,),
        )

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import jax

        return jax.block_until_ready(fn(*args, **kwargs))

    def activate(self) -> contextlib.AbstractContextManager[object]:
        return using_target(self)

    def __enter__(self) -> HardwareRun:
        stack = contextlib.ExitStack()
        stack.enter_context(using_target(self))
        self._stack.append(stack)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.pop().close()

    def __repr__(self) -> str:
        return f"HardwareRun({self._chip.name}, devices={self._n}, cores={self._cores})"
