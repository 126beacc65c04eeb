"""Semaphores handed from one kernel to the next: a copy started in one kernel, waited in another.

Mosaic lowers kernels whose operands or results are semaphores (``out_shape=...
pltpu.SemaphoreType.DMA(())`` with a ``pltpu.SEMAPHORE`` BlockSpec; ``jax.new_ref(sem,
memory_space=pltpu.SEMAPHORE)`` closed over by a ``core_map``): the semaphore outlives the
kernel, so one kernel starts a DMA and a later one waits for it (JAX's ``tpu_pallas_async_test``,
``PallasSparsecoreAsyncTest``). Pallas' interpreter gives every kernel a fresh shared memory and
treats a semaphore operand as data: it fills it with NaN ("nan + dma_sem") or copies it as a
buffer ("Cannot interpret 'dma_sem' as a data type").

Simulated so. Between kernels a semaphore array holds handles (int32, the type jax lowers
semaphores to) into a table of counts the simulator keeps. A kernel that takes or returns one
runs with a scratch semaphore in its place and an SMEM int32 block for the handle:

* at the start, the scratch semaphore takes the count its handle holds (a semaphore the kernel
  only returns is new: count zero, a new handle);
* at the end, for a semaphore the kernel returns, the copies still in flight on it land (a copy
  may finish at any time before its wait; the kernel's buffers are copied out when it ends, so
  under ``on_wait`` this is the latest it can land; the core then takes their count through
  the semaphore's own wait, so the race detector orders the kernel's end after them), its count
  goes back to the table and the scratch semaphore to zero. A semaphore the kernel only takes
  must end at zero, as its own semaphores must (``UnfinishedKernelError``).

Both steps are ``semaphore_wait`` s whose value (below ``HANDOFF``, which no kernel waits for:
the chip would wait forever) carries the handle; the patched wait answers them.

Each core has its own semaphores, so the table keeps a count per handle and core: a kernel over
a ``TensorCoreMesh`` of several cores (one grid step each) hands each core's count on to the same
core of the next kernel, as a megacore chip does with a semaphore made outside its kernels
(``pl.empty_ref_like(pltpu.SemaphoreType.DMA(()))``). Its cores meet (by semaphore signals)
before their copies land and again before they count, and core 0 alone writes a returned
semaphore's handles, to a block in HBM (every core would copy an SMEM block out, and the race
detector would see the equal copies race). A kernel of several grid steps on one core taking or
returning a semaphore is refused (:class:`NotSimulatedError`).

A semaphore made outside every kernel holds no handle yet (its bits are zero): the first kernel
that takes it gives it new handles, the same on every core and device of that kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.testing.sim import compat, inline
from coremesh.testing.sim.errors import NotSimulatedError
from coremesh.testing.sim.jaxprs import is_semaphore

#: Wait values at and below ``BARRIER`` are the hand-off's: ``BARRIER`` waits for every device to
#: get there, ``LAND`` lands the copies in flight on the semaphore, ``HANDOFF - h`` gives its count
#: to handle ``h`` and ``ADOPT - h`` takes handle ``h``'s count.
BARRIER = -1
LAND = -2
HANDOFF = -3
ADOPT = -(2**30)
_MAX_HANDLES = 2**29

#: A semaphore's bits before any kernel gave it a handle (``jnp.empty`` of a semaphore type).
NO_HANDLE = 0

_lock = threading.Lock()
#: (handle, global core) -> the count that core's semaphore holds between kernels.
_counts: dict[tuple[int, int], int] = {}
_handles = itertools.count()
#: The scratch semaphores that adopted a handle: (shared memory, global core, semaphore id).
_adopted: set[tuple[int, int, int]] = set()
#: The handles made in the running kernel (its shared memory, weakly), by semaphore: every core
#: and device of the kernel asks for them and gets the same ones.
_made: dict[int, Any] = {}
_made_in: list[Any] = [None]


def _new_handles(shape: tuple[int, ...], which: int) -> Any:
    """New handles for the kernel's semaphore ``which`` (never ``NO_HANDLE``), the same for
    every core and device that asks while the kernel runs."""
    import numpy as np
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    sm = ipc._shared_memory
    with _lock:
        running = _made_in[0]
        if running is None or running() is not sm:
            _made.clear()
            _made_in[0] = weakref.ref(sm) if sm is not None else None
        out = _made.get(which)
        if out is None:
            n = math.prod(shape)
            fresh = [1 + next(_handles) % (_MAX_HANDLES - 1) for _ in range(n)]
            out = _made[which] = np.array(fresh, dtype=np.int32).reshape(shape)
    return out


def _not_simulated(what: str, chip: str) -> NotSimulatedError:
    return NotSimulatedError(
        f"a kernel taking or returning a semaphore {what} is not simulated",
        rule="a semaphore passed between kernels is simulated by the count each core holds "
        "between kernels, for a kernel of one grid step, or one grid step on each core of a "
        "TensorCoreMesh",
        chip=chip,
        fix="give the kernel one grid step per core, or start and wait for the copy in one "
        "kernel (pl.run_scoped with pltpu.SemaphoreType.DMA)",
    )


def _handle_aval(aval: Any, space: Any = None) -> Any:
    """The int32 block a semaphore operand's handle travels in: SMEM, or ``space``."""
    import jax.numpy as jnp
    from jax.experimental.pallas import tpu as pltpu

    return (space or pltpu.SMEM)(tuple(aval.shape), jnp.int32).get_ref_aval()


