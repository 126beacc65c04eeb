"""A DMA that signals a regular semaphore adds one to it.

Mosaic lets a DMA signal a REGULAR semaphore (``pltpu.SemaphoreType.REGULAR`` as its send or
receive semaphore, TPU v6 and later): the DMA increments it by 1 when it completes (jax commits
ace7a79040 "Allow non-DMA semaphores in EnqueueDMA" and 8b31887d81, the same for the source
semaphore), and the kernel waits with ``pl.semaphore_wait(sem, 1)``: ``dma_wait`` refuses a
regular semaphore (primitives.py ``_dma_wait_abstract_eval``). The interpreter signals every DMA
semaphore with the bytes moved (interpret_pallas_call.py ``DMA.execute_read`` /
``execute_write`` signal ``data_size``; still so in jax's main of August 2026), so such a kernel
ends with the semaphore at its bytes - 1 (4095 after an (8, 128) float32 copy).

The callbacks get semaphore ids only; which kind a semaphore is, the kernel's jaxpr says. Each
jaxpr level the interpreter runs has its ``dma_start`` equations' source info replaced by a
:class:`~.dma_source.DmaSource` naming the regular sides; the interpreter hands it to the
``DMA`` it makes, whose ``data_size`` is then 1 for those signals.
"""

from __future__ import annotations

from typing import Any

from coremesh.testing.sim.dma_source import tagging_target


def _is_regular(sem: Any) -> bool:
    import jax
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    if sem is None:
        return False
    ref, _ = mosaic_primitives._get_ref_and_transforms(sem)
    dtype = getattr(getattr(ref, "aval", None), "dtype", None)
    return dtype is not None and bool(jax.dtypes.issubdtype(dtype, pallas_core.semaphore))


def regular_sides(eqn: Any) -> tuple[bool, bool]:
    """Which of a ``dma_start`` equation's semaphores are regular: (send, receive)."""
    _src, _dst, dst_sem, src_sem, _device = eqn.params["tree"].unflatten(eqn.invars)
    return _is_regular(src_sem), _is_regular(dst_sem)


def _tags(eqn: Any) -> dict[str, Any] | None:
    sides = regular_sides(eqn)
    return {"regular": sides} if any(sides) else None


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig_size = ipc.DMA.data_size.fget
    started, read = ipc.DmaState.STARTED, ipc.DmaState.READ

    def data_size(self: Any) -> int:
        # execute_read signals the send semaphore before the DMA leaves STARTED, execute_write
        # the receive semaphore before it leaves READ (interpret_pallas_call.py DMA).
        regular = getattr(self.source_info, "regular", None)
        if regular is not None:
            send, receive = regular
            if (send and self.state == started) or (receive and self.state == read):
                return 1
        return int(orig_size(self))

    return [tagging_target(_tags), (ipc.DMA, "data_size", property(data_size))]
