"""``pl.semaphore_read(sem)``: a semaphore's value on the reading core.

Mosaic lowers it (``tpu.sem_read``); Pallas' TPU interpreter (jax 0.10.2 to 0.12.0.1) has no
rule for it: its fallback binds the primitive on the semaphore's id and XLA:CPU has no
lowering, so a kernel that reads a semaphore could not run (JAX's ``test_can_read_semaphore``
and ``test_can_read_dma_semaphore``).

Simulated so: at each jaxpr level each ``semaphore_read`` becomes ``coremesh_semaphore_read``,
answered by one host callback on the core's token where it stands (:mod:`.host_primitives`),
ordered after the core's signals and waits before it. The callback returns the count
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

from coremesh.testing.sim import host_primitives
from coremesh.testing.sim.jaxprs import is_dma_semaphore


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


def _params(eqn: Any) -> dict[str, Any]:
    return {
        "site": _Site(is_dma_semaphore(eqn.invars[0].aval), eqn.source_info),
        "args_tree": eqn.params["args_tree"],
    }


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
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.state import discharge as state_discharge
    from jax.experimental import io_callback

    (eqn,) = jaxpr.eqns
    operands = host_primitives.operands(jaxpr, args)
    sem, transforms = jax.tree.unflatten(eqn.params["args_tree"], operands)
    sem_id = state_discharge.transform_array(sem, transforms)
    token, value = io_callback(
        functools.partial(_read, site=eqn.params["site"]),
        (ipc.TOKEN_SHAPE_DTYPE, jax.ShapeDtypeStruct((), jnp.int32)),
        token,
        ctx.device_id,
        ctx.local_core_id,
        sem_id,
    )
    return token, [value]


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation and its table of impls."""
    from jax._src.pallas import primitives

    return host_primitives.targets(primitives.semaphore_read_p, _primitive(), _params, _answer)


__all__: Sequence[str] = ("targets",)
