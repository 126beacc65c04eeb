"""Deviceless TPU topologies and the compile-only target.

libtpu describes a slice of any TPU generation without the hardware
(``jax.experimental.topologies.get_topology_desc``); programs lowered and compiled against its
devices go through the real TPU compiler. A ``TopologySpec`` says which slice: the chip, how many
chips along each axis, and the core mode (megacore devices with 2 TensorCores, or split devices
with 1) where the chip has both. ``CompileTarget`` is coremesh's ``Target`` for such a slice: inside
``activate()`` the device mesh is the ambient mesh, so ``pltpu.get_tpu_info()``,
a TensorCore mesh with the default core count (``coremesh.core.jax_compat.tensorcore_mesh``) and
``coremesh.core.current_target()`` answer for the chip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

from coremesh.core.chips import Chip, get_chip
from coremesh.core.errors import MeshError
from coremesh.core.targets import auto_mesh, using_target
from coremesh.testing import libtpu_env
from coremesh.testing.aot import versions

#: Device mesh axis every compile-only program is sharded over.
DEVICE_AXIS = "device"

#: JAX devices per topology unless asked otherwise: the core_map guide's 4-device mesh.
DEFAULT_DEVICES = 4

#: Core modes by name, as the CLI and the pytest marker take them.
MODES = {"megacore": 2, "split": 1}


@dataclasses.dataclass(frozen=True)
class TopologySpec:
    """One deviceless slice: ``name`` (``"v5p:2x2x1"``) plus libtpu's keyword arguments."""

    chip: Chip
    name: str
    cores_per_device: int
    chip_config_name: str | None
    chips_per_host_bounds: tuple[int, int, int] | None = None

    @property
    def num_chips(self) -> int:
        return math.prod(int(d) for d in self.name.split(":", 1)[1].split("x"))

    @property
    def num_devices(self) -> int:
        return self.num_chips * self.chip.devices_per_chip(self.cores_per_device)

    @property
    def mode(self) -> str:
        """``megacore`` (2 TensorCores per device) or ``split`` (1) on chips that have both
        (v4, v5p); ``single`` on chips with one way to make devices (v5e, v6e, TPU7x)."""
        if len(self.chip.core_modes) == 1:
            return "single"
        return "megacore" if self.cores_per_device == 2 else "split"

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``get_topology_desc`` besides the name."""
        kw: dict[str, Any] = {}
        if self.chip_config_name is not None:
            kw["chip_config_name"] = self.chip_config_name
        if self.chips_per_host_bounds is not None:
            kw["chips_per_host_bounds"] = list(self.chips_per_host_bounds)
        return kw

    @property
    def label(self) -> str:
        """Short human label, e.g. ``v5p:2x2x1 megacore`` or ``v5e:2x2``."""
        return self.name if self.mode == "single" else f"{self.name} {self.mode}"


def _chip_grid(num_chips: int, rank: int) -> tuple[int, ...]:
    """Spread ``num_chips`` over ``rank`` axes as evenly as the prime factors allow.

    Factors go largest first to the currently smallest axis, ties to the lowest axis:
    1 -> 1x1x1, 2 -> 2x1x1, 4 -> 2x2x1, 8 -> 2x2x2, 16 -> 4x2x2 (the shapes libtpu names).
    """
    factors: list[int] = []
    n, p = num_chips, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    dims = [1] * rank
    for f in sorted(factors, reverse=True):
        i = min(range(rank), key=lambda k: (dims[k], k))
        dims[i] *= f
    return tuple(dims)


def resolve_cores(chip: Chip, cores_per_device: int | None = None, mode: str | None = None) -> int:
    """TensorCores per device for ``chip``: explicit count, a mode name, or the chip's default.

    A mode only applies where the chip has both (v4, v5p); single-mode chips keep their one mode.
    """
    if cores_per_device is not None and mode is not None:
        raise MeshError(
            "both cores_per_device and mode were given",
            rule="a topology has one core mode",
            chip=chip.name,
            fix="pass one of them",
        )
    if mode is not None:
        if mode not in MODES:
            raise MeshError(
                f"unknown core mode {mode!r}",
                rule=f"modes are {', '.join(MODES)}",
                chip=chip.name,
                fix="pass mode='megacore' (2 TensorCores per device) or mode='split' (1)",
            )
        if not chip.has_megacore:
            return chip.default_cores_per_device
        cores_per_device = MODES[mode]
    if cores_per_device is None:
        return chip.default_cores_per_device
    return chip.check_cores_per_device(cores_per_device)


def topology_for(
    chip: str | Chip,
    *,
    devices: int | None = None,
    cores_per_device: int | None = None,
    mode: str | None = None,
    topology: str | None = None,
) -> TopologySpec:
    """The deviceless slice of ``chip`` with ``devices`` JAX devices (default 4).

    ``topology`` names the chip grid directly (``"v5p:4x4x4"`` or just ``"4x4x4"``) instead of a
    device count.
    """
    c = get_chip(chip)
    cores = resolve_cores(c, cores_per_device, mode)
    config = c.core_modes[cores]
    if topology is not None:
        grid = topology.split(":", 1)[1] if ":" in topology else topology
        try:
            dims = tuple(int(d) for d in grid.split("x"))
        except ValueError:
            dims = ()
        if len(dims) != c.topology_rank or any(d < 1 for d in dims):
            example = "x".join(["2"] * c.topology_rank)
            raise MeshError(
                f"topology {topology!r} is not a {c.topology_rank}-d chip grid",
                rule=f"{c.name} topologies are named {c.topology_prefix}:{example} and the like",
                chip=c.name,
                fix=f"pass e.g. topology='{c.topology_prefix}:{example}', or devices=N",
            )
    else:
        n = DEFAULT_DEVICES if devices is None else devices
        per_chip = c.devices_per_chip(cores)
        if n < 1 or n % per_chip:
            raise MeshError(
                f"{n} device(s) do not make whole {c.name} chips",
                rule=f"a {c.name} chip has {per_chip} device(s) with {cores} TensorCore(s) each",
                chip=c.name,
                fix=f"ask for a multiple of {per_chip} devices",
            )
        dims = _chip_grid(n // per_chip, c.topology_rank)
    name = f"{c.topology_prefix}:{'x'.join(str(d) for d in dims)}"
    bounds = (1, 1, 1) if math.prod(dims) == 1 else None
    return TopologySpec(c, name, cores, config, bounds)


@functools.lru_cache(maxsize=64)
def _devices(name: str, kwargs_key: tuple[tuple[str, Any], ...]) -> tuple[Any, ...]:
    libtpu_env.prepare_process()
    from jax.experimental import topologies

    kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs_key}
    desc = topologies.get_topology_desc(topology_name=name, platform="tpu", **kwargs)
    return tuple(desc.devices)


def topology_devices(spec: TopologySpec) -> tuple[Any, ...]:
    """The compile-only devices of ``spec`` (cached; loads libtpu on first use).

    ``LibtpuError`` when libtpu is not installed (jax would only say it found no TPU platform).
    """
    versions.require_compiler()
    key = tuple(
        (k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(spec.kwargs().items())
    )
    try:
        devices = _devices(spec.name, key)
    except Exception as e:  # libtpu's own error text names what it did not accept
        found = versions.libtpu_version()
        if versions.older_than_tested(found):
            raise versions.LibtpuError(
                f"libtpu {found} has no topology {spec.name} ({spec.mode}); coremesh's chip "
                f"registry is built against libtpu {versions.TESTED_LIBTPU}",
                found=found,
                needed=versions.TESTED_LIBTPU,
                rule=f"libtpu said: {e}",
                fix=versions.install_fix(),
                chip=spec.chip.name,
            ) from e
        raise MeshError(
            f"libtpu has no topology {spec.name} ({spec.mode})",
            rule=f"libtpu said: {e}",
            chip=spec.chip.name,
            fix="use a power-of-two device count, or name a topology libtpu knows "
            f"(e.g. {spec.chip.default_topology})",
        ) from e
    cores = int(getattr(devices[0], "num_cores", spec.cores_per_device))
    if len(devices) != spec.num_devices or cores != spec.cores_per_device:
        raise MeshError(
            f"libtpu's {spec.name} has {len(devices)} devices of {cores} core(s); coremesh "
            f"expected {spec.num_devices} of {spec.cores_per_device}",
            rule="the chip registry's core modes must match libtpu's",
            chip=spec.chip.name,
            fix="update coremesh.core.chips core_modes for this libtpu version",
        )
    return devices


class CompileTarget:
    """A deviceless TPU slice as a coremesh ``Target``: programs traced inside ``activate()``
    are built for ``spec.chip`` and compiled by libtpu for it."""

    def __init__(self, spec: TopologySpec) -> None:
        self.spec = spec
        self._mesh: Any = None

    @classmethod
    def for_chip(
        cls,
        chip: str | Chip,
        *,
        devices: int | None = None,
        cores_per_device: int | None = None,
        mode: str | None = None,
        topology: str | None = None,
    ) -> CompileTarget:
        return cls(
            topology_for(
                chip,
                devices=devices,
                cores_per_device=cores_per_device,
                mode=mode,
                topology=topology,
            )
        )

    @property
    def name(self) -> str:
        return f"aot:{self.spec.label}"

    @property
    def chip(self) -> Chip:
        return self.spec.chip

    @property
    def num_devices(self) -> int:
        return self.spec.num_devices

    @property
    def cores_per_device(self) -> int:
        return self.spec.cores_per_device

    @property
    def devices(self) -> tuple[Any, ...]:
        return topology_devices(self.spec)

    @property
    def mesh(self) -> Any:
        """The 1-d ``jax.sharding.Mesh`` over the slice's devices, axis ``"device"``."""
        if self._mesh is None:
            self._mesh = self.device_mesh(DEVICE_AXIS)
        return self._mesh

    def device_mesh(self, axis_name: str = DEVICE_AXIS) -> Any:
        """A one-axis ``Auto`` mesh over the slice's compile-only devices."""
        if axis_name == DEVICE_AXIS and self._mesh is not None:
            return self._mesh
        return auto_mesh(self.devices, axis_name)

    @contextlib.contextmanager
    def _active(self) -> Iterator[CompileTarget]:
        import jax

        with jax.set_mesh(self.mesh), using_target(self):
            yield self

    def activate(self) -> contextlib.AbstractContextManager[object]:
        """Make the slice the ambient mesh and the current coremesh target."""
        return self._active()

    def sharding(self, spec: Any) -> Any:
        from jax.sharding import NamedSharding

        return NamedSharding(self.mesh, spec)

    def __repr__(self) -> str:
        return f"CompileTarget({self.spec.label}, devices={self.num_devices})"


def targets_for(
    chips: Sequence[str | Chip],
    *,
    devices: int | None = None,
    cores_per_device: int | None = None,
    mode: str | None = None,
) -> list[CompileTarget]:
    return [
        CompileTarget.for_chip(c, devices=devices, cores_per_device=cores_per_device, mode=mode)
        for c in chips
    ]
