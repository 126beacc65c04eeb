"""SparseCore kernels: ``coremesh.core.kernel`` over vector- or scalar-subcore meshes.

One body over one mesh, or parallel lists of bodies and meshes: an MPMD kernel whose
scalar-subcore and vector-subcore programs run together, as ``pl.kernel`` allows. The spec goes
to the backend registered for SparseCore meshes, which checks it against the chip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coremesh.core import CostEstimate, Kernel
from coremesh.core import kernel as core_kernel
from coremesh.core.kernel import CollectiveId
from coremesh.sparsecore.mesh import SparseCoreMesh
from coremesh.sparsecore.mesh import mesh as target_mesh

Body = Callable[..., None]


def kernel(
    body: Body | Sequence[Body],
    *,
    out_type: Any,
    scratch: Sequence[Any] = (),
    mesh: SparseCoreMesh | Sequence[SparseCoreMesh] | None = None,
    name: str | None = None,
    collective_id: CollectiveId = None,
    cost_estimate: CostEstimate | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> Kernel:
    """A SparseCore kernel; call it inside ``jax.jit`` (per device: inside ``shard_map``).

    ``mesh`` defaults to the target's vector-subcore mesh. ``body`` and ``mesh`` are one body and
    one :class:`SparseCoreMesh`, or two lists of equal length (MPMD: e.g. ``[vector_body,
    scalar_body]`` over ``[mesh(), mesh(SPARSE_SCALAR)]``), all of one chip.
    """
    return core_kernel(
        body,
        out_type=out_type,
        mesh=mesh if mesh is not None else target_mesh(),
        scratch=scratch,
        name=name,
        collective_id=collective_id,
        cost_estimate=cost_estimate,
        compiler_options=compiler_options,
    )
