"""A DMA with ``add=True`` adds to its destination.

``pltpu.sync_copy(src, dst.at[idx_ref], add=True)`` (and ``async_copy``) makes the DMA engine
add what it moves to the destination's elements. The interpreter ignores the ``add`` param of
``dma_start`` (interpret_pallas_call.py ``dma_start`` never reads it, jax 0.10.2 to 0.12.0.1) and
overwrites the destination.

Each jaxpr level the interpreter runs has its adding ``dma_start`` equations' source info
replaced by a :class:`~.dma_source.DmaSource` with ``add`` set; the interpreter hands it to the
``DMA`` it makes, whose write (``DMA.execute_write`` -> ``store`` ->
``SharedMemory.store_buffer_content``, with the DMA's source info in its ``logging_info``) then
stores ``current + value`` in the destination's dtype. The current elements are read raw from
the buffer: the interpreter's ``get`` would count the read as the DMA reading its own pending
destination (``shadow``); elements nothing wrote are named as a read of unwritten memory
instead. One lock around each read and write makes concurrent adds (subcores on threads, patch
``subcore_barrier``, into one VMEM_SHARED buffer) atomic, as the chip's are.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from coremesh.testing.sim.dma_source import tagging_target

#: Held across each adding write's read and store: the DMA engine adds atomically.
_LOCK = threading.Lock()


def _tags(eqn: Any) -> dict[str, Any] | None:
    return {"add": True} if eqn.params.get("add") else None


def _adds(logging_info: Any) -> bool:
    """Is this store the write of a DMA with ``add=True``?"""
    return bool(getattr(getattr(logging_info, "source_info", None), "add", False))


def _sum(buffer: Any, rnge: Any, value: Any) -> Any | None:
    """``buffer[rnge] + value`` in the buffer's dtype, or None where the write is not wholly in
    bounds (the interpreter's own store then reports it)."""
    try:
        current = buffer[rnge]
    except IndexError:
        return None
    value = np.asarray(value)
    if current.shape != value.shape:
        return None  # partly out of bounds: Buffer.__getitem__ clipped the range
    return np.add(current, value).astype(value.dtype, copy=False)


def _unwritten_destination(sm: Any, key: Any, rnge: Any, info: Any) -> Exception | None:
    """An add reads its destination: elements nothing wrote (or a DMA in flight has not yet)
    are a read of unwritten memory, which the shadow names (patch ``uninitialized_reads``)."""
    from coremesh.testing.sim import faults, shadow
    from coremesh.testing.sim.chip import current_name
    from coremesh.testing.sim.errors import UninitializedReadError

    written = sm.__dict__.get(shadow._ATTR, {}).get(key)
    if written is None:
        return None
    try:
        view = written[tuple(rnge)]
    except Exception:  # out of bounds: the interpreter's own store reports it
        return None
    unwritten = (view == shadow.UNWRITTEN) | (view == shadow.PENDING)
    if not unwritten.any():
        return None
    source_info = getattr(info, "source_info", None)
    kernel, _ = faults.kernel_of(source_info)
    location = faults.user_location(source_info)
    device, core = int(getattr(info, "device_id", key[2])), int(getattr(info, "local_core_id", 0))
    buffer, index = shadow._buffer_text(sm, key), shadow._range_text(rnge)
    first = tuple(int(i) for i in np.argwhere(unwritten)[0]) if view.ndim else ()
    operation = "a DMA with add=True into unwritten memory"
    return UninitializedReadError(
        f"{operation} on device {device}, core {core}"
        + (f" in kernel {kernel!r}" if kernel else "")
        + (f" at {location}" if location else "")
        + f": buffer {buffer}, range {index}: {int(unwritten.sum())} of {view.size} "
        "element(s) not written yet" + (f", the first at {first} of the range" if first else ""),
        device=device,
        core=core,
        kernel=kernel,
        location=location,
        operation=operation,
        buffer=buffer,
        index=index,
        rule=shadow.RULE,
        chip=current_name(),
        fix="write the destination (copy or store its first value) before adding to it"
        + shadow.TURN_OFF,
    )


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    orig_store = memory.SharedMemory.store_buffer_content

    def store_buffer_content(self: Any, key: Any, rnge: Any, value: Any, *a: Any, **kw: Any) -> Any:
        if not _adds(kw.get("logging_info")):
            return orig_store(self, key, rnge, value, *a, **kw)
        with _LOCK:
            unwritten = _unwritten_destination(self, key, rnge, kw.get("logging_info"))
            if unwritten is not None:
                raise unwritten
            buffer = self.mem.get(key)
            total = _sum(buffer, rnge, value) if isinstance(buffer, memory.Buffer) else None
            return orig_store(self, key, rnge, value if total is None else total, *a, **kw)

    return [
        tagging_target(_tags),
        (memory.SharedMemory, "store_buffer_content", store_buffer_content),
    ]
