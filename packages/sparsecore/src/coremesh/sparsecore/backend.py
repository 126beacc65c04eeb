"""The ``sparsecore`` backend registered under the ``coremesh.backends`` entry points."""

from __future__ import annotations

import importlib.util
from typing import Any

from coremesh.core import CoreKind, KernelSpec, MeshError


class SparseCoreKernel:
    """A kernel over a SparseCore vector- or scalar-subcore mesh, built with ``pl.kernel``."""

    def __init__(self, spec: KernelSpec) -> None:
        if spec.mesh.kind is CoreKind.TENSOR:
            raise MeshError(
                "the sparsecore backend got a TensorCore mesh",
                rule="it builds kernels over SparseCore meshes only",
                chip=spec.mesh.chip.name,
                fix="use coremesh.core.kernel(...) to dispatch on the mesh kind",
            )
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu

        self._spec = spec
        params = pltpu.CompilerParams(collective_id=spec.collective_id, **spec.compiler_options)
        self._fn = pl.kernel(
            spec.body,
            out_type=spec.out_type,
            mesh=spec.mesh.pallas_mesh(),
            scratch_types=tuple(spec.scratch),
            compiler_params=params,
            cost_estimate=spec.cost_estimate.to_pallas() if spec.cost_estimate else None,
            name=spec.name,
        )

    @property
    def spec(self) -> KernelSpec:
        return self._spec

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)


class SparseCoreBackend:
    name = "sparsecore"
    core_kinds = frozenset({CoreKind.SPARSE_VECTOR, CoreKind.SPARSE_SCALAR})

    def is_available(self) -> bool:
        return importlib.util.find_spec("jax.experimental.pallas.tpu_sc") is not None

    def make_kernel(self, spec: KernelSpec) -> SparseCoreKernel:
        return SparseCoreKernel(spec)
