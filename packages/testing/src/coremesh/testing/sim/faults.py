"""Faults inside simulated kernels become :class:`SimulationFault`, raised from the call.

The interpreter runs each ref access, DMA and semaphore operation of a kernel as a host callback.
An exception raised there (an index out of bounds, a DMA to a device that does not exist) reaches
the user as XLA's ``JaxRuntimeError: INTERNAL: CpuCallback error`` around an interpreter
traceback, and when another core was waiting, often as that core's deadlock instead. Here every
callback is wrapped in a ``try``/``except`` (no other per-operation cost): the first exception of
a run is turned into a :class:`SimulationFault` naming the device, core, kernel, the user's source
line, the buffer and the index, and recorded with the watchdog (from the interpreter's
``set_failed``, which sees it before the wrapper does); the interpreter's own failure
flag then aborts the other cores' waits, which are listed after the fault, and the simulator
raises the fault from the call (``patches``' execute wrapper) with the original exception as its
``__cause__``.

Kernel names are known at trace time only: :func:`register_kernel` maps the source info of every
equation of a kernel to its name when the interpreter traces it.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from coremesh.core.errors import CoremeshError
from coremesh.testing.sim.chip import current_name
from coremesh.testing.sim.deadlock import WATCHDOG
from coremesh.testing.sim.errors import SimulationFault
from coremesh.testing.sim.jaxprs import all_eqns

#: Interpreter callbacks (module attributes of interpret_pallas_call) -> what the user wrote.
CALLBACKS = {
    "get": "a load from a ref",
    "store": "a store to a ref",
    "swap": "a store to a ref",  # `ref[...] = x` is a swap whose old value is dropped
    "dma_start": "a DMA start",
    "dma_wait": "a DMA wait",
    "semaphore_signal": "a semaphore signal",
    "semaphore_wait": "a semaphore wait",
    "_allocate_buffer": "a scratch buffer allocation",
    "_allocate_semaphores": "a semaphore allocation",
    "get_barrier_semaphore": "pltpu.get_barrier_semaphore()",
    "_check_for_revisiting": "a grid step's return to an output block",
}

#: Callbacks whose third argument is the local core id (the others take other things there).
_WITH_CORE = frozenset(CALLBACKS) - {"get_barrier_semaphore"}

_MAX_NAMED = 200_000
_names_lock = threading.Lock()
#: id(traceback of an equation's source info) -> (that traceback, kernel name), oldest first.
_kernel_names: collections.OrderedDict[int, tuple[Any, str, str | None]] = collections.OrderedDict()


def register_kernel(jaxpr: Any, name: str | None, where: str | None = None) -> None:
    """Remember that the equations of ``jaxpr`` (nested ones too) belong to kernel ``name``,
    whose body is defined at ``where``."""
    if not name:
        return
    with _names_lock:
        for eqn in all_eqns(jaxpr):
            tb = getattr(eqn.source_info, "traceback", None)
            if tb is not None:
                _kernel_names[id(tb)] = (tb, name, where)  # holding tb keeps its id unique
        while len(_kernel_names) > _MAX_NAMED:
            _kernel_names.popitem(last=False)


def kernel_of(source_info: Any) -> tuple[str | None, str | None]:
    """(name, where its body is defined) of the kernel an operation belongs to, if known."""
    tb = getattr(source_info, "traceback", None)
    hit = _kernel_names.get(id(tb)) if tb is not None else None
    return (hit[1], hit[2]) if hit is not None and hit[0] is tb else (None, None)


def user_location(source_info: Any) -> str | None:
    """``file:line (function)`` of the innermost frame of kernel code that made the operation:
    the user's frame as jax judges it (outside jax and Python's own files), or a frame of a
    kernel shipped with jax (``jax/experimental/pallas/ops``), which is the user's kernel too."""
    from jax._src import source_info_util

    tb = getattr(source_info, "traceback", None)
    if tb is None:
        return None
    code, lasti = tb.raw_frames()
    for c, i in zip(code, lasti, strict=True):
        name = c.co_filename
        if source_info_util.is_user_filename(name) or "/pallas/ops/" in name.replace("\\", "/"):
            frame = source_info_util.raw_frame_to_frame(c, i)
            return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"
    return None


