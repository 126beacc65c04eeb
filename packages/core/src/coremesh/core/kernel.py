"""Kernels: what a backend needs to build one, and the dispatch from mesh kind to backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from coremesh.core.mesh import CoreMesh


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
