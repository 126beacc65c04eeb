"""The TensorCore mesh of the active target: 2 cores on v4 (megacore) and v5p, 1 elsewhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from coremesh.core import Chip, CoreKind, MeshError, Target, current_target, jax_compat


@dataclasses.dataclass(frozen=True)
class TensorCoreMesh:
    """The TensorCores of one device, as Pallas' ``TensorCoreMesh`` spans them."""

    chip: Chip
    cores: int
    axis_name: str = "core"

    def __post_init__(self) -> None:
        self.chip.check_cores_per_device(self.cores)
        if not self.axis_name.isidentifier():
            raise MeshError(
                f"core axis name {self.axis_name!r} is not an identifier",
                rule="mesh axis names are Python identifiers",
                chip=self.chip.name,
                fix="use a name such as 'core'",
            )

    @property
    def kind(self) -> CoreKind:
        return CoreKind.TENSOR

    @property
    def axes(self) -> Mapping[str, int]:
        return MappingProxyType({self.axis_name: self.cores})

    def pallas_mesh(self) -> Any:
        return jax_compat.tensorcore_mesh(self.axis_name, num_cores=self.cores)


def mesh(
    kind: CoreKind = CoreKind.TENSOR,
    *,
    axis_name: str = "core",
    target: Target | None = None,
) -> TensorCoreMesh:
    """The TensorCore mesh of ``target`` (default: the active one).

    The same shape as ``coremesh.sparsecore.mesh``: the kind first, so code written against
    either backend asks for a mesh the same way; here the only kind is ``CoreKind.TENSOR``.
    """
    t = target if target is not None else current_target()
    if kind is not CoreKind.TENSOR:
        raise MeshError(
            f"a TensorCore mesh cannot be of kind {kind!r}",
            rule="coremesh.tensorcore.mesh serves CoreKind.TENSOR only; the kind comes first",
            chip=t.chip.name,
            fix="pass no kind (an axis name goes in axis_name=...), or use "
            "coremesh.sparsecore.mesh(kind) for SparseCore subcores",
        )
    return TensorCoreMesh(t.chip, t.cores_per_device, axis_name)
