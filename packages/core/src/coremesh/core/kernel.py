"""Kernels: what a backend needs to build one, and the dispatch from mesh kind to backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from coremesh.core.errors import MeshError
from coremesh.core.mesh import CoreKind, CoreMesh


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """What XLA's scheduler needs to overlap a kernel with other work.

    Kernels without one are opaque to the scheduler (MaxText's ring all-gather notes the same).
    """

    flops: int
    bytes_accessed: int
    transcendentals: int = 0
    remote_bytes: int = 0

    def to_pallas(self) -> Any:
        from jax.experimental import pallas as pl

        return pl.CostEstimate(
            flops=self.flops,
            transcendentals=self.transcendentals,
            bytes_accessed=self.bytes_accessed,
            remote_bytes_transferred=self.remote_bytes,
        )


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """A per-core kernel: its body, outputs, scratch and the mesh it runs on."""

    body: Callable[..., None]
    out_type: Any
    mesh: CoreMesh
    scratch: Sequence[Any] = ()
    name: str | None = None
    collective_id: int | None = None
    cost_estimate: CostEstimate | None = None
    compiler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class PallasKernel:
    """A kernel built with ``pl.kernel`` from a spec: what the Pallas TPU backends return.

    Subclasses name their backend and the mesh kinds they accept; a spec over another kind is
    refused before anything is traced.
    """

    backend_name: str = "pallas"
    kinds: frozenset[CoreKind] = frozenset()

    def __init__(self, spec: KernelSpec) -> None:
        if spec.mesh.kind not in self.kinds:
            accepted = ", ".join(sorted(k.value for k in self.kinds))
            raise MeshError(
                f"the {self.backend_name} backend got a {spec.mesh.kind.value} mesh",
                rule=f"it builds kernels over {accepted} meshes only",
                chip=spec.mesh.chip.name,
                fix="use coremesh.core.kernel(...), which picks the backend for the mesh's kind",
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


@runtime_checkable
class Kernel(Protocol):
    """A callable built from a ``KernelSpec`` by a backend; call it inside ``jax.jit``."""

    @property
    def spec(self) -> KernelSpec: ...

    def __call__(self, *args: Any) -> Any: ...


def kernel(
    body: Callable[..., None],
    *,
    out_type: Any,
    mesh: CoreMesh,
    scratch: Sequence[Any] = (),
    name: str | None = None,
    collective_id: int | None = None,
    cost_estimate: CostEstimate | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> Kernel:
    """Build a kernel with whichever backend serves ``mesh.kind`` (found by entry point)."""
    from coremesh.core.backends import backend_for

    spec = KernelSpec(
        body=body,
        out_type=out_type,
        mesh=mesh,
        scratch=tuple(scratch),
        name=name,
        collective_id=collective_id,
        cost_estimate=cost_estimate,
        compiler_options=dict(compiler_options or {}),
    )
    return backend_for(mesh.kind).make_kernel(spec)
