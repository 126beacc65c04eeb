"""Where programs run: a chip, a number of devices, and a context kernels are traced inside.

The hardware target lives here; the simulator and the compile-only target live in
``coremesh.testing``. Backends ask ``current_target()`` which chip to build meshes for, so one
kernel source serves a real TPU, the CPU simulator and deviceless compiles alike.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import ChipError


@runtime_checkable
class Target(Protocol):
    """A place programs run, seen by kernels traced inside ``activate()``."""

    @property
    def name(self) -> str: ...

    @property
    def chip(self) -> Chip: ...

    @property
    def num_devices(self) -> int: ...

    @property
    def cores_per_device(self) -> int: ...

    def activate(self) -> contextlib.AbstractContextManager[object]: ...

    def device_mesh(self, axis_name: str = "device") -> Any:
        """A one-axis ``jax.sharding.Mesh`` over the target's devices, with ``Auto`` axis type
        so ``shard_map`` over it reshards whatever arrays it is given."""
        ...


def auto_mesh(devices: Sequence[Any], axis_name: str = "device") -> Any:
    """The one-axis ``Auto`` mesh every target's ``device_mesh()`` returns, over ``devices``."""
    import numpy as np
    from jax.sharding import AxisType, Mesh

    return Mesh(np.array(devices), (axis_name,), axis_types=(AxisType.Auto,))


_current: contextvars.ContextVar[Target | None] = contextvars.ContextVar(
    "coremesh_target", default=None
)


@contextlib.contextmanager
def using_target(target: Target) -> Iterator[Target]:
    """Make ``target`` the one ``current_target()`` answers with, inside the block."""
    token = _current.set(target)
    try:
        yield target
    finally:
        _current.reset(token)


class SliceTarget:
    """What every target holds: a chip, how many devices, how many cores each device has."""

    def __init__(self, chip: Chip, num_devices: int, cores_per_device: int) -> None:
        self._chip, self._n, self._cores = chip, num_devices, cores_per_device

    @property
    def chip(self) -> Chip:
        return self._chip

    @property
    def num_devices(self) -> int:
        return self._n

    @property
    def cores_per_device(self) -> int:
        return self._cores


class HardwareTarget(SliceTarget):
    """The TPU devices this process really has."""

    name = "hardware"

    def activate(self) -> contextlib.AbstractContextManager[object]:
        return using_target(self)

    def device_mesh(self, axis_name: str = "device") -> Any:
        import jax

        return auto_mesh(jax.devices("tpu")[: self._n], axis_name)

    @classmethod
    def detect(cls) -> HardwareTarget | None:
        """The local TPU, or None when there is none (never initialises a TPU backend twice)."""
        import jax

        try:
            devices = jax.devices("tpu")
        except RuntimeError:
            return None
        if not devices:
            return None
        d = devices[0]
        return cls(get_chip(d.device_kind), len(devices), int(getattr(d, "num_cores", 1)))

    def __repr__(self) -> str:
        return f"HardwareTarget({self._chip.name}, devices={self._n}, cores={self._cores})"


def current_target() -> Target:
    """The active target: the innermost ``using_target``/``simulate``, else local TPU hardware."""
    t = _current.get()
    if t is not None:
        return t
    hw = HardwareTarget.detect()
    if hw is None:
        raise ChipError(
            "no TPU target: this process has no TPU and no simulated or compile-only target "
            "is active",
            rule="kernels are built for a chip, which comes from the active target",
            fix="run inside `with coremesh.testing.simulate(chip='v5p', devices=4):` on a CPU, "
            "or on a TPU VM",
        )
    return hw
