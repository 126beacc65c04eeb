"""Reads of memory nobody wrote are caught (a shadow "written" map per buffer, with origins).

Stock interpret mode fills fresh buffers with NaN (or the largest integer) and lets a kernel
read them: a load before the store, or a DMA started before the DMA that fills its source was
waited for, gives a silently wrong result. On the chip those bytes are whatever the memory held.
As in MemorySanitizer, every buffer allocated *uninitialized* gets a boolean map of the elements
written so far:

* uninitialized: ``run_scoped`` scratch, scratch operands, kernel outputs (not aliased to an
  input), and the pipeline's VMEM blocks; kernel inputs, scalar-prefetch operands and aliased
  outputs are written (they get no map at all), but for the padding of their last tiles
  (``buffer_bounds="padded"``), which starts unwritten;
* a kernel's store, a masked store (its mask), a DMA's write and the pipeline's copy of a block
  mark elements written; an output block starts unwritten again for each new block (the buffer
  then holds a stale block on the chip).

Like MemorySanitizer, a read of unwritten bytes is reported where it is *used*, since correct
kernels read them and throw them away (JAX's megablox gmm merges ``select(mask, acc, out[...])``
into a block it has not written yet), and a copy is not a use: a DMA takes the states of its
source to its destination (JAX's ``test_compute_slice_bounded_slice_vmem`` copies a partly
written VMEM buffer whole to its output and checks only the rows it wrote), and so does a store
whose value is a load moved unchanged (``o_ref[...] = acc_ref[...].astype(...)``, through casts,
reshapes, transposes, slices and broadcasts: :mod:`coremesh.testing.sim.copies` finds those in
the jaxpr), element for element; unwritten or computed elements it copies get the tagged NaN
back in their new place (a cast to bfloat16 drops it). What a DMA must not
read is memory that a DMA in flight has yet to write: from its start to its completion a DMA's
destination elements are *pending*, and a DMA reading one raises at once (the data is whichever
of old and new bytes the chip has by then: a missing wait, or one satisfied by another DMA).
A floating-point element nobody wrote holds a NaN with a payload of its own (kept through
arithmetic, selects and casts, with either sign); a store of that NaN marks the element as
computed from unwritten memory, so the taint follows the data through memory and DMAs, and the
first load of unwritten memory is remembered as its origin. The error comes when the result is
read back: an output element computed from unwritten memory raises
:class:`UninitializedReadError` naming the element, the kernel and the origin (line, buffer,
range); one never written holds the fill, as in stock (callers may ignore what a kernel leaves).
Integer and bool loads have no NaN to carry the taint, and usually feed an address or a branch:
they raise at the load, as does a float load when ``uninitialized_memory="zero"``. A DMA that
reads pending memory raises naming its semaphores, the last wait on each and the DMA that last
signalled it. An operation that makes a NaN of its own (``exp``, ``max``) drops the payload:
the result then shows a NaN.

Which buffers start unwritten is known at trace time only (the interpreter allocates both kinds
with one callback): ``get_uninitialized_array`` results, and their padded forms, are remembered,
and an allocation callback staged with one of them runs with a flag the allocation reads.
The maps live on the interpreter's ``SharedMemory`` object, so they go with it.
``simulate(check_uninitialized=False)`` leaves all of this out.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from coremesh.testing.sim import copies, faults
from coremesh.testing.sim.chip import current_name
from coremesh.testing.sim.copies import LoadSource, StoreSource
from coremesh.testing.sim.deadlock import semaphore_description
from coremesh.testing.sim.errors import UninitializedReadError

_ATTR = "_coremesh_written"
#: On the SharedMemory too: per semaphore id, ("wait" | "signal") -> the last completed wait on
#: it and the DMA that last signalled it, as text, for the DMA case's message.
_NOTES = "_coremesh_semaphore_notes"
#: On the SharedMemory: where the run first read unwritten memory (``_read_parts``' dict).
_ORIGIN = "_coremesh_first_unwritten_read"
#: On the SharedMemory: per (device, core), the map of the output block being copied to HBM.
_BLOCKS = "_coremesh_block_states"
_tls = threading.local()
#: States of an element in a shadow map: never written, written, written with a value computed
#: from unwritten memory (a store of the tainted NaN), and not yet written by a DMA that has
#: started to write it (its data has not landed: the wait on its semaphore comes first).
UNWRITTEN, WRITTEN, DERIVED, PENDING = np.uint8(0), np.uint8(1), np.uint8(2), np.uint8(3)

# ---------------------------------------------------------------------- trace time: which values
_MAX_TRACKED = 4096
_tracked_lock = threading.Lock()
#: id(value) -> value, for values made by get_uninitialized_array (kept alive so ids stay unique)
_tracked: collections.OrderedDict[int, Any] = collections.OrderedDict()


def _track(value: Any) -> Any:
    with _tracked_lock:
        _tracked[id(value)] = value
        while len(_tracked) > _MAX_TRACKED:
            _tracked.popitem(last=False)
    return value


def _is_tracked(value: Any) -> bool:
    hit = _tracked.get(id(value))
    return hit is not None and hit is value


def forget() -> None:
    """Drop what tracing remembered (on leaving the simulator)."""
    with _tracked_lock:
        _tracked.clear()


class _CallbackModule:
    """``interpret_pallas_call``'s view of ``jax._src.callback``: an allocation staged with an
    uninitialized value runs with the unwritten flag."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def io_callback(self, f: Any, result_shape: Any, *args: Any, **kw: Any) -> Any:
        inner = getattr(f, "func", f)
        if (
            getattr(_tls, "tracking", True)
            and getattr(inner, "__name__", None) == "_allocate_buffer"
            and len(args) >= 5
            and _is_tracked(args[4])
            and not _poisoned_scope(f)
        ):
            f = functools.partial(_allocate_unwritten, f)
        return self._module.io_callback(f, result_shape, *args, **kw)


