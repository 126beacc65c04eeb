"""Where the jax internals the simulator hooks differ between the supported jax lines.

:mod:`coremesh.testing.sim.patches` asks this module, never ``hasattr`` on jax itself. Public
spellings (meshes, the chip table's module) are in :mod:`coremesh.core.jax_compat`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coremesh.core import jax_versions

#: jax's first release whose TensorCore mesh is a dataclass with a default core count
#: (``TensorCoreMesh(axis_name=...)`` reads ``jax.devices()[0].num_cores``).
MESH_DATACLASS_SINCE = "0.11.0"
#: jax's first release whose ``Jaxpr`` counts as constvars only the inputs with values attached
#: (``consts=``); before it, ``Jaxpr(constvars, invars, ...)`` marks them by position.
JAXPR_CONSTS_SINCE = "0.11.0"
#: jax's first release whose ``BlockMapping`` holds its block's ref type as ``block_aval`` with no
#: ``transforms``; before it, ``transformed_block_aval`` (and ``block_aval`` a property that
#: asserts there are no transforms).
BLOCK_AVAL_FIELD_SINCE = "0.12.1"
#: jax's first release whose interpreter answers ``pl.num_programs`` in an ``emit_pipeline``
#: body over a grid sized at run time with the pipeline's size, as Mosaic does (measured: a grid
#: of 4 adds 4; 0.11 and 0.12.0.1 answer with the kernel's, 0).
PIPELINE_NUM_PROGRAMS_SINCE = "0.12.1"
#: jax's first release whose ``TransformedRef`` refuses to wrap another (a view of a view).
TRANSFORMED_REF_FLAT_SINCE = "0.12.1"


def block_aval_field() -> str:
    """The name of the ``BlockMapping`` field holding the block's ref type (for ``replace``)."""
    return (
        "block_aval" if jax_versions.at_least(BLOCK_AVAL_FIELD_SINCE) else "transformed_block_aval"
    )


def pipeline_answers_num_programs() -> bool:
    """Does the installed jax's interpreter give an emit_pipeline body its own grid size?"""
    return jax_versions.at_least(PIPELINE_NUM_PROGRAMS_SINCE)


def transformed_ref_refuses_nesting() -> bool:
    """Does ``TransformedRef(TransformedRef(...), ...)`` raise on the installed jax?"""
    return jax_versions.at_least(TRANSFORMED_REF_FLAT_SINCE)


def block_aval(bm: Any) -> Any:
    """The ref type of a ``BlockMapping``'s block, as the kernel sees it."""
    return getattr(bm, block_aval_field())


def block_transforms(bm: Any) -> tuple[Any, ...]:
    """A ``BlockMapping``'s transforms (none from jax 0.12.1, which dropped the field)."""
    return tuple(getattr(bm, "transforms", ()))


def closed_jaxpr_class() -> Any:
    """jax's ``ClosedJaxpr`` where it is a class of its own (jax 0.10), else None: from 0.11 a
    ``Jaxpr`` carries its consts, and 0.11 keeps ``ClosedJaxpr`` as an alias of ``Jaxpr``
    (whose ``.jaxpr`` is itself), which 0.12 drops."""
    from jax._src import core as jax_core

    closed = getattr(jax_core, "ClosedJaxpr", None)
    return None if closed is None or closed is jax_core.Jaxpr else closed


def with_consts(jaxpr: Any, consts: Sequence[Any]) -> Any:
    """A jaxpr just traced (``pe.trace_to_jaxpr_dynamic``) with its ``consts`` attached, as a
    primitive whose operands start with them takes it (``run_scoped``): from jax 0.11 the trace
    returns them as leading invars and a ``Jaxpr`` carries their values; jax 0.10 returns them
    as constvars, bound by the caller."""
    if closed_jaxpr_class() is not None or not consts:
        return jaxpr
    return jaxpr.with_consts(list(consts))


def tensorcore_cores(mesh: Any) -> tuple[str, int] | None:
    """(axis name, cores) of a one-axis ``TensorCoreMesh``; None for any other mesh. jax 0.10's
    mesh has no ``num_cores``: its shape says it on every line."""
    if type(mesh).__name__ != "TensorCoreMesh":
        return None
    shape = dict(mesh.shape)
    if len(shape) != 1:
        return None
    ((axis, cores),) = shape.items()
    return str(axis), int(cores)


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


def open_jaxpr(
    constvars: list[Any],
    invars: list[Any],
    outvars: list[Any],
    eqns: list[Any],
    effects: Any,
    debug_info: Any,
) -> Any:
    """A ``Jaxpr`` whose ``constvars`` and ``invars`` read back as given, as the body of a
    ``run_scoped`` needs them (its operands bind the constvars). From jax 0.11 the constvars
    need attached values: their avals stand in, as no interpreter reads them (upstream's own
    ``run_scoped`` bodies carry its tracing's stale tracers there)."""
    from jax._src import core as jax_core

    if not jax_versions.at_least(JAXPR_CONSTS_SINCE):
        return jax_core.Jaxpr(constvars, invars, outvars, eqns, effects, debug_info)
    return jax_core.Jaxpr(
        constvars,
        invars,
        outvars,
        eqns,
        effects,
        debug_info,
        consts=[v.aval for v in constvars],
    )
