"""``kernel(...)``: a per-subcore program over SparseCore meshes, SPMD or MPMD.

One body over one mesh (vector subcores or scalar subcores), or parallel lists of bodies and
meshes: an MPMD kernel whose scalar-subcore and vector-subcore programs run together, as
``pl.kernel`` allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from coremesh.core import CostEstimate, MeshError, current_target
from coremesh.sparsecore.mesh import SparseCoreMesh

Body = Callable[..., None]


def kernel(
    body: Body | Sequence[Body],
    *,
    out_type: Any,
    mesh: SparseCoreMesh | Sequence[SparseCoreMesh],
    scratch: Sequence[Any] = (),
    name: str | None = None,
    cost_estimate: CostEstimate | None = None,
    compiler_options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """A SparseCore kernel; call it inside ``jax.jit`` (per device: inside ``shard_map``).

    ``body`` and ``mesh`` are one body and one :class:`SparseCoreMesh`, or two lists of equal
    length (MPMD: e.g. ``[vector_body, scalar_body]`` over ``[mesh(), mesh(SPARSE_SCALAR)]``).
    All meshes must be of one chip.
    """
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    bodies = list(body) if isinstance(body, Sequence) else [body]
    meshes = list(mesh) if isinstance(mesh, Sequence) else [mesh]
    multi = isinstance(body, Sequence) or isinstance(mesh, Sequence)
    if len(bodies) != len(meshes) or not meshes:
        raise MeshError(
            f"{len(bodies)} bodies for {len(meshes)} meshes",
            rule="an MPMD kernel pairs each body with one mesh",
            chip=meshes[0].chip.name if meshes else None,
            fix="pass lists of equal length, or one body and one mesh",
        )
    chips = {m.chip.name for m in meshes}
    if len(chips) != 1:
        raise MeshError(
            f"meshes of several chips: {sorted(chips)}",
            rule="one kernel runs on one chip's SparseCores",
            chip=meshes[0].chip.name,
            fix="build every mesh for the same target",
        )
    if multi and len({(m.kind, m.core_axis) for m in meshes}) != len(meshes):
        raise MeshError(
            "two meshes of one MPMD kernel are of the same kind",
            rule="an MPMD kernel runs one program per kind of subcore",
            chip=meshes[0].chip.name,
            fix="pair a vector-subcore mesh with a scalar-subcore mesh",
        )
    if multi and current_target().name == "simulator":
        raise MeshError(
            "an MPMD SparseCore kernel (several body/mesh pairs) cannot run on the simulator",
            rule="Pallas' interpret mode cannot lower several mesh/function pairs (jax 0.10.2, "
            "0.11.2 and 0.12.0.1 alike)",
            chip=meshes[0].chip.name,
            fix="check it with the compile-only target (coremesh.testing.aot), or run its "
            "vector- and scalar-subcore bodies as two kernels to simulate them",
        )
    params = pltpu.CompilerParams(**dict(compiler_options or {}))
    return pl.kernel(  # type: ignore[no-any-return]
        bodies if multi else bodies[0],
        out_type=out_type,
        mesh=[m.pallas_mesh() for m in meshes] if multi else meshes[0].pallas_mesh(),
        scratch_types=tuple(scratch),
        compiler_params=params,
        cost_estimate=cost_estimate.to_pallas() if cost_estimate else None,
        name=name,
    )
