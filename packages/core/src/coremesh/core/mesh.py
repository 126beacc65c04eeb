"""Core meshes: the cores inside one JAX device, and their place in the device mesh.

A ``CoreMesh`` stands for a Pallas mesh (``TensorCoreMesh``, ``VectorSubcoreMesh``,
``ScalarSubcoreMesh``). Backends implement it; this module holds the protocol and the kinds that
route a kernel to its backend.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from coremesh.core.chips import Chip


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
