"""Masked stores (``pltpu.store(ref, x, mask=...)``) into refs whose second or later axis is
shorter than the first.

The interpreter decides whether a masked store reaches outside its buffer with
``in_bounds_mask[in_bounds_shape[i]:] = False`` for every axis ``i`` (shared_memory.py
``swap_buffer_content``, jax 0.10.2 to 0.12.0.1), which cuts the *first* axis at each axis's size.
A store into an ``(8, 2, 128)`` ref whose mask is true in row 2 or later is taken for out of
bounds and fails ("Out-of-bounds masked swap"); JAX's ``ragged_paged_attention`` stores its
softmax statistics so. Here a masked store that lies inside its buffer runs as stock runs one
(the masked elements written, the old values returned where the mask is true), under the
shared memory's lock; one that reaches outside keeps stock's handling.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _increment(sm: Any, who: Any) -> Any:
    """Increment the accessing core's vector clock and return a copy (lock held)."""
    if hasattr(sm, "incr_clock"):  # jax >= 0.11: clocks per thread
        return sm.incr_clock(who, take_lock=False)
    from jax._src.pallas.mosaic.interpret import vector_clock as vc

    vc.inc_vector_clock(sm.clocks[who], who)
    return vc.copy_vector_clock(sm.clocks[who])


def targets() -> list[tuple[Any, str, Any]]:
    """The shared memory's swap."""
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    orig = memory.SharedMemory.swap_buffer_content

    def swap_buffer_content(
        self: Any, key: Any, rnge: Any, value: Any, mask: Any, *a: Any, **kw: Any
    ) -> Any:
        if mask is None:
            return orig(self, key, rnge, value, mask, *a, **kw)
        who = a[0] if a else kw.get("thread", kw.get("global_core_id"))
        increment = a[1] if len(a) > 1 else kw.get("increment_clock", True)
        with self.lock:
            buff = self.mem[key]
            if isinstance(buff, memory.Buffer):
                try:
                    old = buff[rnge].copy()
                except IndexError:
                    old = None
                if old is not None and old.shape == value.shape:
                    clock = _increment(self, who) if self.detect_races and increment else None
                    buff.set_in_bounds_portion(rnge, np.where(mask, value, old))
                    shape = memory.ShapeAndDtype(buff.logical_shape, buff.dtype)
                    return np.where(mask, old, value), shape, clock
        return orig(self, key, rnge, value, mask, *a, **kw)

    return [(memory.SharedMemory, "swap_buffer_content", swap_buffer_content)]
