"""SparseCore meshes of the active target: vector subcores or scalar subcores.

Chips without SparseCores (v4, v5e) are refused here, before a kernel is traced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from coremesh.core import (
    Chip,
    CoreKind,
    MeshError,
    Target,
    UnsupportedOnChipError,
    current_target,
)
from coremesh.core.chips import SparseCoreSpec


def active_sparsecores(chip: Chip, cores_per_device: int | None = None) -> int:
    """SparseCores one JAX device drives: the chip record's count in its default mode, scaled by
    the device's share of the chip's TensorCores (a v5p device in split mode drives 2 of 4)."""
    spec = sparsecore_of(chip)
    cores = chip.check_cores_per_device(cores_per_device or chip.default_cores_per_device)
    return max(1, spec.cores * cores // chip.default_cores_per_device)


def sparsecore_of(chip: Chip) -> SparseCoreSpec:
    if chip.sparsecore is None:
        raise UnsupportedOnChipError(
            f"{chip.name} has no SparseCore",
            rule="SparseCore meshes exist on v5p, v6e and TPU7x",
            chip=chip.name,
            fix="run SparseCore kernels on v5p, v6e or TPU7x, or use a TensorCore kernel",
        )
    return chip.sparsecore


_KINDS = (CoreKind.SPARSE_VECTOR, CoreKind.SPARSE_SCALAR)


@dataclasses.dataclass(frozen=True)
class SparseCoreMesh:
    """All SparseCores of one device: ``cores`` x ``subcores`` vector (or scalar) subcores."""

    chip: Chip
    kind: CoreKind = CoreKind.SPARSE_VECTOR
    core_axis: str = "core"
    subcore_axis: str = "subcore"
    #: TensorCores per JAX device of the target (None: the chip's default mode).
    cores_per_device: int | None = None

    def __post_init__(self) -> None:
        sparsecore_of(self.chip)
        active_sparsecores(self.chip, self.cores_per_device)
        if self.kind not in _KINDS:
            raise MeshError(
                f"a SparseCore mesh cannot be of kind {self.kind!r}",
                rule="kinds are CoreKind.SPARSE_VECTOR or CoreKind.SPARSE_SCALAR",
                chip=self.chip.name,
                fix="use coremesh.tensorcore.mesh() for TensorCores",
            )
        scalar = self.kind is CoreKind.SPARSE_SCALAR
        names = (self.core_axis,) if scalar else (self.core_axis, self.subcore_axis)
        if len(set(names)) < len(names) or not all(n.isidentifier() for n in names):
            raise MeshError(
                f"SparseCore mesh axis names {names!r} are not distinct identifiers",
                rule="mesh axis names are distinct Python identifiers",
                chip=self.chip.name,
                fix="use names such as axis_name='core', subcore_axis_name='subcore'",
            )

    @property
    def spec(self) -> SparseCoreSpec:
        return sparsecore_of(self.chip)

    @property
    def num_cores(self) -> int:
        """SparseCores in the mesh (those the device drives)."""
        return active_sparsecores(self.chip, self.cores_per_device)

    @property
    def num_subcores(self) -> int:
        return self.spec.subcores

    @property
    def num_workers(self) -> int:
        """Vector subcores in the mesh (cores x subcores)."""
        return self.num_cores * self.num_subcores

    @property
    def axes(self) -> Mapping[str, int]:
        if self.kind is CoreKind.SPARSE_SCALAR:
            return MappingProxyType({self.core_axis: self.num_cores})
        return MappingProxyType(
            {self.core_axis: self.num_cores, self.subcore_axis: self.spec.subcores}
        )

    def pallas_mesh(self) -> Any:
        from jax.experimental.pallas import tpu_sc as plsc

        if self.kind is CoreKind.SPARSE_SCALAR:
            return plsc.ScalarSubcoreMesh(axis_name=self.core_axis, num_cores=self.num_cores)
        return plsc.VectorSubcoreMesh(
            core_axis_name=self.core_axis,
            subcore_axis_name=self.subcore_axis,
            num_cores=self.num_cores,
            num_subcores=self.spec.subcores,
        )


def mesh(
    kind: CoreKind = CoreKind.SPARSE_VECTOR,
    *,
    axis_name: str = "core",
    subcore_axis_name: str = "subcore",
    target: Target | None = None,
) -> SparseCoreMesh:
    """The SparseCore mesh of ``target`` (default: the active one), with as many SparseCores as
    one of its devices drives (v5p split mode: 2).

    The same shape as ``coremesh.tensorcore.mesh``; ``subcore_axis_name`` names the vector
    subcores' axis (a scalar-subcore mesh has only ``axis_name``).
    """
    t = target if target is not None else current_target()
    return SparseCoreMesh(
        t.chip,
        kind,
        core_axis=axis_name,
        subcore_axis=subcore_axis_name,
        cores_per_device=t.cores_per_device,
    )
