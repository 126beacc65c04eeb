"""A SparseCore kernel's signals and DMAs addressed by name to another of its cores: refused.

The simulator runs the SparseCores and subcores of a one-mesh SparseCore kernel one after the
other, as the grid steps of one interpreter core (patch ``sparsecore_axes``). A semaphore signal
or DMA whose ``device_id`` names an axis of that mesh (``{"core": c}``, ``{"core": c,
"subcore": s}``) addresses another grid step, which has no core of its own to deliver to: the
interpreter raised a ``MeshError`` claiming the device has one core (for ``core``), or jax's
own ``NotImplementedError`` (for two mesh axes); a DMA, from jax 0.12 its ``ValueError:
Unrecognized axes in device_id``. Mosaic compiles such kernels (v5p, libtpu 0.0.52; a DMA from
jax 0.12, whose lowering is the first to pass its core), so this is a gap of the simulator,
refused by name before the kernel runs. An MPMD
kernel's bodies (:mod:`.mpmd`) run each SparseCore on its own thread and are not checked here;
neither are kernels whose subcores run at once (:mod:`.subcore_barrier`).

An axis of one point can name only the signaller's own place on it: :func:`own_axes_dropped`
takes such axes out of a ``device_id`` (``{"core": 0}`` on a mesh of one SparseCore is the
core's own semaphore, as Mosaic resolves it). From jax 0.12 the interpreter resolves a
``device_id``'s mesh axes itself and, given the mesh's cores as grid steps, raised its own
``ValueError: Unrecognized axes in device_id`` there.
"""

from __future__ import annotations

from typing import Any

from coremesh.testing.sim import compat
from coremesh.testing.sim.chip import current
from coremesh.testing.sim.errors import NotSimulatedError
from coremesh.testing.sim.faults import user_location
from coremesh.testing.sim.jaxprs import all_eqns, arguments, device_ids, map_jaxprs

_ClosedJaxpr = compat.closed_jaxpr_class()


def check(jaxpr: Any, mesh: Any) -> None:
    """Refuse a signal or DMA in ``jaxpr`` (a kernel over SparseCore ``mesh``, run one grid
    step after the other) whose ``device_id`` names an axis of ``mesh`` of more than one
    point."""
    from coremesh.core import jax_versions

    shape = dict(mesh.shape)
    for eqn in all_eqns(jaxpr):
        for device_id in device_ids(eqn):
            named = [a for a in device_id if a in shape and shape[a] > 1]
            if not named:
                continue
            where = user_location(eqn.source_info)
            axes = ", ".join(f"{a!r} ({shape[a]})" for a in named)
            dma = eqn.primitive.name == "dma_start"
            compiles = (
                "Mosaic compiles it"
                if not dma or jax_versions.at_least("0.12.0")
                else "Mosaic compiles such a DMA from jax 0.12 (this jax's lowering fails to "
                "verify it)"
            )
            raise NotSimulatedError(
                f"a {eqn.primitive.name} addressed to another core of this SparseCore kernel's "
                f"mesh (device_id names {axes}){f' at {where}' if where else ''} is not "
                "simulated",
                rule="the simulator runs the SparseCores and subcores of a one-mesh SparseCore "
                "kernel one after the other on one thread, so a signal or DMA to another of "
                f"them has no core to land on; {compiles}",
                chip=current().name,
                fix="check the kernel with the compile-only target (coremesh.testing.aot); an "
                "MPMD kernel (pl.kernel with body=[...] and mesh=[...] and semaphores tied to a "
                "mesh) runs each SparseCore on its own thread in the simulator",
            )


def own_axes_dropped(jaxpr: Any, mesh: Any) -> Any | None:
    """``jaxpr`` (a kernel over SparseCore ``mesh``) with the axes of ``mesh`` that have one
    point taken out of every signal's and DMA's ``device_id`` (a ``device_id`` left empty is the
    signaller's own: ``None``), or None when no ``device_id`` names such an axis."""
    single = {a for a, n in dict(mesh.shape).items() if n == 1}
    if not single or not any(_names(eqn, single) for eqn in all_eqns(jaxpr)):
        return None
    return _dropped(jaxpr, single)


def _names(eqn: Any, axes: set[Any]) -> bool:
    return any(axes & set(device_id) for device_id in device_ids(eqn))


def _dropped(jaxpr: Any, axes: set[Any]) -> Any:
    """``jaxpr`` (a ``Jaxpr`` or ``ClosedJaxpr``) with ``axes`` out of its device ids, nested
    jaxprs too."""
    from jax._src import tree_util

    if _ClosedJaxpr is not None and isinstance(jaxpr, _ClosedJaxpr):
        return jaxpr.replace(jaxpr=_dropped(jaxpr.jaxpr, axes))

    def nested(inner: Any) -> Any:
        return _dropped(inner, axes)

    eqns = []
    for old in jaxpr.eqns:
        new = old.replace(params={k: map_jaxprs(v, nested) for k, v in old.params.items()})
        if _names(new, axes):
            key, args = arguments(new)
            kept = type(args)(_without(a, axes) if isinstance(a, dict) else a for a in args)
            leaves, tree = tree_util.tree_flatten(kept)
            new = new.replace(invars=leaves, params={**new.params, key: tree})
        eqns.append(new)
    return jaxpr.replace(eqns=eqns)


def _without(device_id: dict[Any, Any], axes: set[Any]) -> dict[Any, Any] | None:
    kept = {a: v for a, v in device_id.items() if a not in axes}
    return kept or None