def fault_at(
    what: str,
    source_info: Any,
    position: dict[str, int],
    *,
    operation: str,
    rule: str,
    fix: str,
    detail: str | None = None,
    buffer: str | None = None,
    cls: type[SimulationFault] = SimulationFault,
) -> SimulationFault:
    """The fault a simulator check raises from its own host callback (which the interpreter's
    fault report does not see), recorded for the watchdog: ``what``, then the mesh position
    (``{"device": 0, "subcore": 3}``), the kernel and the user's line (or the kernel's body,
    when the line is deeper than the frames jax keeps), then ``detail``."""
    kernel, body = kernel_of(source_info)
    location = user_location(source_info) or (f"the kernel's body ({body})" if body else None)
    where = ", ".join(f"{name} {i}" for name, i in position.items())
    fault = cls(
        what
        + (f" at {where}" if where else "")
        + (f" in kernel {kernel!r}" if kernel else "")
        + (f" at {location}" if location else "")
        + (f": {detail}" if detail else ""),
        device=position.get("device"),
        core=position.get("core"),
        kernel=kernel,
        location=location,
        operation=operation,
        buffer=buffer,
        rule=rule,
        chip=current_name(),
        fix=fix,
    )
    WATCHDOG.record(fault)
    return fault


# ------------------------------------------------------------------------ the wrappers