def _poisoned_scope(allocate: Any) -> bool:
    """A ``run_scoped`` buffer (the only allocation the interpreter stages with its equation's
    source info) under ``jax_pallas_poison_buffers``: Mosaic stores the poison into it as it
    allocates it (lowering.py ``_alloc_value`` -> ``_poison_memref``), so it is written memory
    holding NaN, True or the smallest integer (patch ``poison_buffers``), not unwritten memory.
    JAX's test_poison_buffers reads it back."""
    from jax._src.pallas import core as pallas_core

    keywords = getattr(allocate, "keywords", None) or {}
    return keywords.get("source_info") is not None and bool(pallas_core.poison_buffers_enabled())


def _allocate_unwritten(allocate: Any, *args: Any, **kw: Any) -> Any:
    _tls.unwritten = True
    try:
        return allocate(*args, **kw)
    finally:
        _tls.unwritten = False


# ---------------------------------------------------------------------- run time: the maps


def _maps(sm: Any) -> dict[Any, np.ndarray]:
    maps = sm.__dict__.get(_ATTR)
    if maps is None:
        maps = sm.__dict__.setdefault(_ATTR, {})
    return maps  # type: ignore[no-any-return]


def _note(sem: Any, core: int, kind: str, text: Callable[[], str]) -> None:
    """Remember the last wait or signal of ``sem``; ``text`` is formatted only for a message
    (every DMA and wait notes one, so formatting each would cost more than the check)."""
    sm = sem.shared_memory
    notes = sm.__dict__.get(_NOTES)
    if notes is None:
        notes = sm.__dict__.setdefault(_NOTES, {})
    notes[(sem.id, core, kind)] = text  # a semaphore object serves every core of every device


def _view(written: np.ndarray, rnge: Any) -> np.ndarray | None:
    try:
        view: np.ndarray = written[tuple(rnge)]
    except Exception:  # a range the interpreter itself rejects: its own error stands
        return None
    return view


#: (file name suffix, functions) of the rewrites whose whole-ref reads keep only what was
#: written: a SparseCore gather or scatter (coremesh's), and Mosaic's closed-over scalar on a
#: vector subcore (jax's rewrite, traced under ``closed_scalars``: one lane written, all read,
#: lane 0 kept).
_RULES = (
    ("sparsecore.py", ("_scatter",)),
    ("closed_scalars.py", ("fallback_lowering",)),
)


#: The name scope a rewrite rule puts its whole-ref reads in (a rule traced inside a level the
#: interpreter traces gets the user's traceback, and jax keeps 10 frames: not enough to say).
WHOLE_REF_READ_SCOPE = "coremesh_whole_ref_read"


