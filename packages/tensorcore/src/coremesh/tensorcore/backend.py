"""The ``tensorcore`` backend registered under the ``coremesh.backends`` entry points."""

from __future__ import annotations

import importlib.util
from typing import Any

from coremesh.core import CoreKind, KernelSpec, MeshError


class TensorCoreKernel:
    """A kernel over a TensorCore mesh, built with ``pl.kernel``."""

    def __init__(self, spec: KernelSpec) -> None:
        if spec.mesh.kind is not CoreKind.TENSOR:
            raise MeshError(
                f"the tensorcore backend got a {spec.mesh.kind.value} mesh",
                rule="it builds kernels over TensorCore meshes only",
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


class TensorCoreBackend:
    name = "tensorcore"
    core_kinds = frozenset({CoreKind.TENSOR})

    def is_available(self) -> bool:
        return importlib.util.find_spec("jax.experimental.pallas.tpu") is not None

    def make_kernel(self, spec: KernelSpec) -> TensorCoreKernel:
        return TensorCoreKernel(spec)
