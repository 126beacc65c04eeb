"""The tags a DMA's source info carries to the interpreter's DMA callbacks.

The interpreter hands each ``dma_start`` equation's source info to the ``DMA`` object it makes
(interpret_pallas_call.py ``dma_start``: ``source_info=``), and the callbacks see buffer and
semaphore ids only. What the kernel's jaxpr says about a DMA travels there as a
:class:`DmaSource` in place of the equation's source info: which of its semaphores are regular
(:mod:`.regular_dma`), whether it adds to its destination (:mod:`.dma_add`). One class for both
tags, so a DMA that has both keeps both.
"""

from __future__ import annotations

from typing import Any

from jax._src import source_info_util


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
