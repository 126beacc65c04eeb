"""Running the simulator's suites on real TPUs: the local TPU behind the simulator's API.

With ``--coremesh-target=hardware`` (or ``COREMESH_TARGET=hardware``; ``nox -s tpu_tests`` passes
the option), the pytest plugin's ``sim`` and ``slice_target`` fixtures hand tests a
:class:`HardwareRun` over the local TPU devices instead of a simulator, with the same API, so
every test that takes its slice from them runs its kernels on the chip. ``simulate()`` itself is
always the simulator. A test asking for another chip, more devices than the VM has, or another
core mode raises :class:`NotOnThisHardwareError`, which the plugin reports as a skip with the
reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import CoremeshError
from coremesh.core.targets import HardwareTarget

#: The environment variable that, set to ``hardware``, does what ``--coremesh-target`` does.
ENV = "COREMESH_TARGET"


class NotOnThisHardwareError(CoremeshError):
    """The test asked for a slice this TPU VM is not."""


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