def guard(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (an interpreter callback) reporting its first failure as a SimulationFault."""

    def guarded(*args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except Exception as err:
            if not getattr(err, _REPORTED, False):  # else reported by set_failed, below
                _report(name, args, kw, err)
            raise

    guarded.__name__ = guarded.__qualname__ = name
    # DMAs call get.__wrapped__ / store.__wrapped__ (interpret_pallas_call.py:995): keep it.
    guarded.__wrapped__ = getattr(fn, "__wrapped__", fn)  # type: ignore[attr-defined]
    return guarded


def guard_dma(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A ``DMA`` method that tags its exception with the DMA (run late, by another callback)."""

    def guarded(self: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(self, *args, **kw)
        except Exception as err:
            if not hasattr(err, "_coremesh_dma"):
                err._coremesh_dma = self  # type: ignore[attr-defined]
            raise

    guarded.__name__ = getattr(fn, "__name__", "dma")
    return guarded


#: Set on an exception that says only that another core failed first (the interpreter's
#: ``check_failed``): never the run's fault, whatever is recorded when it is reported.
_STOPPED = "_coremesh_stopped_by_another"


def mark_stopped(err: BaseException) -> None:
    """``err`` (raised by ``check_failed``) stopped a core because another one failed."""
    setattr(err, _STOPPED, True)


_REPORTED = "_coremesh_reported"
#: The code of every ``guarded`` callback (see :func:`_guarded_call`).
_GUARDED_CODE = guard("", lambda: None).__code__


def _guarded_call() -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
    """(name, args, kw) of the innermost guarded callback on this thread's stack, if any."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _GUARDED_CODE:
            local = frame.f_locals
            return local["name"], local["args"], local["kw"]
        frame = frame.f_back
    return None


def set_failed_targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's ``SharedMemory.set_failed``, reporting the failure first.

    A callback's failure reaches ``set_failed`` (in the interpreter's ``fail_on_exception``)
    before the guard around the callback sees it. In a kernel's own program (a chip of one core
    a device, or patch ``idle_cores``'s core 0) ``set_failed`` then holds the device until every
    device has stopped, and the others' stopped waits could reach the guard first, or the user's
    call end before the fault was recorded at all. Reported here, the first failure is recorded
    while the interpreter still holds it as the first."""
    from jax._src.pallas.mosaic.interpret import shared_memory as memory

    original = memory.SharedMemory.set_failed

    def set_failed(self: Any, exception: Exception, *args: Any, **kw: Any) -> Any:
        if not getattr(exception, _REPORTED, False):
            call = _guarded_call()
            if call is not None:
                _report(*call, exception)
        return original(self, exception, *args, **kw)

    return [(memory.SharedMemory, "set_failed", set_failed)]


def _report(name: str, args: tuple[Any, ...], kw: dict[str, Any], err: Exception) -> None:
    with contextlib.suppress(AttributeError):  # no __dict__: reported again at worst
        setattr(err, _REPORTED, True)
    if isinstance(err, CoremeshError):
        WATCHDOG.record(err)  # the simulator's own errors already say what happened
        return
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    if "RACE DETECTED" in str(err):
        return  # jax >= 0.12's race report: the simulator names it (patches' execute)
    sm = ipc._shared_memory
    failure = getattr(sm, "_failure", None)
    # A kernel's own program (one core a device, or core 0 alone) fails at the top level, where
    # the interpreter's set_failed waits for every device before the error reaches here: by then
    # the shared memory, and its record of the first failure, can be gone. The mark still tells.
    if getattr(err, _STOPPED, False) or (failure is not None and failure is not err):
        # A core stopped because another one failed: not the fault, but a wait it stopped.
        if name in ("semaphore_wait", "dma_wait") and len(args) > 2:
            where = user_location(kw.get("source_info"))
            WATCHDOG.stopped(
                _int(args[1]),
                _int(args[2]),
                f"device {_int(args[1])}, core {_int(args[2])}: {CALLBACKS[name]}"
                + (f" at {where}" if where else ""),
            )
        return
    try:
        fault = describe(name, args, kw, err, sm)
    except Exception:  # describing must never hide the original failure
        return
    fault.__cause__ = err
    WATCHDOG.record(fault)
    for wait in WATCHDOG.pending():
        if (wait.device, wait.core) != (fault.device, fault.core):
            fault.add_blocked(wait.describe())


def _int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def describe(
    name: str, args: tuple[Any, ...], kw: dict[str, Any], err: Exception, sm: Any
) -> SimulationFault:
    """The SimulationFault for ``err`` raised by callback ``name`` called with ``args``."""
    device = _int(args[1]) if len(args) > 1 else None
    core = _int(args[2]) if len(args) > 2 and name in _WITH_CORE else None
    dma = getattr(err, "_coremesh_dma", None)
    source_info = getattr(dma, "source_info", None) or kw.get("source_info")
    kernel, body = kernel_of(source_info)
    location = user_location(source_info)
    if location is None and body:
        # jax keeps the innermost 10 frames of a traceback; helpers such as pltpu.sync_copy
        # can use them all up before the user's line.
        location = f"the kernel's body ({body}; the operation's own line is deeper than jax keeps)"
    operation = CALLBACKS[name]
    buffer = index = None
    rule = "the operation raised inside the simulator's interpreter"
    fix = "see the cause below for the interpreter's own message"
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if name in ("get", "store", "swap") and len(args) > 5:
        buffer = _buffer(sm, args[3], args[4], device, core)
        index = _range(args[5])
        shape = _buffer_shape(sm, args[3], args[4], device, core)
        if "bound" in message.lower() or _outside(args[5], shape):
            # (jax 0.10.2 fails a partly out-of-bounds store with a bare AssertionError)
            operation = f"{operation} out of bounds"
            rule = (
                "every index of a ref access lies inside the ref's shape; the chip does not "
                "check, and reads or overwrites other memory"
            )
            fix = (
                "keep the pl.ds(start, size) / index within the ref (clamp it, or size the "
                "buffer for the largest index)"
            )
    elif dma is not None or name == "dma_start":
        operation, buffer, index, rule, fix = _dma_parts(args, dma, sm, device, message)
    elif name == "semaphore_signal":
        target = _int(args[5]) if len(args) > 5 else None
        n = getattr(sm, "num_devices", None)
        if target is not None and n is not None and not 0 <= target < n:
            operation = f"a semaphore signal to device {target}"
            rule = f"a signal's device_id names a device of the kernel's mesh (0..{n - 1})"
            fix = "compute the target device modulo jax.lax.axis_size('device')"
    elif name == "_check_for_revisiting":
        rule = (
            "an output block's grid iterations are consecutive (RevisitMode.IMMEDIATE, the "
            "default): once the grid moves on the block is written back, and a later visit "
            "starts from a stale buffer, so the chip loses what the earlier visits wrote"
        )
        fix = (
            "order the grid so each output block's iterations are consecutive (the reduction "
            "axis last, 'arbitrary'), or give the output pipeline_mode=pl.Buffered(1, "
            "revisit=pl.RevisitMode.ANY) (which the simulator refuses by name)"
        )
    elif name == "get_barrier_semaphore":
        rule = "a kernel that uses the barrier semaphore needs a collective_id"
        fix = "pass collective_id= to the kernel (coremesh.tensorcore.kernel(collective_id='auto'))"
    where = f"device {device}, core {core}" if core is not None else f"device {device}"
    what = (
        f"{operation} failed on {where}"
        + (f" in kernel {kernel!r}" if kernel else "")
        + (f" at {location}" if location else "")
        + (f"; buffer {buffer}" if buffer else "")
        + (f", index {index}" if index else "")
        + f": {type(err).__name__}: {message}"
    )
    return SimulationFault(
        what,
        device=device,
        core=core,
        kernel=kernel,
        location=location,
        operation=operation,
        buffer=buffer,
        index=index,
        rule=rule,
        chip=current_name(),
        fix=fix,
    )


def _dma_parts(
    args: tuple[Any, ...], dma: Any, sm: Any, device: int | None, message: str
) -> tuple[str, str | None, str | None, str, str]:
    """(operation, buffers, ranges, rule, fix) of a failed DMA: from the DMA object when it
    failed while running, from dma_start's arguments when it failed to start."""
    if dma is not None:
        src = (dma.src_memory_space, dma.src_buffer_id, dma.src_device_id)
        src_core, src_t = dma.src_local_core_id, dma.src_transforms
        dst = (dma.dst_memory_space, dma.dst_buffer_id, dma.dst_device_id)
        dst_core, dst_t = dma.dst_local_core_id, dma.dst_transforms
    else:
        src_core = _int(args[2])
        src, src_t = (args[3], args[4], device), args[5]
        target = args[11] if len(args) > 11 else None
        dst_device = target[0] if isinstance(target, tuple) else target
        dst_device = device if dst_device is None else _int(dst_device)
        dst, dst_t, dst_core = (args[6], args[7], dst_device), args[8], src_core
    n = getattr(sm, "num_devices", None)
    dst_dev = _int(dst[2])
    if dst_dev is not None and n is not None and not 0 <= dst_dev < n:
        return (
            f"a remote DMA to device {dst_dev}",
            _buffer(sm, src[0], src[1], _int(src[2]), _int(src_core)),
            _range(src_t),
            f"a DMA's device_id names a device of the kernel's mesh (0..{n - 1}); the slice "
            f"has {n}",
            "compute the target device modulo jax.lax.axis_size('device') (e.g. "
            "(me + 1) % n for a ring)",
        )
    src_b = _buffer(sm, src[0], src[1], _int(src[2]), _int(src_core))
    dst_b = _buffer(sm, dst[0], dst[1], dst_dev, _int(dst_core))
    ranges = f"source {_range(src_t)}, destination {_range(dst_t)}"
    if "out-of-bounds" in message.lower():  # the interpreter's words, before its "shape"
        return (
            "a DMA out of bounds",
            f"from {src_b} to {dst_b}",
            ranges,
            "a DMA's source and destination windows lie inside their refs; the chip does not "
            "check, and reads or overwrites other memory",
            "keep each pl.ds(start, size) of the DMA within its ref (clamp the start, or size "
            "the buffer for the largest window)",
        )
    if "shape" in message.lower() or "broadcast" in message.lower():
        return (
            "a DMA between refs of different shapes",
            f"from {src_b} to {dst_b}",
            ranges,
            "a DMA copies a source window to a destination window of the same shape and dtype",
            "slice one side to the other's shape (src.at[pl.ds(...)] / dst.at[...])",
        )
    return (
        "a DMA",
        f"from {src_b} to {dst_b}",
        ranges,
        "a DMA reads and writes windows inside its source and destination refs",
        "check the DMA's source and destination slices and device_id",
    )


def buffer_key(
    space: Any, buffer_id: Any, device: int | None, core: int | None
) -> tuple[str, int | None, int | None, int | None]:
    """The interpreter's key of a buffer in its shared memory: (memory space name, buffer id,
    device, core; the core is 0 in HBM, which the device's cores share)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    space_i = _int(space)
    space_name = ipc.TPU_MEMORY_SPACE_NAMES.get(space_i, str(space)) if space_i is not None else "?"
    if core is not None:  # HBM on core 0 (and VMEM_SHARED where patch subcore_barrier shares it)
        core = int(ipc._local_core_id_or_zero_if_hbm(core, space_name))
    return space_name, _int(buffer_id), device, 0 if space_name in ("any", "hbm") else core


def _lookup(
    sm: Any, space: Any, buffer_id: Any, device: int | None, core: int | None
) -> tuple[str, int | None, Any]:
    """(memory space name, buffer id, the interpreter's buffer or None)."""
    key = buffer_key(space, buffer_id, device, core)
    try:
        return key[0], key[1], sm.mem[key]
    except Exception:
        return key[0], key[1], None


def _buffer_shape(
    sm: Any, space: Any, buffer_id: Any, device: int | None, core: int | None
) -> tuple[int, ...] | None:
    buf = _lookup(sm, space, buffer_id, device, core)[2]
    if buf is None:
        return None
    content = getattr(buf, "content", buf)
    return tuple(getattr(buf, "logical_shape", None) or content.shape)


def _buffer(sm: Any, space: Any, buffer_id: Any, device: int | None, core: int | None) -> str:
    return buffer_text(*_lookup(sm, space, buffer_id, device, core))


def buffer_text(space_name: str, buffer_id: Any, buf: Any) -> str:
    """How errors name one of the interpreter's buffers: space, dtype, logical shape, id."""
    if buf is None:
        return f"{space_name.upper()} buffer #{buffer_id}"
    content = getattr(buf, "content", buf)
    shape = tuple(getattr(buf, "logical_shape", None) or content.shape)
    dtype = getattr(content, "dtype", "?")
    return f"{space_name.upper()} {dtype}[{','.join(map(str, shape))}] (buffer #{buffer_id})"


def _outside(transforms: Any, shape: tuple[int, ...] | None) -> bool:
    """Does the index ``transforms`` reach outside a buffer of ``shape``?"""
    from jax._src.pallas.mosaic.interpret import utils as iu

    from coremesh.testing.sim.patches import int_tree

    if shape is None:
        return False
    try:
        ranges = iu.to_range(int_tree(transforms))
    except Exception:
        return False
    for r, dim in zip(ranges, shape, strict=False):
        lo, hi = (r.start, r.stop) if isinstance(r, slice) else (r, r + 1)
        if lo < 0 or hi > dim:
            return True
    return False


def _range(transforms: Any) -> str | None:
    from jax._src.pallas.mosaic.interpret import utils as iu

    from coremesh.testing.sim.patches import int_tree

    try:
        return range_text(iu.to_range(int_tree(transforms)))
    except Exception:
        return None


def range_text(ranges: Any, whole: str = "the whole ref") -> str:
    """How errors show an access range (the interpreter's ints and slices)."""
    parts = []
    for r in tuple(ranges):
        if isinstance(r, slice):
            parts.append(f"{r.start}:{r.stop}" + (f":{r.step}" if r.step not in (1, None) else ""))
        else:
            parts.append(str(r))
    return f"[{', '.join(parts)}]" if parts else whole


def targets() -> list[tuple[Any, str, Any]]:
    """Module attributes to swap: every interpreter callback and the DMA's two copy steps."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    out: list[tuple[Any, str, Any]] = []
    for name in CALLBACKS:
        fn = getattr(ipc, name, None)
        if fn is None:
            continue
        if not hasattr(fn, "__wrapped__"):
            # Upstream calls get_barrier_semaphore bare: its failure would not stop the other
            # cores, which then wait until the deadlock deadline.
            fn = ipc.fail_on_exception(fn)
        out.append((ipc, name, guard(name, fn)))
    for method in ("execute_read", "execute_read_and_write"):
        out.append((ipc.DMA, method, guard_dma(getattr(ipc.DMA, method))))
    return out + set_failed_targets()
