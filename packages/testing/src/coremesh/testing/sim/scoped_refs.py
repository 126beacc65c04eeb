"""``jax.empty_ref`` inside a kernel, run as the scoped allocation Mosaic makes of it.

Mosaic lowers an ``empty_ref`` in a kernel body to a buffer (or semaphore) allocated for the rest
of the enclosing region (``_empty_ref_lowering_rule``: ``memref.alloca`` / ``tpu.sem_alloc``). The
interpreter has no rule for it: it binds the primitive as it is, so the kernel's traced program
holds a JAX-level mutable array, and the program fails when it is compiled (a core of a
``core_map`` / ``pl.kernel``: "No state discharge rule implemented for primitive: io_callback",
raised inside a host callback, so the caller sees only XLA's ``CpuCallback error``).

:func:`rewrite` turns ``ref = empty_ref[...]; rest`` into ``run_scoped(lambda ref: rest)``, which
the interpreter allocates, tracks and frees as it does ``pl.run_scoped`` scratch: the same buffer
for the same region. The rest of the body may hold further ``empty_ref``\\ s; the interpreter
interprets the new ``run_scoped`` body through :func:`rewrite` again.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from jax._src import core as jax_core
from jax._src import effects
from jax._src.interpreters import partial_eval as pe

from coremesh.testing.sim import compat

_lock = threading.Lock()
#: jaxpr -> its rewrite (None: nothing to rewrite); jaxprs are immutable and traced once each.
_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _scoped(eqn: Any) -> bool:
    """An ``empty_ref`` the interpreter can allocate as run_scoped scratch (VMEM, SMEM,
    semaphores: not HBM / ANY, which run_scoped refuses to allocate)."""
    if eqn.primitive is not jax_core.empty_ref_p:
        return False
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    space = eqn.params.get("memory_space")
    return space is not None and ipc._forward_any_to_hbm(space) is not ipc._HBM


def rewrite(jaxpr: Any) -> Any | None:
    """``jaxpr`` with its first scoped ``empty_ref`` and the equations after it as one
    ``run_scoped``; None if it has none. The new jaxpr takes the same arguments."""
    with _lock:
        if jaxpr in _cache:
            return _cache[jaxpr]
    index = next((i for i, e in enumerate(jaxpr.eqns) if _scoped(e)), None)
    result = None if index is None else _split(jaxpr, index)
    with _lock:
        _cache[jaxpr] = result
    return result


def _split(jaxpr: Any, index: int) -> Any:
    from jax._src.pallas import primitives

    alloc, rest = jaxpr.eqns[index], jaxpr.eqns[index + 1 :]
    [ref] = alloc.outvars
    # What the rest reads from before it: the run_scoped body closes over those.
    made = {ref, *(v for e in rest for v in e.outvars)}
    captured: dict[Any, None] = {}
    for atom in [v for e in rest for v in e.invars] + list(jaxpr.outvars):
        if isinstance(atom, jax_core.Var) and atom not in made:
            captured[atom] = None
    constvars = list(captured)
    outvars = list(jaxpr.outvars)
    body = compat.open_jaxpr(
        constvars,
        [ref],
        outvars,
        rest,
        pe.make_jaxpr_effects(constvars, [ref], outvars, rest),
        jaxpr.debug_info.with_unknown_names(),
    )
    results = [jax_core.Var(v.aval) for v in outvars]
    scoped = jax_core.new_jaxpr_eqn(
        constvars,
        results,
        primitives.run_scoped_p,
        {"jaxpr": body, "collective_axes": (), "ref_transforms": ((),)},
        {e for e in body.effects if not isinstance(e, effects.JaxprInputEffect)},
        alloc.source_info,
    )
    return jaxpr.replace(outvars=results, eqns=[*jaxpr.eqns[:index], scoped])


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        new = rewrite(jaxpr)
        return orig(jaxpr if new is None else new, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]
