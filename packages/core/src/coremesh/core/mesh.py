"""Core meshes: the cores inside one JAX device, and their place in the device mesh.

A ``CoreMesh`` stands for a Pallas mesh (``TensorCoreMesh``, ``VectorSubcoreMesh``,
``ScalarSubcoreMesh``). Backends implement it; this module holds the protocol, the kinds, and the
device x core view collectives need to name a core anywhere in the program.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from coremesh.core.chips import Chip
from coremesh.core.errors import MeshError


class CoreKind(enum.Enum):
    TENSOR = "tensor"
    SPARSE_VECTOR = "sparse_vector"
    SPARSE_SCALAR = "sparse_scalar"


@runtime_checkable
class CoreMesh(Protocol):
    """The cores of one device that a kernel body runs on, SPMD."""

    @property
    def kind(self) -> CoreKind: ...

    @property
    def chip(self) -> Chip: ...

    @property
    def axes(self) -> Mapping[str, int]:
        """Axis name -> size, in mesh order."""
        ...

    def pallas_mesh(self) -> Any:
        """The Pallas mesh object this stands for (passed to ``pl.kernel``/``pl.core_map``)."""
        ...


def num_cores(mesh: CoreMesh) -> int:
    return math.prod(mesh.axes.values())


def check_axis(mesh: CoreMesh, axis: str) -> int:
    """Size of ``axis`` in ``mesh``, or a MeshError naming the axes it does have."""
    if axis not in mesh.axes:
        have = ", ".join(repr(a) for a in mesh.axes) or "none"
        raise MeshError(
            f"the {mesh.kind.value} mesh has no axis {axis!r}",
            rule=f"its axes are {have}",
            chip=mesh.chip.name,
            fix=f"use one of {have}, or build the mesh with axis name {axis!r}",
        )
    return mesh.axes[axis]


@dataclasses.dataclass(frozen=True)
class DeviceCoreView:
    """A device mesh axis times a core mesh: every core of a program has one global index.

    Global index = device * cores_per_device + core, the order hierarchical collectives walk
    (cores of one device first, then across devices).
    """

    device_axis: str
    num_devices: int
    core_axis: str
    cores_per_device: int

    def __post_init__(self) -> None:
        if self.num_devices < 1 or self.cores_per_device < 1:
            raise MeshError(
                f"a view of {self.num_devices} devices x {self.cores_per_device} cores is empty",
                rule="both sizes are at least 1",
                fix="pass the device mesh size and the core mesh size",
            )

    @property
    def size(self) -> int:
        return self.num_devices * self.cores_per_device

    def global_index(self, device: int, core: int) -> int:
        self._check(device, core)
        return device * self.cores_per_device + core

    def locate(self, global_index: int) -> tuple[int, int]:
        if not 0 <= global_index < self.size:
            raise MeshError(
                f"global core index {global_index} is outside 0..{self.size - 1}",
                rule=f"{self.num_devices} devices x {self.cores_per_device} cores",
                fix="index within the view's size",
            )
        return divmod(global_index, self.cores_per_device)

    def _check(self, device: int, core: int) -> None:
        if not (0 <= device < self.num_devices and 0 <= core < self.cores_per_device):
            raise MeshError(
                f"(device {device}, core {core}) is outside the view",
                rule=f"{self.num_devices} devices x {self.cores_per_device} cores",
                fix="index devices and cores from 0",
            )
