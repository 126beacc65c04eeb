"""``pl.semaphore_read(sem)``: a semaphore's value on the reading core.

Mosaic lowers it (``tpu.sem_read``); Pallas' TPU interpreter (jax 0.10.2 to 0.12.0.1) has no
rule for it: its fallback binds the primitive on the semaphore's id and XLA:CPU has no
lowering, so a kernel that reads a semaphore could not run (JAX's ``test_can_read_semaphore``
and ``test_can_read_dma_semaphore``).

Simulated so, as :mod:`.fetch_and_add` runs its primitive: at each jaxpr level each
``semaphore_read`` becomes ``coremesh_semaphore_read``, an interpreter impl whose jaxpr the
patch's wrapper answers with one host callback on the interpreter's token where the equation
stands (ordered after the core's signals and waits before it). The callback returns the count
the semaphore holds for the reading core. A REGULAR semaphore's count is exact on the chip and
here (another core's signal lands whenever it lands, on both).

A DMA semaphore's value while a copy on it is in flight is the chip's DMA progress, in the
chip's units; the interpreter runs a copy when its wait comes (``dma_execution_mode="on_wait"``),
so a kernel that polled for it would spin forever here. Such a read raises
:class:`SimulationFault` naming the line; an idle DMA semaphore (its copies waited for) reads 0,
as on the chip.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from coremesh.testing.sim.jaxprs import PerJaxpr, is_dma_semaphore


@dataclasses.dataclass(frozen=True, eq=False)
class _Site:
    """What the host side of one read needs from its equation (compared by identity: it rides
    in the equation's params)."""

    dma: bool
    source_info: Any


@functools.cache
def _primitive() -> Any:
    """``coremesh_semaphore_read``: ``semaphore_read`` as the interpreter's loop sees it."""
    import jax.numpy as jnp
    from jax._src import core as jax_core

    prim = jax_core.Primitive("coremesh_semaphore_read")
    prim.def_abstract_eval(lambda *args, site, args_tree: jax_core.ShapedArray((), jnp.int32))
    return prim


def _impl(*args: Any, site: _Site, args_tree: Any) -> Any:
    """The interpreter impl: the same primitive, on the interpreter's values (the semaphore's
    ids in place of the ref)."""
    return _primitive().bind(*args, site=site, args_tree=args_tree)


def _rewrite(jaxpr: Any) -> Any:
    """``jaxpr`` (this level) with each ``semaphore_read`` the patch's own primitive, or None."""
    from jax._src.pallas import primitives

    if not any(eqn.primitive is primitives.semaphore_read_p for eqn in jaxpr.eqns):
        return None
    eqns = [
        eqn.replace(
            primitive=_primitive(),
            params={
                "site": _Site(is_dma_semaphore(eqn.invars[0].aval), eqn.source_info),
                "args_tree": eqn.params["args_tree"],
            },
        )
        if eqn.primitive is primitives.semaphore_read_p
        else eqn
        for eqn in jaxpr.eqns
    ]
    return jaxpr.replace(eqns=eqns)


def _read(token: Any, device: Any, core: Any, sem_id: Any, *, site: _Site) -> tuple[Any, Any]:
    """The host side: the count semaphore ``sem_id`` holds for the reading core."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim.faults import fault_at

    sm = ipc._get_shared_memory()
    gcid = sm.get_global_core_id(int(device), int(core))
    (sem,), _ = sm.get_semaphores_and_increment_clock([int(sem_id)], gcid)
    with sem.cv:
        count = int(sem.count_by_core[gcid])
        in_flight = len(sem.tasks[gcid])
    if site.dma and (count or in_flight):
        raise fault_at(
            "pl.semaphore_read of a DMA semaphore with a copy on it in flight or not yet waited "
            "for is not simulated",
            site.source_info,
            {"device": int(device), "core": int(core)},
            operation="pl.semaphore_read",
            rule="a DMA semaphore's value before its wait is the chip's DMA progress, in the "
            "chip's units; the simulator runs a copy when its wait comes",
            fix="wait for the copy (copy.wait()) before reading its semaphore, or read a "
            "REGULAR semaphore that the kernel signals itself",
        )
    return token, np.int32(count)


def _answer(jaxpr: Any, args: Sequence[Any], ctx: Any, token: Any) -> Any:
    """Run the impl's jaxpr (one ``coremesh_semaphore_read``) as a host callback on ``token``."""
    import jax
    import jax.numpy as jnp
    from jax._src import core as jax_core
    from jax._src.state import discharge as state_discharge
    from jax.experimental import io_callback

    (eqn,) = jaxpr.eqns
    env = dict(zip([*jaxpr.constvars, *jaxpr.invars], args, strict=True))
    operands = [v.val if isinstance(v, jax_core.Literal) else env[v] for v in eqn.invars]
    sem, transforms = jax.tree.unflatten(eqn.params["args_tree"], operands)
    sem_id = state_discharge.transform_array(sem, transforms)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    token, value = io_callback(
        functools.partial(_read, site=eqn.params["site"]),
        (jax.ShapeDtypeStruct(jnp.shape(token), jnp.result_type(token)), scalar),
        token,
        ctx.device_id,
        ctx.local_core_id,
        sem_id,
    )
    return token, [value]


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation and its table of impls."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr
    rewritten = PerJaxpr(_rewrite)
    impls = {**ipc._interpret_impls, _primitive(): _impl}

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        open_jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # jax 0.12 passes an impl's ClosedJaxpr
        eqns = open_jaxpr.eqns
        if len(eqns) == 1 and eqns[0].primitive is _primitive():
            return _answer(open_jaxpr, args, ctx, token)
        done = rewritten(jaxpr)
        return orig(jaxpr if done is None else done, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr), (ipc, "_interpret_impls", impls)]


__all__: Sequence[str] = ("targets",)