def _scratch_aval(aval: Any) -> Any:
    """The scratch semaphore standing in for a semaphore operand, typed as the interpreter types
    its semaphores (``SEMAPHORE_INTERPRET_DTYPE``), which every semaphore and DMA primitive
    takes: a DMA semaphore then also takes the hand-off's ``semaphore_wait`` s."""
    from jax._src.pallas import core as pallas_core
    from jax.experimental.pallas import tpu as pltpu

    shape = tuple(aval.shape)
    return pltpu.SEMAPHORE(shape, pallas_core.SEMAPHORE_INTERPRET_DTYPE).get_ref_aval()


def _elements(shape: Sequence[int]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(n) for n in shape)))


def _at(ref: Any, index: tuple[int, ...]) -> Any:
    return ref.at[index] if index else ref


@dataclasses.dataclass(frozen=True)
class _Semaphore:
    """One semaphore of the kernel: its invar as an input and as an output (an aliased pair is
    one semaphore), and its aval."""

    taken: int | None
    returned: int | None
    aval: Any


@dataclasses.dataclass(frozen=True)
class _Cores:
    """The cores a kernel runs on, one grid step each: their number and the mesh axis naming
    them (None for a kernel on one core)."""

    count: int = 1
    axis: str | None = None


def _meet(cores: _Cores, anchor: Any, meeting: Any) -> None:
    """Every core of every device gets here before any goes on. The cores of a device meet by
    signalling each other's ``meeting`` semaphore; the devices by the hand-off's ``BARRIER``."""
    import jax
    from jax.experimental import pallas as pl

    if cores.axis is None:
        pl.semaphore_wait(anchor, BARRIER)
        return
    me = jax.lax.axis_index(cores.axis)

    def among_cores() -> None:
        for core in range(cores.count):

            @pl.when(me != core)
            def _(core: int = core) -> None:
                pl.semaphore_signal(meeting, 1, core_index=core)

        pl.semaphore_wait(meeting, cores.count - 1)

    among_cores()

    @pl.when(me == 0)
    def _() -> None:
        pl.semaphore_wait(anchor, BARRIER)

    among_cores()


def _copy_out_from_core_0(handles: Any, smem: Any, hbm: Any, axis: str) -> None:
    """Core 0 writes a returned semaphore's handles to its HBM block, through SMEM scratch."""
    import jax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    @pl.when(jax.lax.axis_index(axis) == 0)
    def _() -> None:
        smem[...] = handles
        pltpu.sync_copy(smem, hbm)


