"""Each core of a SparseCore mesh has its own scratch semaphores.

The simulator runs the cores (or subcores) of a SparseCore kernel one after the other as the grid
steps of one interpreter core (patch ``sparsecore_axes``). The interpreter allocates a kernel's
scratch once for all its grid steps (interpret_pallas_call.py, the kernel's buffers before the
grid loop), so every core's ``scratch_types`` semaphore was one and the same: a copy another
device sent to core 1 satisfied core 0's wait for its own copy (a DMA semaphore counts bytes and
the copies were the same size), and core 0 read the destination before its copy landed. On the
chip each core signals and waits its own semaphore.

Here each scratch semaphore is allocated with one element per grid step (leading axes the
grid's), and the kernel body starts by taking the element of the step it runs: in the
interpreter a semaphore is an array of ids, which jax operations index. A copy to another device
names its semaphores by those ids, which are the same core's there, as on the chip. Semaphores a
``run_scoped`` allocates are allocated per step already.
"""

from __future__ import annotations

from typing import Any

from coremesh.testing.sim import inline
from coremesh.testing.sim.jaxprs import is_semaphore


def per_core(jaxpr: Any, grid_mapping: Any) -> tuple[Any, Any] | None:
    """``(jaxpr, grid_mapping)`` with one element per grid step of each scratch semaphore, or
    ``None`` when the kernel has one step or no scratch semaphore."""
    import jax
    import jax.numpy as jnp
    from jax._src import core as jax_core

    gm = grid_mapping
    steps = inline.kernel_steps(gm)
    n = gm.num_scratch_operands
    if not n or steps is None or steps == 1:
        return None
    first = len(jaxpr.invars) - n
    picked = [i for i in range(first, len(jaxpr.invars)) if is_semaphore(jaxpr.invars[i].aval)]
    grid, names = tuple(gm.grid), tuple(gm.grid_names or ())
    if not picked or len(names) != len(grid):
        return None

    def widened(aval: Any) -> Any:
        return aval.update(inner_aval=aval.inner_aval.update(shape=(*grid, *aval.shape)))

    def select(*ids: Any) -> list[Any]:
        step = tuple(jax.lax.axis_index(name) for name in names)
        return [i[step] for i in ids]

    narrow = [jaxpr.invars[i] for i in picked]
    ids = [jax_core.ShapedArray((*grid, *v.aval.shape), jnp.int16) for v in narrow]
    pick = inline.retrace_kernel(gm, select, ids)
    wide = [jax_core.Var(widened(v.aval)) for v in narrow]
    rename: dict[Any, Any] = dict(zip(pick.invars, wide, strict=True))
    for out, v in zip(pick.outvars, narrow, strict=True):
        if out in rename or not isinstance(out, jax_core.Var) or out in pick.invars:
            return None  # an id array taken whole (never for a step of a grid)
        rename[out] = v

    def sub(atom: Any) -> Any:
        return atom if isinstance(atom, jax_core.Literal) else rename.get(atom, atom)

    head = [
        e.replace(invars=[sub(v) for v in e.invars], outvars=[sub(v) for v in e.outvars])
        for e in pick.eqns
    ]
    invars = list(jaxpr.invars)
    for i, v in zip(picked, wide, strict=True):
        invars[i] = v
    new_jaxpr = jaxpr.replace(invars=invars, eqns=[*head, *jaxpr.eqns])
    scratch = list(gm.scratch_avals)
    for i, v in zip(picked, wide, strict=True):
        scratch[i - first] = v.aval
    return new_jaxpr, gm.replace(scratch_avals=tuple(scratch))