def _from_rule(source_info: Any) -> bool:
    """Is this read the whole-ref read of one of the rewrites in ``_RULES``?"""
    if WHOLE_REF_READ_SCOPE in str(getattr(source_info, "name_stack", "")):
        return True
    frames = getattr(getattr(source_info, "traceback", None), "frames", ())
    return any(
        f.file_name.endswith(suffix) and f.function_name.rsplit(".", 1)[-1] in names
        for f in frames
        for suffix, names in _RULES
    )


#: The taint: a NaN whose 7 mantissa bits after the exponent are 1100101 (quiet, then 0x25).
#: The low bits are free, so widening and narrowing float conversions keep it.
_TAG = 0x65


@functools.cache
def taint_layout(dtype: np.dtype[Any]) -> tuple[type[Any], int, int, int] | None:
    """(unsigned view type, exponent mask, tag mask, tag) of a float dtype; None for the dtypes
    whose NaNs cannot carry it (integers, bools, 8-bit floats)."""
    if dtype.kind != "f" and "float" not in dtype.name:
        return None
    try:
        nmant = int(np.finfo(dtype).nmant)
    except Exception:
        import ml_dtypes

        nmant = int(ml_dtypes.finfo(dtype).nmant)  # type: ignore[no-untyped-call]
    if nmant < 7:
        return None
    bits = dtype.itemsize * 8
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}.get(dtype.itemsize)
    if view is None:
        return None
    exponent = ((1 << (bits - 1)) - 1) & ~((1 << nmant) - 1)
    shift = nmant - 7
    return view, exponent, 0x7F << shift, _TAG << shift


def tagged(bits: Any, layout: tuple[type[Any], int, int, int]) -> Any:
    """Which of ``bits`` (a float array viewed as ``layout``'s unsigned type, numpy or traced)
    carry the taint."""
    view, exponent, tag_mask, tag = layout
    return ((bits & view(exponent)) == view(exponent)) & ((bits & view(tag_mask)) == view(tag))


def tainted_nan(layout: tuple[type[Any], int, int, int]) -> Any:
    """The bits of the tagged NaN that fresh float memory holds."""
    view, exponent, _, tag = layout
    return view(exponent | tag)


def _tainted(values: np.ndarray) -> np.ndarray | None:
    """Which elements of ``values`` carry the taint (None: the dtype cannot carry it)."""
    layout = taint_layout(values.dtype)
    if layout is None:
        return None
    hit: np.ndarray = tagged(np.ascontiguousarray(values).view(layout[0]), layout)
    return hit


def _poison(content: np.ndarray, where: Any = ...) -> bool:
    """Fill a fresh float buffer (the elements ``where`` picks) with the tainted NaN; False if
    its dtype cannot carry it."""
    layout = taint_layout(content.dtype)
    if layout is None:
        return False
    content.view(layout[0])[where] = tainted_nan(layout)
    return True


def _unwritten_padding(sm: Any, key: Any) -> None:
    """A written buffer allocated past its shape (``buffer_bounds="padded"``: the rest of its
    last tiles) gets a map: its own elements written, the padding not, and holding the tagged
    NaN, so a kernel that uses what a DMA brought from the padding is told so."""
    buffer = sm.mem[key]
    logical = tuple(getattr(buffer, "logical_shape", buffer.shape))
    if logical == tuple(buffer.shape):
        return
    states = np.zeros(buffer.shape, np.uint8)
    states[tuple(slice(0, n) for n in logical)] = WRITTEN
    _maps(sm)[key] = states
    if sm.uninitialized_memory == "nan":
        _poison(buffer.content, states == UNWRITTEN)


def _origin(sm: Any) -> dict[str, Any] | None:
    return sm.__dict__.get(_ORIGIN)  # type: ignore[no-any-return]