def _body(jaxpr: Any, sems: Sequence[_Semaphore], cores: _Cores) -> Callable[..., list[Any]]:
    """The kernel body around ``jaxpr``, whose semaphore invars are now handle blocks and whose
    scratch semaphores (one per ``sems`` entry, then the cores' meeting semaphore if several
    cores run it) come last."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import io_callback
    from jax.experimental import pallas as pl

    def body(*refs: Any) -> list[Any]:
        n = len(jaxpr.invars)
        kernel_refs = list(refs[:n])
        scratches = refs[n : n + len(sems)]
        meeting = refs[n + len(sems)] if cores.axis is not None else None
        outgoing = iter(refs[n + len(sems) + 1 :])  # core 0's handles on their way out
        handles = []
        for which, (sem, scratch) in enumerate(zip(sems, scratches, strict=True)):
            for pos in (sem.taken, sem.returned):
                if pos is not None:
                    kernel_refs[pos] = scratch
            shape = tuple(scratch.shape)
            new = io_callback(
                functools.partial(_new_handles, shape, which),
                jax.ShapeDtypeStruct(shape, jnp.int32),
            )
            h = new if sem.taken is None else refs[sem.taken][...]
            if sem.taken is not None:
                h = jnp.where(h == NO_HANDLE, new, h)
            handles.append(h)
            for index in _elements(shape):
                pl.semaphore_wait(_at(scratch, index), ADOPT - h[index])

        inline.eval_kernel(jaxpr, kernel_refs)
        out = [
            (s, r, h)
            for s, r, h in zip(sems, scratches, handles, strict=True)
            if s.returned is not None
        ]
        if not out:
            return []
        # A copy between devices (or cores) signals both ends: every core starts its copies
        # before any lands them, and lands them before any counts.
        anchor = _at(out[0][1], (0,) * len(out[0][1].shape))
        _meet(cores, anchor, meeting)
        for _, scratch, _ in out:
            for index in _elements(tuple(scratch.shape)):
                pl.semaphore_wait(_at(scratch, index), LAND)
        _meet(cores, anchor, meeting)
        for sem, scratch, h in out:
            for index in _elements(tuple(scratch.shape)):
                pl.semaphore_wait(_at(scratch, index), HANDOFF - h[index])
            assert sem.returned is not None
            if cores.axis is None:
                refs[sem.returned][...] = h
            else:
                _copy_out_from_core_0(h, next(outgoing), refs[sem.returned], cores.axis)
        return []

    return body


def _semaphores(jaxpr: Any, gm: Any, aliases: Sequence[tuple[int, int]]) -> list[_Semaphore]:
    """The kernel's semaphore operands and results, as invar positions."""
    first = gm.num_index_operands
    n_in = gm.num_inputs
    blocks = jaxpr.invars[first : first + n_in + gm.num_outputs]
    is_sem = [is_semaphore(v.aval) for v in blocks]
    out_of = {k - first: first + n_in + o for k, o in aliases}
    sems = []
    paired = set()
    for i in range(n_in):
        if is_sem[i]:
            out = out_of.get(i)
            paired.add(out)
            sems.append(_Semaphore(first + i, out, blocks[i].aval))
    for o in range(gm.num_outputs):
        pos = first + n_in + o
        if is_sem[n_in + o] and pos not in paired:
            sems.append(_Semaphore(None, pos, blocks[n_in + o].aval))
    return sems


def _cores_of(mesh: Any, steps: int) -> _Cores | None:
    """The cores of a kernel that runs one grid step on each core of a ``TensorCoreMesh``;
    None for any other kernel of ``steps`` grid steps."""
    axis, cores = compat.tensorcore_cores(mesh) or ("", 0)
    return _Cores(steps, axis) if cores == steps else None


