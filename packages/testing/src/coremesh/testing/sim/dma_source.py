"""The tags a DMA's source info carries to the interpreter's DMA callbacks.

The interpreter hands each ``dma_start`` equation's source info to the ``DMA`` object it makes
(interpret_pallas_call.py ``dma_start``: ``source_info=``), and the callbacks see buffer and
semaphore ids only. What the kernel's jaxpr says about a DMA travels there as a
:class:`DmaSource` in place of the equation's source info: which of its semaphores are regular
(:mod:`.regular_dma`), whether it adds to its destination (:mod:`.dma_add`). One class for both
tags, so a DMA that has both keeps both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jax._src import source_info_util

from coremesh.testing.sim.jaxprs import PerJaxpr


class DmaSource(source_info_util.SourceInfo):  # type: ignore[misc]
    """A DMA's source info with its tags: ``regular`` (send, receive) and ``add``."""

    __slots__ = ("add", "regular")

    def __init__(
        self, info: Any, *, regular: tuple[bool, bool] = (False, False), add: bool = False
    ) -> None:
        super().__init__(info.traceback, info.name_stack)
        self.regular = regular
        self.add = add


def retagged(info: Any, **tags: Any) -> DmaSource:
    """``info`` with ``tags`` set, keeping the tags it already carries."""
    if isinstance(info, DmaSource):
        kept: dict[str, Any] = {"regular": info.regular, "add": info.add}
        return DmaSource(info, **(kept | tags))
    return DmaSource(info, **tags)


def tagged_dmas(jaxpr: Any, tags_of: Callable[[Any], dict[str, Any] | None]) -> Any | None:
    """``jaxpr`` (this level: the interpreter reaches nested ones itself) with each
    ``dma_start`` equation's source info carrying ``tags_of(eqn)`` (None or empty: none), or
    None when no equation's tags change."""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        tags = tags_of(eqn) if eqn.primitive is mosaic_primitives.dma_start_p else None
        if tags and any(getattr(eqn.source_info, k, None) != v for k, v in tags.items()):
            eqns.append(eqn.replace(source_info=retagged(eqn.source_info, **tags)))
            changed = True
        else:
            eqns.append(eqn)
    return jaxpr.replace(eqns=eqns) if changed else None


def tagging_target(tags_of: Callable[[Any], dict[str, Any] | None]) -> tuple[Any, str, Any]:
    """The interpreter's per-level jaxpr evaluation, running each level with its DMAs tagged by
    ``tags_of`` (each level tagged once)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr
    tagged = PerJaxpr(lambda jaxpr: tagged_dmas(jaxpr, tags_of))

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        done = tagged(jaxpr)
        return orig(jaxpr if done is None else done, *args, ctx=ctx, token=token)

    return (ipc, "_interpret_jaxpr", interpret_jaxpr)