def targets() -> list[tuple[Any, str, Any]]:
    """The allocation, read, write and DMA hooks (module and class attributes to swap)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    sm_cls = memory.SharedMemory
    orig_alloc, orig_dealloc = sm_cls.allocate_buffer, sm_cls.deallocate_buffer
    orig_get, orig_store = sm_cls.get_buffer_content, sm_cls.store_buffer_content
    orig_swap = sm_cls.swap_buffer_content
    utils = ipc.interpret_utils
    orig_uninit, orig_pad = utils.get_uninitialized_array, utils.pad_to_block_dimension

    def get_uninitialized_array(*args: Any, **kw: Any) -> Any:
        return _track(orig_uninit(*args, **kw))

    def pad_to_block_dimension(value: Any, *args: Any, **kw: Any) -> Any:
        out = orig_pad(value, *args, **kw)
        return _track(out) if _is_tracked(value) else out

    def allocate_buffer(self: Any, key: Any, ref_count: int, value: Any, *a: Any, **kw: Any) -> Any:
        new = key not in self.mem
        out = orig_alloc(self, key, ref_count, value, *a, **kw)
        if new and getattr(_tls, "unwritten", False):
            _maps(self)[key] = np.zeros(np.shape(value), np.uint8)  # all UNWRITTEN
            if self.uninitialized_memory == "nan":
                _poison(self.mem[key].content)
        elif new:
            _unwritten_padding(self, key)
        return out

    def deallocate_buffer(self: Any, key: Any, *a: Any, **kw: Any) -> Any:
        out = orig_dealloc(self, key, *a, **kw)
        if key not in self.mem:
            _maps(self).pop(key, None)
        return out

    def get_buffer_content(self: Any, key: Any, rnge: Any, *a: Any, **kw: Any) -> Any:
        out = orig_get(self, key, rnge, *a, **kw)
        dma = getattr(_tls, "dma", None)
        info = kw.get("logging_info")
        source_info = getattr(info, "source_info", None)
        copy = source_info if dma is None and isinstance(source_info, LoadSource) else None
        if copy is not None:
            _forget_copy(copy, info)  # this load's states, if recorded below, replace them
        written = _maps(self).get(key)
        if written is None:
            return out
        view = _view(written, rnge)
        if view is None or view.shape != np.shape(out[0]):
            return out  # out of bounds: the interpreter's own error stands
        if copy is not None and view.shape == copy.shape:
            _record_copy(copy, info, view.copy())
            if copy.copy_only and not (view == PENDING).any():
                return out  # its value goes only into copies: no use of it
        if dma is None and source_info is None:
            if key[0] in ("any", "hbm"):
                # The result is read back: values computed from unwritten memory are used here.
                # (Elements the kernel never wrote are its own business: a caller may ignore
                # them, as JAX's tests do; they hold the fill, as in stock.)
                if (view == DERIVED).any():
                    # Raised when the call has ended well otherwise: a refusal at the kernel's
                    # end (a DMA never waited for), a fault or a deadlock elsewhere is the
                    # better message, and raising here would stop a device its peers wait on.
                    report_result_error(_result_error(self, key, rnge, view))
            else:
                # The pipeline copies an output block to HBM: the window takes the block's
                # map, and the block buffer holds a stale block from now on.
                _block_states(self)[_core(info) if info is not None else key[2:4]] = view.copy()
                written[...] = UNWRITTEN
                if self.uninitialized_memory == "nan":
                    _poison(self.mem[key].content)
        elif dma is not None:
            if (view == PENDING).any():  # data a DMA in flight has not landed yet
                raise _error(self, key, rnge, view, info, dma)
            if (view != WRITTEN).any():  # a copy, not a use: the states go with the data
                dma._coremesh_carry = view.copy()
        elif (view != WRITTEN).any() and not _from_rule(source_info):
            carries = self.uninitialized_memory == "nan" and taint_layout(out[0].dtype)
            if not carries:
                raise _error(self, key, rnge, view, info, dma)
            if _origin(self) is None:
                self.__dict__[_ORIGIN] = _read_parts(self, key, rnge, view, info, dma)
        return out

    def _mark(
        self: Any,
        key: Any,
        rnge: Any,
        value: Any,
        mask: Any = None,
        info: Any = None,
        before: np.ndarray | None = None,
    ) -> None:
        written = _maps(self).get(key)
        dma = getattr(_tls, "dma", None)
        store = getattr(info, "source_info", None)
        carry = None
        if dma is not None:
            carry = dma.__dict__.pop("_coremesh_carry", None)
        elif info is not None and store is None:  # the pipeline's copy of a block to HBM
            carry = _block_states(self).pop(_core(info), None)
        elif isinstance(store, StoreSource):
            copied = _copied_states(store, info)
            if copied is not None and store.merge:
                copied = _merged_states(copied, value, before)
            if copied is not None and _mark_copy(self, key, rnge, value, mask, copied):
                return
        tainted = _tainted(np.asarray(value)) if _origin(self) is not None else None
        if written is None:
            if tainted is None or not tainted.any():
                return
            written = _maps(self)[key] = np.full(self.mem[key].content.shape, WRITTEN, np.uint8)
        try:
            index = tuple(rnge)
            fresh = _stored(tainted)
            if mask is not None:
                mask = np.asarray(mask, bool)
                written[index] = np.where(mask, fresh, written[index])
            elif carry is not None and written[index].shape == carry.shape:
                written[index] = carry  # a copy (pipeline block, DMA): its states as they are
            else:
                written[index] = fresh
        except Exception:
            pass  # an out-of-bounds store: the interpreter raised (or clipped) it already

    def store_buffer_content(self: Any, key: Any, rnge: Any, value: Any, *a: Any, **kw: Any) -> Any:
        info = kw.get("logging_info")
        before = _before_merge(self, key, rnge, info)
        out = orig_store(self, key, rnge, value, *a, **kw)
        _mark(self, key, rnge, value, info=info, before=before)
        return out

    def swap_buffer_content(
        self: Any, key: Any, rnge: Any, value: Any, mask: Any, *a: Any, **kw: Any
    ) -> Any:
        info = kw.get("logging_info")
        before = _before_merge(self, key, rnge, info)
        out = orig_swap(self, key, rnge, value, mask, *a, **kw)
        _mark(self, key, rnge, value, mask, info, before)
        return out

    orig_call = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        # A kernel with interpret parameters of its own (call_params.merge) is left untracked.
        own = getattr(kw.get("interpret_params"), "own_fields", ())
        outer, _tls.tracking = getattr(_tls, "tracking", True), not own
        try:
            return orig_call(*args, **kw)
        finally:
            _tls.tracking = outer

    out: list[tuple[Any, str, Any]] = [
        (ipc, "interpret_pallas_call", interpret_pallas_call),
        (utils, "get_uninitialized_array", get_uninitialized_array),
        (utils, "pad_to_block_dimension", pad_to_block_dimension),
        (ipc, "callback", _CallbackModule(ipc.callback)),
        (sm_cls, "allocate_buffer", allocate_buffer),
        (sm_cls, "deallocate_buffer", deallocate_buffer),
        (sm_cls, "get_buffer_content", get_buffer_content),
        (sm_cls, "store_buffer_content", store_buffer_content),
        (sm_cls, "swap_buffer_content", swap_buffer_content),
    ]
    out += _dma_targets(ipc, memory)
    out += copies.targets()
    return out


def _core(info: Any) -> tuple[int, int]:
    """(device, core) of an access, from its logging info."""
    return int(info.device_id), int(info.local_core_id)


def _block_states(sm: Any) -> dict[tuple[int, int], np.ndarray]:
    """Per (device, core): the map of the output block the pipeline is copying to HBM, from its
    read of the block to its write of the window (the two callbacks may run on different
    threads, and another core's accesses between them)."""
    states = sm.__dict__.get(_BLOCKS)
    if states is None:
        states = sm.__dict__.setdefault(_BLOCKS, {})
    return states  # type: ignore[no-any-return]


def _forget_copy(load: LoadSource, info: Any) -> None:
    load.states.pop(_core(info), None)


def _record_copy(load: LoadSource, info: Any, states: np.ndarray) -> None:
    load.states[_core(info)] = states


def _copied_states(store: StoreSource, info: Any) -> np.ndarray | None:
    """The states of a copying store's value: its load's, moved as the value's elements were
    (None when its load recorded none: a buffer without a map, a range out of bounds)."""
    states = store.load.states.get(_core(info))
    if states is None:
        return None
    moved = store.move(states)
    return moved if moved.shape == store.shape else None


def _stored(tainted: np.ndarray | None) -> Any:
    """The states a store gives the elements it writes: computed from unwritten memory where its
    value holds the tagged NaN, written elsewhere."""
    return np.where(tainted, DERIVED, WRITTEN) if tainted is not None else WRITTEN


def _before_merge(sm: Any, key: Any, rnge: Any, info: Any) -> np.ndarray | None:
    """What a merging store (``StoreSource.merge``) is about to replace, while it is there."""
    store = getattr(info, "source_info", None)
    if not (isinstance(store, StoreSource) and store.merge) or key not in _maps(sm):
        return None
    try:
        return np.array(sm.mem[key].content[tuple(rnge)])
    except Exception:
        return None  # out of bounds: the interpreter raises (or clips) it


def _merged_states(copied: np.ndarray, value: Any, before: np.ndarray | None) -> np.ndarray | None:
    """A merging store's states: its load's where it leaves the bits as they were, those of any
    store (written, or computed from unwritten memory) elsewhere; None if it cannot tell."""
    value = np.asarray(value)
    if before is None or before.shape != value.shape or copied.shape != value.shape:
        return None
    if before.dtype.itemsize != value.dtype.itemsize or value.dtype.itemsize not in (1, 2, 4, 8):
        return None
    bits = np.dtype(f"u{value.dtype.itemsize}")
    kept = before.view(bits) == value.view(bits)
    tainted = _tainted(value)
    fresh = _stored(tainted)
    return np.where(kept, copied, fresh).astype(np.uint8)


def _mark_copy(sm: Any, key: Any, rnge: Any, value: Any, mask: Any, copied: np.ndarray) -> bool:
    """A store of a copy: its elements take the states of those it copies (those a DMA had yet
    to land count as computed, as a store of any value); their memory holds the tagged NaN
    again where they are unwritten or computed from unwritten memory (a cast to bfloat16 drops
    it). False if the shapes do not fit: the store is marked as any other."""
    value = np.asarray(value)
    if mask is not None:
        mask = np.asarray(mask, bool)
    if copied.shape != value.shape or (mask is not None and mask.shape != value.shape):
        return False
    states = copied
    if (states == PENDING).any():
        tainted = _tainted(value)
        fresh = _stored(tainted)
        states = np.where(states == PENDING, fresh, states)
    stale = states != WRITTEN
    if mask is not None:
        stale &= mask
    written = _maps(sm).get(key)
    if written is None:
        if not stale.any():
            return True
        written = _maps(sm)[key] = np.full(sm.mem[key].content.shape, WRITTEN, np.uint8)
    try:
        index = tuple(rnge)
        target = written[index]
        if target.shape != states.shape:
            return False
        written[index] = states if mask is None else np.where(mask, states, target)
    except Exception:
        return True  # an out-of-bounds store: the interpreter raised (or clipped) it already
    content = sm.mem[key].content
    layout = taint_layout(content.dtype)
    if stale.any() and layout is not None and sm.uninitialized_memory == "nan":
        content[index].view(layout[0])[stale] = tainted_nan(layout)
    return True


_pending_lock = threading.Lock()
#: The first result-with-unwritten-elements error of the current call (see take_result_error).
_pending: list[Exception] = []


def report_result_error(err: Exception) -> None:
    """Note ``err`` as the call's result error unless one is noted (the interpreter's final read
    of an output, or the compiled fast path)."""
    with _pending_lock:
        if not _pending:
            _pending.append(err)


def take_result_error() -> Exception | None:
    """The result error of the call that just ended, once (the simulator raises it when the call
    otherwise succeeded: a deadlock or fault that left the result unwritten is the error then)."""
    with _pending_lock:
        err = _pending[0] if _pending else None
        _pending.clear()
    return err


def _dma_targets(ipc: Any, memory: Any) -> list[tuple[Any, str, Any]]:
    """A DMA's copy steps run with the DMA known (its read is checked, not the pipeline's);
    waits and DMA signals are remembered per semaphore for the message."""
    orig_read, orig_write = ipc.DMA.execute_read, ipc.DMA.execute_write
    orig_wait = memory.Semaphore.wait
    orig_append = memory.SharedMemory.append_semaphore_task

    def append_semaphore_task(self: Any, semaphore_id: Any, global_core_id: Any, task: Any) -> Any:
        # dma_start queues a DMA that does not complete at once (on_wait, a schedule): its
        # destination is pending until its write.
        dma = getattr(task, "__self__", None)
        if isinstance(dma, ipc.DMA) and "_coremesh_pending" not in dma.__dict__:
            dma._coremesh_pending = True
            _mark_pending(self, ipc, dma)
        return orig_append(self, semaphore_id, global_core_id, task)

    def execute_read(self: Any) -> Any:
        outer, _tls.dma = getattr(_tls, "dma", None), self
        try:
            out = orig_read(self)
        finally:
            _tls.dma = outer
        if self.src_sem is not None:
            _note(
                self.src_sem,
                self.src_global_core_id,
                "signal",
                lambda: f"the send side of {_describe_dma(self)}",
            )
        return out

    def execute_write(self: Any) -> Any:
        outer, _tls.dma = getattr(_tls, "dma", None), self
        try:
            out = orig_write(self)
        finally:
            _tls.dma = outer
        _note(
            self.dst_sem, self.dst_global_core_id, "signal", functools.partial(_describe_dma, self)
        )
        return out

    def wait(self: Any, value: Any, global_core_id: Any, *a: Any, **kw: Any) -> Any:
        out = orig_wait(self, value, global_core_id, *a, **kw)
        # dma_wait and semaphore_wait pass the waiting line (interpret_pallas_call.py:1142, 1214)
        info = getattr(kw.get("logging_info"), "source_info", None)
        core = int(global_core_id)
        _note(self, core, "wait", functools.partial(_describe_wait, self, core, info))
        return out

    return [
        (ipc.DMA, "execute_read", execute_read),
        (ipc.DMA, "execute_write", execute_write),
        (memory.Semaphore, "wait", wait),
        (memory.SharedMemory, "append_semaphore_task", append_semaphore_task),
    ]


def _mark_pending(sm: Any, ipc: Any, dma: Any) -> None:
    """The unwritten elements of a started DMA's destination become pending."""
    key = faults.buffer_key(
        dma.dst_memory_space, dma.dst_buffer_id, int(dma.dst_device_id), int(dma.dst_local_core_id)
    )
    written = _maps(sm).get(key)
    if written is None:
        return
    try:
        index = tuple(ipc.interpret_utils.to_range(dma.dst_transforms))
        states = written[index]
        if states.all():  # nothing unwritten (UNWRITTEN is 0): a buffer refilled, the common case
            return
        written[index] = np.where(states == UNWRITTEN, PENDING, states)
    except Exception:  # a range the interpreter rejects: its own error comes at the write
        return


# ---------------------------------------------------------------------- the message


def _buffer_text(sm: Any, key: Any) -> str:
    return faults.buffer_text(str(key[0]), key[1], sm.mem.get(key))


def _range_text(rnge: Any) -> str:
    return faults.range_text(rnge, whole="the whole buffer")


def _describe_wait(sem: Any, global_core_id: int, source_info: Any) -> str:
    device, core = divmod(global_core_id, sem.shared_memory.num_cores_per_device)
    where = faults.user_location(source_info)
    return f"device {device}, core {core}" + (f" at {where}" if where else "")


def _describe_dma(dma: Any) -> str:
    where = faults.user_location(dma.source_info)
    return (
        f"the DMA from device {dma.src_device_id} (core {dma.src_local_core_id}) to device "
        f"{dma.dst_device_id} (core {dma.dst_local_core_id})"
        + (f" started at {where}" if where else "")
    )


def _semaphore_text(sem: Any, core: int) -> str:
    name = semaphore_description(sem)
    notes = sem.shared_memory.__dict__.get(_NOTES, {})
    wait, signal = (notes.get((sem.id, core, k), lambda: "none yet")() for k in ("wait", "signal"))
    return f"{name} (last completed wait: {wait}; last signalled by: {signal})"


def _read_parts(
    sm: Any, key: Any, rnge: Any, view: np.ndarray, info: Any, dma: Any
) -> dict[str, Any]:
    """Where a read of unwritten memory happened, and what it read."""
    unwritten = view == PENDING if dma is not None else view != WRITTEN
    missing = int(np.count_nonzero(unwritten))
    pending = missing if dma is not None else int(np.count_nonzero(view == PENDING))
    first = tuple(int(i) for i in np.argwhere(unwritten)[0]) if view.ndim else ()
    if dma is not None:
        device, core = int(dma.src_device_id), int(dma.src_local_core_id)
        source_info = dma.source_info
        sems = [f"destination {_semaphore_text(dma.dst_sem, dma.dst_global_core_id)}"]
        if dma.src_sem is not None:
            sems.append(f"source {_semaphore_text(dma.src_sem, dma.src_global_core_id)}")
        operation = "a DMA whose source a DMA in flight has not written yet"
        extra = "; semaphores: " + "; ".join(sems)
    else:
        device = int(getattr(info, "device_id", key[2]))
        core = int(getattr(info, "local_core_id", key[3]))
        source_info = getattr(info, "source_info", None)
        operation = "a load of unwritten memory"
        extra = ""
    kernel, body = faults.kernel_of(source_info)
    location = faults.user_location(source_info) or (
        f"the kernel's body ({body})" if body else None
    )
    buffer, index = _buffer_text(sm, key), _range_text(rnge)
    text = (
        f"{operation} on device {device}, core {core}"
        + (f" in kernel {kernel!r}" if kernel else "")
        + (f" at {location}" if location else "")
        + f": buffer {buffer}, range {index}: {missing} of {view.size} element(s) "
        + ("not yet written by a DMA in flight" if dma is not None else "never written")
        + (f", the first at {first} of the range" if first else "")
        + (
            f" ({pending} of them are a started DMA's destination: it has not landed yet)"
            if pending and dma is None
            else ""
        )
        + extra
    )
    return {
        "text": text,
        "device": device,
        "core": core,
        "kernel": kernel,
        "location": location,
        "operation": operation,
        "buffer": buffer,
        "index": index,
        "dma": dma is not None,
    }


RULE = (
    "a kernel uses only memory that it, a DMA or the pipeline wrote; fresh scratch, outputs and "
    "pipeline blocks hold stale bytes on the chip"
)
TURN_OFF = " (simulate(check_uninitialized=False) turns this check off)"


def _error(sm: Any, key: Any, rnge: Any, view: np.ndarray, info: Any, dma: Any) -> Exception:
    """A read whose value cannot carry the taint (integers, bools, a zero fill): raised there."""
    parts = _read_parts(sm, key, rnge, view, info, dma)
    if parts["dma"]:
        fix = (
            "wait for the DMA (or store) that fills the source before starting this DMA: its "
            "semaphore's wait must come first"
        )
    else:
        fix = (
            "store to the buffer (or wait for the DMA that fills it) before loading it; for an "
            "accumulator, initialise it under pl.when(step == 0)"
        )
    return UninitializedReadError(
        parts["text"],
        device=parts["device"],
        core=parts["core"],
        kernel=parts["kernel"],
        location=parts["location"],
        operation=parts["operation"],
        buffer=parts["buffer"],
        index=parts["index"],
        rule=RULE,
        chip=current_name(),
        fix=fix + TURN_OFF,
    )


def _result_error(sm: Any, key: Any, rnge: Any, view: np.ndarray) -> Exception:
    """The result holds elements computed from unwritten memory."""
    derived = view == DERIVED
    missing = int(np.count_nonzero(derived))
    first: tuple[int, ...] = ()
    if view.ndim:
        starts = [r.start or 0 if isinstance(r, slice) else None for r in tuple(rnge)]
        starts = [s for s in starts if s is not None] + [0] * view.ndim
        first = tuple(int(i) + starts[d] for d, i in enumerate(np.argwhere(derived)[0]))
    buffer = _buffer_text(sm, key)
    origin = _origin(sm)
    what = (
        f"a kernel's result on device {key[2]} is computed from unwritten memory: {missing} "
        f"of {view.size} element(s) of output {buffer}"
        + (f", the first at {first}" if first else "")
    )
    if origin is not None:
        what += f"; the run first read unwritten memory here: {origin['text']}"
        fix = "write that memory (or wait for the DMA that fills it) before that read"
        where = origin
    else:
        what += "; the read that made them was not recorded"
        fix = "write the memory those elements were computed from before reading it"
        where = {"device": int(key[2]), "core": None, "kernel": None, "location": None}
    return UninitializedReadError(
        what,
        device=where["device"],
        core=where["core"],
        kernel=where["kernel"],
        location=where["location"],
        operation="the kernel's result" + (f", from {origin['operation']}" if origin else ""),
        buffer=where.get("buffer", buffer),
        index=where.get("index", f"{first}" if first else None),
        rule=RULE,
        chip=current_name(),
        fix=fix + TURN_OFF,
    )