def rewrite(args: Sequence[Any], kw: dict[str, Any], chip: str) -> tuple[Any, Any, Any] | None:
    """``(args, kw, finish)`` for a kernel that takes or returns semaphores, rewritten as the
    module says (``finish`` turns its outputs back into semaphores); None for any other."""
    import jax.numpy as jnp
    from jax import lax
    from jax._src import core as jax_core
    from jax.experimental import pallas as pl

    jaxpr = kw["jaxpr"]
    gm = kw["grid_mapping"]
    sems = _semaphores(jaxpr, gm, kw["input_output_aliases"])
    if not sems:
        return None
    steps = inline.kernel_steps(gm)
    if steps is None:
        raise _not_simulated("over a grid sized at run time", chip)
    cores = _Cores() if steps == 1 else _cores_of(kw.get("mesh"), steps)
    if cores is None:
        raise _not_simulated(f"over {steps} grid steps of one core", chip)
    if jaxpr.constvars:
        raise _not_simulated("whose body has constants", chip)

    first = gm.num_index_operands
    handle_blocks = {p for s in sems for p in (s.taken, s.returned) if p is not None}
    # Over several cores a result's handles go out through HBM, written by core 0 alone: an SMEM
    # result block is copied out by every core, and the race detector would see the cores'
    # equal copies race.
    spaces = {s.returned: pl.ANY for s in sems if cores.axis is not None and s.returned is not None}
    block_mappings = list(gm.block_mappings)
    handle_avals = {p: _handle_aval(jaxpr.invars[p].aval, spaces.get(p)) for p in handle_blocks}
    for pos, handle in handle_avals.items():
        block_mappings[pos - first] = block_mappings[pos - first].replace(
            array_aval=jax_core.ShapedArray(tuple(handle.shape), jnp.int32),
            **{compat.block_aval_field(): handle},
        )
    scratch = [_scratch_aval(s.aval) for s in sems]
    if cores.axis is not None:
        scratch.append(_scratch_aval(jax_core.ShapedArray((), jnp.int32)))  # the cores' meeting
        # Core 0's handles, in SMEM, for its copy to each result's HBM block.
        scratch += [_handle_aval(jaxpr.invars[p].aval) for p in spaces]
    new_gm = gm.replace(
        block_mappings=tuple(block_mappings), scratch_avals=(*gm.scratch_avals, *scratch)
    )
    in_avals = [handle_avals.get(i, v.aval) for i, v in enumerate(jaxpr.invars)]
    new_jaxpr = inline.retrace_kernel(gm, _body(jaxpr, sems, cores), [*in_avals, *scratch])

    # args: *dynamic grid sizes, *index operands, *inputs; invars: *index operands, *inputs, ...
    lead = len(args) - gm.num_inputs - first
    new_args = list(args)
    for s in sems:
        if s.taken is not None:
            a = lead + s.taken
            new_args[a] = lax.convert_element_type(args[a], jnp.int32)
    out_avals = list(kw["out_avals"])
    first_out = first + gm.num_inputs
    sem_outs = {p - first_out: out_avals[p - first_out] for p in handle_blocks if p >= first_out}
    for o, aval in sem_outs.items():
        out_avals[o] = jax_core.ShapedArray(tuple(aval.shape), jnp.int32)
    new_kw = {**kw, "jaxpr": new_jaxpr, "grid_mapping": new_gm, "out_avals": tuple(out_avals)}

    def finish(outs: Sequence[Any]) -> list[Any]:
        outs = list(outs)
        for o, aval in sem_outs.items():
            outs[o] = lax.convert_element_type(outs[o], aval.dtype)
        return outs

    return new_args, new_kw, finish


def _land(sem: Any, gcid: int) -> None:
    """Run every copy still in flight on ``sem`` for core ``gcid``, newest first (the order a
    wait takes them in, ``shared_memory.py`` ``Semaphore.wait``). The core then takes the count
    through the semaphore's own wait and puts it back: with race detection on, that wait orders
    the core after the copies, as a wait for them would (the kernel's end reads their
    destinations)."""
    while True:
        with sem.cv:
            if not sem.tasks[gcid]:
                break
            task = sem.tasks[gcid].pop()
        task()
    with sem.cv:
        count = int(sem.count_by_core[gcid])
    if count > 0:
        sem.wait(count, gcid)
        with sem.cv:
            sem.count_by_core[gcid] += count


