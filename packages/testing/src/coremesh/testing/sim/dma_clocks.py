"""Vector-clock entries for DMAs under ``races=True``: one of their own for each DMA in flight.

The race detector orders accesses by vector clocks. A DMA is a thread of its own, so it needs
an entry of its own; the interpreter instead draws each DMA's entry at random from the spare
entries past the cores' (``vector_clock_size - cores``, as many as the cores by default:
shared_memory.py ``get_random_virtual_device_id``). Two DMAs that draw the same entry look
ordered, and so does everything after the later one: a race between them, or between the earlier
one and an access that follows the later, goes unreported. On a 1-core chip there is one spare
entry, so two DMAs in flight into one buffer are never reported; in the reduce-scatter ring with
one receive slot, a device that ran a step ahead hid its overwrite in about 1 run in 16 under load.

Here the clocks get :data:`DMA_ENTRIES` spare entries, handed out in turn, so two DMAs share one
only if :data:`DMA_ENTRIES` others started between them. A call that sets its own
``vector_clock_size`` keeps it.
"""

from __future__ import annotations

import itertools
from typing import Any

#: Spare vector-clock entries for DMAs. A clock is copied at each checked access, so its size
#: is a cost per access; this many keeps a copy at a few microseconds.
DMA_ENTRIES = 1024

_COUNTER = "_coremesh_dma_entry"


def targets() -> list[tuple[Any, str, Any]]:
    """The default clock size and the per-DMA entry of the interpreter's shared memory."""
    from jax._src.pallas.mosaic.interpret import shared_memory as memory
    from jax._src.pallas.mosaic.interpret.params import InterpretParams

    orig_size = InterpretParams.get_vector_clock_size

    def get_vector_clock_size(self: Any, num_devices: Any) -> int:
        if self.vector_clock_size is not None:
            return int(orig_size(self, num_devices))
        return int(num_devices) * int(self.num_cores_or_threads) + DMA_ENTRIES

    def get_random_virtual_device_id(self: Any) -> int:
        # next() of an itertools.count is atomic under the GIL; setdefault creates it once.
        turn = next(self.__dict__.setdefault(_COUNTER, itertools.count()))
        return int(self.num_cores + turn % (self.vector_clock_size - self.num_cores))

    return [
        (InterpretParams, "get_vector_clock_size", get_vector_clock_size),
        (memory.SharedMemory, "get_random_virtual_device_id", get_random_virtual_device_id),
    ]
