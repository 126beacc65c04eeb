"""SparseCore meshes of the active target: vector subcores or scalar subcores.

Chips without SparseCores (v4, v5e) are refused here, before a kernel is traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from coremesh.core import Chip, CoreKind, Target, UnsupportedOnChipError, current_target
from coremesh.core.chips import SparseCoreSpec


def sparsecore_of(chip: Chip) -> SparseCoreSpec:
    if chip.sparsecore is None:
        raise UnsupportedOnChipError(
            f"{chip.name} has no SparseCore",
            rule="SparseCore meshes exist on v5p, v6e and TPU7x",
            chip=chip.name,
            fix="run SparseCore kernels on v5p, v6e or TPU7x, or use a TensorCore kernel",
        )
    return chip.sparsecore


@dataclasses.dataclass(frozen=True)
class SparseCoreMesh:
    """All SparseCores of one device: ``cores`` x ``subcores`` vector (or scalar) subcores."""

    chip: Chip
    kind: CoreKind = CoreKind.SPARSE_VECTOR
    core_axis: str = "core"
    subcore_axis: str = "subcore"

    def __post_init__(self) -> None:
        sparsecore_of(self.chip)
        if self.kind is CoreKind.TENSOR:
            raise UnsupportedOnChipError(
                "a SparseCore mesh cannot be of tensor kind",
                rule="kinds are sparse_vector or sparse_scalar",
                chip=self.chip.name,
                fix="use coremesh.tensorcore.mesh() for TensorCores",
            )

    @property
    def spec(self) -> SparseCoreSpec:
        return sparsecore_of(self.chip)

    @property
    def axes(self) -> Mapping[str, int]:
        if self.kind is CoreKind.SPARSE_SCALAR:
            return MappingProxyType({self.core_axis: self.spec.cores})
        return MappingProxyType(
            {self.core_axis: self.spec.cores, self.subcore_axis: self.spec.subcores}
        )

    def pallas_mesh(self) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        if self.kind is CoreKind.SPARSE_SCALAR:
            return plsc.ScalarSubcoreMesh(axis_name=self.core_axis, num_cores=self.spec.cores)
        return plsc.VectorSubcoreMesh(
            core_axis_name=self.core_axis,
            subcore_axis_name=self.subcore_axis,
            num_cores=self.spec.cores,
            num_subcores=self.spec.subcores,
        )


def mesh(
    kind: CoreKind = CoreKind.SPARSE_VECTOR, *, target: Target | None = None
) -> SparseCoreMesh:
    """The SparseCore mesh of ``target`` (default: the active one)."""
    t = target if target is not None else current_target()
    return SparseCoreMesh(t.chip, kind)
