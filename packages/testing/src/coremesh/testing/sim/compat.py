"""Where the jax internals the simulator hooks differ between the supported jax lines.

:mod:`coremesh.testing.sim.patches` asks this module, never ``hasattr`` on jax itself. Public
spellings (meshes, the chip table's module) are in :mod:`coremesh.core.jax_compat`.
"""

from __future__ import annotations

from typing import Any

from coremesh.core import jax_versions

#: jax's first release whose TensorCore mesh is a dataclass with a default core count
#: (``TensorCoreMesh(axis_name=...)`` reads ``jax.devices()[0].num_cores``).
MESH_DATACLASS_SINCE = "0.11.0"


def tensorcore_mesh_default_cores() -> Any:
    """The closure cell of ``TensorCoreMesh.__init__`` that holds its ``num_cores`` default
    factory (a dataclass ``__init__`` binds the factory there, not as a module global), or None
    where the mesh has no default (jax 0.10.2)."""
    if not jax_versions.at_least(MESH_DATACLASS_SINCE):
        return None
    from jax._src.pallas.mosaic import core as mosaic_core

    init = mosaic_core.TensorCoreMesh.__init__
    cells = dict(zip(init.__code__.co_freevars, init.__closure__ or (), strict=True))
    return cells["__dataclass_dflt_num_cores__"]


def default_cores_function() -> tuple[Any, str] | None:
    """(module, name) of the module-level function ``create_tensorcore_mesh`` calls for the
    device's core count, where there is one (jax 0.11 and later)."""
    if not jax_versions.at_least(MESH_DATACLASS_SINCE):
        return None
    from jax._src.pallas.mosaic import core as mosaic_core

    return mosaic_core, "_get_default_num_cores"