def _ours(sm: Any, device_id: int, local_core_id: int, sem_id: int, value: int) -> bool:
    """Is this wait one of the hand-off's (see the module), not the kernel's own?"""
    if value > BARRIER:
        return False
    if value <= ADOPT:
        return True
    gcid = sm.get_global_core_id(device_id, local_core_id)
    with _lock:
        return (id(sm), gcid, sem_id) in _adopted


def _hand_off(sm: Any, device_id: int, local_core_id: int, sem_id: int, value: int) -> None:
    """Answer a hand-off wait (see the module)."""
    gcid = sm.get_global_core_id(device_id, local_core_id)
    key = (id(sm), gcid, sem_id)  # semaphore ids are the same on every core
    if value <= ADOPT:
        with _lock:
            # Kernels run one at a time: marks left by an earlier kernel's memory go.
            _adopted.difference_update({k for k in _adopted if k[0] != id(sm)})
            _adopted.add(key)
            count = _counts.pop((ADOPT - value, gcid), 0)
        (sem,), clock = sm.get_semaphores_and_increment_clock([sem_id], gcid)
        if count:
            sem.signal(count, gcid, clock)
    elif value == BARRIER:
        if sm.num_devices > 1:
            sm.barrier.wait()
    else:
        with sm.lock:
            sem = sm.sem[sem_id]
        if value == LAND:
            _land(sem, gcid)
        else:
            with sem.cv:
                count = int(sem.count_by_core[gcid])
                sem.count_by_core[gcid] = 0
            with _lock:
                _counts[(HANDOFF - value, gcid)] = count
                _adopted.discard(key)


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's kernel entry (the rewrite), its semaphore wait (the hand-off's landing)
    and, before jax 0.12, the semaphore dtype's conversion to and from its int32 counts."""
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import operands
    from coremesh.testing.sim.chip import current

    orig_call = ipc.interpret_pallas_call
    orig_wait = ipc.semaphore_wait

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        done = rewrite(args, kw, current().name)
        if done is None:
            return orig_call(*args, **kw)
        new_args, new_kw, finish = done
        return finish(orig_call(*new_args, **new_kw))

    @ipc.fail_on_exception
    def hand_off(token: Any, device_id: Any, local_core_id: Any, sem_id: Any, value: Any) -> Any:
        sm = ipc._get_shared_memory()
        _hand_off(sm, int(device_id), int(local_core_id), int(sem_id), int(value))
        return token

    def semaphore_wait(
        token: Any, device_id: Any, local_core_id: Any, sem_id: Any, value: Any, *a: Any, **k: Any
    ) -> Any:
        # Not wrapped in fail_on_exception itself: the wait it hands on already is, and a
        # failure reported twice makes its device wait twice at the interpreter's clean-up
        # barrier, which then never opens (a hang on the next fault).
        if _ours(ipc._shared_memory, int(device_id), int(local_core_id), int(sem_id), int(value)):
            return hand_off(token, device_id, local_core_id, sem_id, value)
        return orig_wait(token, device_id, local_core_id, sem_id, value, *a, **k)

    semaphore_wait.__wrapped__ = getattr(orig_wait, "__wrapped__", orig_wait)  # type: ignore[attr-defined]

    out: list[tuple[Any, str, Any]] = [
        (ipc, "interpret_pallas_call", interpret_pallas_call),
        (ipc, "semaphore_wait", semaphore_wait),
        # A semaphore operand's handles keep its memory space (a ref made with
        # memory_space=pltpu.SEMAPHORE).
        operands.stripped_memory_space("SEMAPHORE"),
    ]
    rules = pallas_core.AbstractSemaphoreTyRules  # jax's own, whatever _rules holds now
    if not getattr(rules, "allow_conversion", False):
        # Before jax 0.12 a semaphore array cannot be converted to its int32 representation
        # (lax.convert_element_type reads the dtype rules' allow_conversion, which it lacks).
        convertible = type("ConvertibleSemaphoreTyRules", (rules,), {"allow_conversion": True})
        out.append((pallas_core.AbstractSemaphoreTy, "_rules", convertible))
    return out
