"""Who takes part in a collective: the cores of a device, the devices of a mesh axis, or both.

A collective names its participants the way ``jax.lax`` does, by axis name:

* ``"core"``: the TensorCores of one device (the core mesh axis), reached with
  ``device_id={"core": i}``;
* a device mesh axis such as ``"device"``: one participant per device (chips over ICI). On a
  device with several TensorCores every core runs its own instance with the same-numbered core
  of the other devices, so both cores' DMA engines work;
* ``("device", "core")``: every core of every device, one hierarchical axis whose index is
  ``device * cores_per_device + core`` (the order of ``jax.lax`` collectives over the axis
  tuple).

:class:`Axis` is the one device x core view of these participants. It is resolved and checked
before anything is traced (array functions) or when a kernel body is traced (in-kernel
collectives); its methods that take or return ranks are used inside kernel bodies, where ranks
are traced integers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from coremesh.core import Chip, MeshError, current_target

#: Default name of the TensorCore mesh axis (``coremesh.tensorcore.mesh()`` uses it).
CORE_AXIS = "core"
#: The device mesh axis array functions use outside ``shard_map`` (the target's device mesh).
DEVICE_AXIS = "device"

AxisName = str | tuple[str, ...]
Kind = Literal["core", "device", "hierarchical"]


@dataclasses.dataclass(frozen=True)
class Axis:
    """The participants of a collective, with their count and how to address one.

    ``num_devices`` is the size of the device axis (1 for ``kind="core"``), ``cores`` the cores
    per device in the kernel's mesh. ``size`` is the number of participants.
    """

    kind: Kind
    device_axis: str | None
    core_axis: str
    num_devices: int
    cores: int
    chip: Chip | None = None

    @property
    def size(self) -> int:
        if self.kind == "core":
            return self.cores
        if self.kind == "device":
            return self.num_devices
        return self.num_devices * self.cores

    @property
    def name(self) -> AxisName:
        """The axis name as ``jax.lax`` spells it."""
        if self.kind == "core":
            return self.core_axis
        assert self.device_axis is not None
        if self.kind == "device":
            return self.device_axis
        return (self.device_axis, self.core_axis)

    @property
    def spans_cores(self) -> bool:
        """True when cores of one device are distinct participants (core or hierarchical)."""
        return self.kind != "device"

    @property
    def spans_devices(self) -> bool:
        return self.kind != "core" and self.num_devices > 1

    # In-kernel addressing ---------------------------------------------------------------

    def rank(self) -> Any:
        """This core's index among the participants (a traced int32)."""
        import jax

        if self.kind == "core":
            return jax.lax.axis_index(self.core_axis)
        assert self.device_axis is not None
        dev = jax.lax.axis_index(self.device_axis)
        if self.kind == "device":
            return dev
        return dev * self.cores + jax.lax.axis_index(self.core_axis)

    def device_id(self, rank: Any) -> dict[str, Any]:
        """``device_id`` for a remote DMA or signal to participant ``rank``."""
        import jax

        if self.kind == "core":
            return {self.core_axis: rank}
        assert self.device_axis is not None
        if self.kind == "device":
            return {self.device_axis: rank, self.core_axis: jax.lax.axis_index(self.core_axis)}
        return {self.device_axis: rank // self.cores, self.core_axis: rank % self.cores}

    def shift(self, rank: Any, by: int) -> Any:
        """``(rank + by) mod size`` for a traced rank and a static shift."""
        import jax

        return jax.lax.rem(rank + (by % self.size), self.size)

    def describe(self) -> str:
        if self.kind == "core":
            return f"core axis {self.core_axis!r} ({self.cores} cores)"
        if self.kind == "device":
            return f"device axis {self.device_axis!r} ({self.num_devices} devices)"
        return (
            f"axis ({self.device_axis!r}, {self.core_axis!r}) "
            f"({self.num_devices} devices x {self.cores} cores)"
        )


def _chip_or_none() -> Chip | None:
    from coremesh.core import ChipError

    try:
        return current_target().chip
    except ChipError:
        return None


def _manual_axes() -> dict[str, int]:
    """Sizes of the manual (``shard_map``) axes of the mesh being traced, if any."""
    import jax

    mesh = jax.sharding.get_abstract_mesh()
    manual = set(getattr(mesh, "manual_axes", ()))
    names = getattr(mesh, "axis_names", ())
    sizes = getattr(mesh, "axis_sizes", ())
    return {n: int(s) for n, s in zip(names, sizes, strict=False) if n in manual}


def _split(axis_name: AxisName, core_axis: str, chip: Chip | None) -> tuple[Kind, str | None]:
    """The kind of an axis name and its device axis, or a MeshError saying how to write it."""
    chip_name = chip.name if chip else None
    if isinstance(axis_name, str):
        if axis_name == core_axis:
            return "core", None
        return "device", axis_name
    if isinstance(axis_name, tuple | list):
        names = tuple(axis_name)
        if len(names) == 1:
            return _split(names[0], core_axis, chip)
        if len(names) == 2 and all(isinstance(n, str) for n in names):
            if names[1] == core_axis and names[0] != core_axis:
                return "hierarchical", names[0]
            if names[0] == core_axis and names[1] != core_axis:
                raise MeshError(
                    f"axis {names!r} puts the core axis first",
                    rule="the hierarchical axis is (device axis, core axis): participant "
                    "index = device * cores_per_device + core, cores of one device adjacent",
                    chip=chip_name,
                    fix=f"write ({names[1]!r}, {names[0]!r})",
                )
        raise MeshError(
            f"axis {names!r} is not a collective axis",
            rule=f"collectives run over {core_axis!r}, one device axis, or (device axis, "
            f"{core_axis!r})",
            chip=chip_name,
            fix="collect over one device axis at a time, or over (device axis, core axis)",
        )
    raise MeshError(
        f"axis {axis_name!r} is not an axis name",
        rule="axis names are strings, or a (device axis, core axis) tuple",
        chip=chip_name,
        fix=f"pass {core_axis!r}, {DEVICE_AXIS!r} or ({DEVICE_AXIS!r}, {core_axis!r})",
    )


def resolve(axis_name: AxisName, *, core_axis: str = CORE_AXIS) -> Axis:
    """The participants of ``axis_name`` for an array function, checked before tracing.

    Inside ``shard_map`` the device axis must be one of its manual axes; outside, the function
    runs over the target's devices and the device axis is ``"device"``.
    """
    target = current_target()
    chip = target.chip
    kind, device_axis = _split(axis_name, core_axis, chip)
    num_devices = 1
    if device_axis is not None:
        manual = _manual_axes()
        if device_axis in manual:
            num_devices = manual[device_axis]
        elif manual:
            have = ", ".join(repr(a) for a in manual) or "none"
            raise MeshError(
                f"the shard_map being traced has no axis {device_axis!r}",
                rule=f"its manual axes are {have}",
                chip=chip.name,
                fix=f"collect over one of {have}, or add {device_axis!r} to the mesh",
            )
        elif device_axis != DEVICE_AXIS:
            raise MeshError(
                f"device axis {device_axis!r} outside shard_map",
                rule=f"outside shard_map a collective runs over the target's {target.num_devices} "
                f"devices, whose axis is {DEVICE_AXIS!r}",
                chip=chip.name,
                fix=f"use {DEVICE_AXIS!r}, or call it inside a shard_map over a mesh with axis "
                f"{device_axis!r}",
            )
        else:
            num_devices = target.num_devices
    return Axis(kind, device_axis, core_axis, num_devices, target.cores_per_device, chip)


def in_kernel(axis_name: AxisName | Axis, *, core_axis: str = CORE_AXIS) -> Axis:
    """The participants of ``axis_name`` seen from inside a kernel body being traced."""
    import jax

    if isinstance(axis_name, Axis):
        return axis_name
    chip = _chip_or_none()
    kind, device_axis = _split(axis_name, core_axis, chip)

    def size(name: str, what: str) -> int:
        try:
            return int(jax.lax.axis_size(name))
        except (NameError, KeyError, ValueError) as e:
            raise MeshError(
                f"no {what} axis {name!r} is in scope in this kernel body",
                rule="in-kernel collectives run inside pl.kernel / pl.core_map over a "
                "TensorCore mesh, inside shard_map for device axes",
                chip=chip.name if chip else None,
                fix=f"name the core mesh axis {core_axis!r} (or pass core_axis=), and call the "
                "kernel inside shard_map over the device axis",
            ) from e

    cores = size(core_axis, "core mesh")
    devices = size(device_axis, "device") if device_axis is not None else 1
    return Axis(kind, device_axis, core_axis, devices, cores, chip)


def check_peers(axis: Axis, peers: Sequence[int], what: str) -> None:
    """Every participant index in ``peers`` exists on ``axis``."""
    bad = [p for p in peers if not 0 <= p < axis.size]
    if bad:
        raise MeshError(
            f"{what} names participant(s) {bad} on the {axis.describe()}",
            rule=f"participants are numbered 0..{axis.size - 1}",
            chip=axis.chip.name if axis.chip else None,
            fix="index participants within the axis size",
        )
