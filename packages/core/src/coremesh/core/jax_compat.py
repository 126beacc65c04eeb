"""The public jax spellings that differ between the supported jax lines, in one place.

Every coremesh package builds TensorCore meshes and reads chip tables through these functions
instead of testing for attributes itself (:mod:`coremesh.core.jax_versions` has the lines).
The simulator's hooks into jax internals have their own module in ``coremesh.testing``.

=====================================  =========================  ===============================
what                                    jax 0.10.2                 jax 0.11 and later
=====================================  =========================  ===============================
a TensorCore mesh                       ``create_tensorcore_mesh``  ``TensorCoreMesh(axis_name=,
                                                                    num_cores=)`` (the old name
                                                                    warns; gone from the docs)
the chip table (``TpuInfo`` registry)  ``pallas.mosaic.tpu_info``  ``jax._src.tpu_info`` (the old
                                                                    module forwards)
=====================================  =========================  ===============================

Semaphores are ``pl.semaphore_*`` on every line (``pltpu.semaphore_*`` went in 0.11), and a mesh's
core count is ``mesh.shape[axis]`` on every line (``mesh.devices`` went in 0.11).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from coremesh.core import jax_versions

#: The first jax whose public TensorCore mesh is the ``TensorCoreMesh`` dataclass.
TENSORCORE_MESH_CLASS_SINCE = "0.11.0"


def tensorcore_mesh(axis_name: str = "core", num_cores: int | None = None) -> Any:
    """A Pallas TensorCore mesh over ``num_cores`` cores (the device's own count if None)."""
    from jax.experimental.pallas import tpu as pltpu

    if jax_versions.at_least(TENSORCORE_MESH_CLASS_SINCE):
        if num_cores is None:
            return pltpu.TensorCoreMesh(axis_name=axis_name)  # reads jax.devices()[0]
        return pltpu.TensorCoreMesh(axis_name=axis_name, num_cores=num_cores)
    return pltpu.create_tensorcore_mesh(axis_name, num_cores=num_cores)


def tensorcore_mesh_class() -> type:
    from jax._src.pallas.mosaic import core as mosaic_core

    cls: type = mosaic_core.TensorCoreMesh
    return cls


def mesh_cores(mesh: Any) -> int:
    """How many cores a Pallas TensorCore mesh spans."""
    return int(next(iter(dict(mesh.shape).values())))


def tpu_info_module() -> ModuleType:
    """The module whose ``registry`` and ``get_tpu_info`` jax reads the chip table from."""
    if jax_versions.at_least("0.11.0"):
        from jax._src import tpu_info
    else:
        from jax._src.pallas.mosaic import tpu_info  # type: ignore[no-redef]
    return tpu_info
