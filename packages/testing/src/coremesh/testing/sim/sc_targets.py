"""A SparseCore kernel's signals and DMAs addressed by name to another of its cores: refused.

The simulator runs the SparseCores and subcores of a one-mesh SparseCore kernel one after the
other, as the grid steps of one interpreter core (patch ``sparsecore_axes``). A semaphore signal
or DMA whose ``device_id`` names an axis of that mesh (``{"core": c}``, ``{"core": c,
"subcore": s}``) addresses another grid step, which has no core of its own to deliver to: the
interpreter raised a ``MeshError`` claiming the device has one core (for ``core``), or jax's
own ``NotImplementedError`` (for two mesh axes). Mosaic compiles such kernels (v5p, libtpu
0.0.52), so this is a gap of the simulator, refused by name before the kernel runs. An MPMD
kernel's bodies (:mod:`.mpmd`) run each SparseCore on its own thread and are not checked here;
neither are kernels whose subcores run at once (:mod:`.subcore_barrier`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from coremesh.testing.sim.chip import current
from coremesh.testing.sim.errors import NotSimulatedError
from coremesh.testing.sim.faults import user_location
from coremesh.testing.sim.jaxprs import all_eqns

#: Primitives that take a ``device_id`` among their flattened arguments.
_ADDRESSED = ("semaphore_signal", "dma_start")


def _named(eqn: Any) -> Iterator[dict[Any, Any]]:
    """The ``device_id`` dicts among ``eqn``'s arguments."""
    from jax._src import tree_util

    tree = eqn.params.get("args_tree")
    if tree is None:
        return
    for arg in tree_util.tree_unflatten(tree, eqn.invars):
        if isinstance(arg, dict):
            yield arg


def check(jaxpr: Any, mesh: Any) -> None:
    """Refuse a signal or DMA in ``jaxpr`` (a kernel over SparseCore ``mesh``, run one grid
    step after the other) whose ``device_id`` names an axis of ``mesh`` of more than one
    point."""
    shape = dict(mesh.shape)
    for eqn in all_eqns(jaxpr):
        if eqn.primitive.name not in _ADDRESSED:
            continue
        for device_id in _named(eqn):
            named = [a for a in device_id if a in shape and shape[a] > 1]
            if not named:
                continue
            where = user_location(eqn.source_info)
            axes = ", ".join(f"{a!r} ({shape[a]})" for a in named)
            raise NotSimulatedError(
                f"a {eqn.primitive.name} addressed to another core of this SparseCore kernel's "
                f"mesh (device_id names {axes}){f' at {where}' if where else ''} is not "
                "simulated",
                rule="the simulator runs the SparseCores and subcores of a one-mesh SparseCore "
                "kernel one after the other on one thread, so a signal or DMA to another of "
                "them has no core to land on; Mosaic compiles it",
                chip=current().name,
                fix="check the kernel with the compile-only target (coremesh.testing.aot); an "
                "MPMD kernel (pl.kernel with body=[...] and mesh=[...] and semaphores tied to a "
                "mesh) runs each SparseCore on its own thread in the simulator",
            )
