"""The public jax spellings that differ between the supported jax lines, in one place.

Every coremesh package builds TensorCore meshes and reads chip tables through these functions
instead of testing for attributes itself (:mod:`coremesh.core.jax_versions` has the lines).
The simulator's hooks into jax internals have their own module in ``coremesh.testing``.

What differs, and where coremesh handles it:

- A TensorCore mesh: ``pltpu.create_tensorcore_mesh(axis, num_cores=)`` on 0.10.2; from 0.11 the
  keyword-only ``pltpu.TensorCoreMesh(axis_name=, num_cores=)`` (the old name warns with a
  DeprecationWarning). :func:`tensorcore_mesh`.
- A mesh's core count: ``len(mesh.devices)`` on 0.10.2 only; ``mesh.shape[axis]`` on every line.
  :func:`mesh_cores`.
- A kernel ref's memory space: ``ref.memory_space`` on 0.10.2; from 0.11 a traced ref raises
  ValueError there and asks for ``jax.typeof(ref).memory_space``, which every line has (and which
  a ``ref.at[...]`` view cannot answer, on any line). :func:`ref_memory_space`.
- The chip table (``TpuInfo``, ``registry``, ``get_tpu_info``): ``jax._src.pallas.mosaic.tpu_info``
  on 0.10.2, ``jax._src.tpu_info`` from 0.11 (the old module forwards). :func:`tpu_info_module`.
  The figures for v4, v5e, v5p, v6e and TPU7x are the same on 0.10.2, 0.11.2 and 0.12.0.1.

Spelled one way on every line, so nothing here: semaphores are ``pl.semaphore_*``
(``pltpu.semaphore_*`` and ``pltpu.DeviceIdType`` went in 0.11; ``pl.DeviceIdType`` warns from
0.12, and ``device_id_type`` is best left at its default); kernels are ``pl.kernel`` with the
same signature (``pl.core_map`` warns from 0.11).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from coremesh.core import jax_versions
from coremesh.core.errors import MeshError

#: The first jax whose public TensorCore mesh is the ``TensorCoreMesh`` dataclass.
TENSORCORE_MESH_CLASS_SINCE = "0.11.0"
#: The first jax that keeps the chip table in ``jax._src.tpu_info`` (the old module forwards).
TPU_INFO_MOVED_IN = "0.11.0"


def tensorcore_mesh(axis_name: str = "core", num_cores: int | None = None) -> Any:
    """A Pallas TensorCore mesh over ``num_cores`` cores (the device's own count if None).

    The default reads ``num_cores`` of the first jax device (or of the abstract mesh's device;
    from jax 0.12.1 the chip table's entry for it); a CPU device has none, so outside a TPU or
    a simulated one pass ``num_cores``.
    """
    from jax.experimental.pallas import tpu as pltpu

    try:
        if jax_versions.at_least(TENSORCORE_MESH_CLASS_SINCE):
            if num_cores is None:
                return pltpu.TensorCoreMesh(axis_name=axis_name)  # reads jax.devices()[0]
            return pltpu.TensorCoreMesh(axis_name=axis_name, num_cores=num_cores)
        return pltpu.create_tensorcore_mesh(axis_name, num_cores=num_cores)
    except (AttributeError, ValueError) as e:
        # jax 0.11 to 0.12.0.1 read the device's num_cores (a CPU device has none); 0.12.1 asks
        # tpu_info.get_tpu_info(), which refuses an unknown device kind with a ValueError.
        no_cores = (
            e.name == "num_cores"
            if isinstance(e, AttributeError)
            else str(e).startswith("Unsupported TPU device kind")
        )
        if num_cores is not None or not no_cores:
            raise
        import jax

        raise MeshError(
            f"the default jax device ({jax.devices()[0].device_kind}) has no TensorCores",
            rule="a TensorCore mesh without num_cores spans the cores of the default device",
            fix="pass num_cores, or build the mesh on a TPU or inside coremesh.testing.simulate",
        ) from e


def tensorcore_mesh_class() -> type[Any]:
    """The class of Pallas TensorCore meshes on the installed jax (for ``isinstance``)."""
    from jax._src.pallas.mosaic import core as mosaic_core

    cls: type[Any] = mosaic_core.TensorCoreMesh
    return cls


def mesh_cores(mesh: Any) -> int:
    """How many cores a Pallas TensorCore mesh spans."""
    return int(next(iter(dict(mesh.shape).values())))


def ref_memory_space(ref: Any) -> str:
    """The memory space of a ref in a kernel body, lower-case (``"vmem"``, ``"smem"``,
    ``"any"``, ``"hbm"``, ...), or ``""`` for an object that is no jax value.

    A view (``ref.at[...]``, a ``TransformedRef``) is in the memory space of the ref it views.
    """
    import jax
    from jax._src.state.types import TransformedRef

    while isinstance(ref, TransformedRef):
        ref = ref.ref
    try:
        aval = jax.typeof(ref)
    except TypeError:
        return ""
    return str(getattr(aval, "memory_space", "")).lower()


def tpu_info_module() -> ModuleType:
    """The module whose ``registry`` and ``get_tpu_info`` jax reads the chip table from."""
    if jax_versions.at_least(TPU_INFO_MOVED_IN):
        return importlib.import_module("jax._src.tpu_info")
    return importlib.import_module("jax._src.pallas.mosaic.tpu_info")
