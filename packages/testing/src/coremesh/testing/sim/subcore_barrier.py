"""``plsc.subcore_barrier()``: the vector subcores of a SparseCore run at once, and meet.

The simulator runs a SparseCore mesh kernel as a named grid ``(core, subcore)`` of one
interpreter core, the subcores one after the other (patch ``sparsecore_axes``), which cannot
honour a barrier between them. A kernel whose body (or a jaxpr inside it) calls
``plsc.subcore_barrier`` runs another way instead:

* the grid becomes ``(subcore, core)``, the subcore axis ``parallel`` and split over as many
  interpreter cores (threads) as a SparseCore has subcores: each thread runs one subcore of every
  SparseCore, the SparseCores one after the other (a barrier never spans SparseCores). At most
  one SparseCore's subcores are in flight per device: 16 threads, each of which may hold a host
  callback blocked in a wait (XLA:CPU runs about 31 blocked callbacks at once per process:
  a barrier kernel on 2 devices at once runs, on 4 it stalls, so more is refused by name).
  With more than one SparseCore a barrier is added at the end of the body, so no subcore starts
  SparseCore c+1 before every subcore has left SparseCore c;
* each thread has its own VMEM and SMEM (the interpreter allocates them per core), as each
  subcore does on the chip; ``VMEM_SHARED`` is one buffer that the device's threads share
  (the interpreter keys it per core, as it keys VMEM: here it is keyed as HBM is, on core 0,
  and reference-counted over the threads);
* the barrier itself is, per SparseCore, a semaphore of the interpreter's (a fixed id, on
  every core of the device): each subcore signals it on every subcore's core, then waits for
  as many signals as there are subcores. The interpreter orders it with the subcore's loads,
  stores and DMAs, its vector clocks see the barrier (race detection), and a barrier that some
  subcore never reaches is the deadline watchdog's :class:`SimulationDeadlock`, naming the
  device, the interpreter core, the subcore it runs and the barrier.

A kernel with ``plsc.fetch_and_add`` and no barrier runs this way too (patch ``fetch_and_add``,
:mod:`.fetch_and_add`): the add reaches into another subcore's SMEM, which must exist apart from
its own. Kernels with neither keep the sequential path (and the fast path where it applies).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from coremesh.testing.sim import shared_vmem

#: ``fast_path_off`` of the interpret parameters of a kernel that runs this way: the
#: shared-memory set-up reads it to share VMEM_SHARED and make the barrier semaphores.
REASON = "a kernel with plsc.subcore_barrier (its subcores run on threads of their own)"

#: The fixed semaphore id of SparseCore c's barrier is BASE_ID + c (int16; the interpreter's
#: own semaphores count up from 2000, collective ids are small).
BASE_ID = 32000
MAX_SPARSECORES = 8

#: Blocked host callbacks a barrier kernel may hold at once (devices x (subcores + thread
#: map)): 2 devices x 17 run, 4 x 17 stall (jax 0.12.0.1, v5p, 2 CPUs).
MAX_BLOCKED = 34

#: The attribute on the interpreter's SharedMemory that marks a kernel run this way.
_FLAG = "_coremesh_subcore_threads"

_layout_lock = threading.Lock()
#: subcores per SparseCore -> the subcore each interpreter core (thread) runs
_subcore_of_thread: dict[int, tuple[int, ...]] = {}


def uses_barrier(jaxpr: Any) -> bool:
    """Does ``jaxpr`` (or a jaxpr inside it) call ``plsc.subcore_barrier``?"""
    from jax._src.pallas.mosaic import sc_primitives as scp

    return _calls(jaxpr, scp.barrier_p)


def _calls(jaxpr: Any, primitive: Any) -> bool:
    from coremesh.testing.sim.jaxprs import all_eqns

    return any(eqn.primitive is primitive for eqn in all_eqns(jaxpr))


def threaded_by(jaxpr: Any, enabled: frozenset[str]) -> str | None:
    """What makes a SparseCore kernel run its subcores on threads, as ``prepare``'s refusals
    name it: a barrier (patch ``subcore_barrier``), or a ``fetch_and_add``, which reaches into
    another subcore's SMEM (patches ``fetch_and_add`` and ``subcore_barrier``); None: neither."""
    from jax._src.pallas.mosaic import sc_primitives as scp

    if "subcore_barrier" not in enabled:
        return None
    if _calls(jaxpr, scp.barrier_p):
        return "plsc.subcore_barrier"
    if "fetch_and_add" in enabled and _calls(jaxpr, scp.fetch_and_add_p):
        return "plsc.fetch_and_add"
    return None


def _barrier_eqns(grid_mapping: Any) -> list[Any]:
    """The equations of a ``plsc.subcore_barrier()`` call, traced in the kernel's grid."""
    from jax.experimental.pallas import tpu_sc as plsc

    from coremesh.testing.sim import inline

    def body() -> list[Any]:
        plsc.subcore_barrier()
        return []

    return list(inline.retrace_kernel(grid_mapping, body, []).eqns)


def _swap_index_map(block_mapping: Any) -> Any:
    """A block mapping whose index map takes the grid indices as ``(subcore, core)``."""
    closed = block_mapping.index_map_jaxpr
    jaxpr = closed.jaxpr
    if len(jaxpr.invars) < 2:
        return block_mapping
    invars = [jaxpr.invars[1], jaxpr.invars[0], *jaxpr.invars[2:]]
    return block_mapping.replace(index_map_jaxpr=closed.replace(jaxpr=jaxpr.replace(invars=invars)))


def _thread_layout(grid: tuple[int, ...], params: Any) -> tuple[int, ...]:
    """The subcore each interpreter core runs: the interpreter shuffles the parallel axis with
    the call's seed (``_get_randomized_grid_coordinates``); core k runs the k-th drawn."""
    import jax
    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    with (
        jax.ensure_compile_time_eval(),
        sharding_impls._internal_use_concrete_mesh(mesh_lib.empty_concrete_mesh),
        mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh),
    ):
        coords = ipc._get_randomized_grid_coordinates(grid, params, None)
    return tuple(int(s) for s in np.asarray(coords[0]))


def prepare(
    mesh: Any, interpret_params: Any, kw: dict[str, Any], what: str = "plsc.subcore_barrier"
) -> Any:
    """The interpret parameters for a SparseCore kernel with a barrier (or ``what``, another
    primitive that needs the subcores apart: ``kw``, the other keywords of
    ``interpret_pallas_call``, are updated in place): its subcores on threads."""
    from jax._src.pallas.mosaic import core as mosaic_core

    from coremesh.testing.sim import core_semaphores
    from coremesh.testing.sim.chip import current
    from coremesh.testing.sim.errors import NotSimulatedError

    gm = kw["grid_mapping"]
    names = tuple(gm.grid_names or ())
    grid = tuple(gm.grid)
    subcore_name = getattr(mesh, "subcore_axis_name", None)
    if (
        not hasattr(interpret_params, "fast_path_off")
        or len(names) != 2
        or names[1] != subcore_name
        or not all(isinstance(g, int) for g in grid)
        or grid[0] > MAX_SPARSECORES
    ):
        raise NotSimulatedError(
            f"{what} in this kernel is not simulated",
            rule=f"the simulator runs {what} in a kernel over a VectorSubcoreMesh (grid "
            f"(core, subcore)); this kernel's grid is {tuple(zip(names, grid, strict=False))}",
            chip=current().name,
            fix="check the kernel with the compile-only target (coremesh.testing.aot)",
        )
    cores, subcores = grid
    devices = devices_at_once()
    if devices > devices_that_fit(subcores):
        raise NotSimulatedError(
            f"{what} in a kernel run on {devices} devices at once is not simulated",
            rule=f"each device runs its {subcores} subcores on threads, each of which may hold a "
            "blocked host callback (plus the device's thread map); XLA:CPU runs only about 31 "
            f"blocked callbacks at once per process, and {devices} x {subcores + 1} of them "
            "stall (measured: 2 devices run, 4 stall and end as a false deadlock)",
            chip=current().name,
            fix="run the kernel on at most "
            f"{max(devices_that_fit(subcores), 1)} device(s) (outside shard_map, or a smaller "
            "mesh), or check it with the compile-only target (coremesh.testing.aot)",
        )
    body = kw["jaxpr"]
    if cores > 1:  # no subcore starts SparseCore c+1 before all have left SparseCore c
        body = body.replace(eqns=[*body.eqns, *_barrier_eqns(gm)])
    gm = gm.replace(
        grid=(subcores, cores),
        grid_names=(names[1], names[0]),
        block_mappings=tuple(_swap_index_map(bm) for bm in gm.block_mappings),
    )
    kw["jaxpr"], kw["grid_mapping"] = body, gm
    own = core_semaphores.per_core(body, gm)  # each (SparseCore, subcore) its own semaphores
    if own is not None:
        kw["jaxpr"], kw["grid_mapping"] = own
    params = kw["compiler_params"] or mosaic_core.CompilerParams()
    kw["compiler_params"] = params.replace(dimension_semantics=("parallel", "arbitrary"))
    layout = _thread_layout((subcores, cores), kw["compiler_params"])
    with _layout_lock:
        _subcore_of_thread[subcores] = layout
    # VMEM_SHARED is one buffer for the subcores (threads) of a device, keyed on core 0.
    shared = shared_vmem.table_for(interpret_params, [0] * subcores)
    return _replace(interpret_params, num_cores_or_threads=subcores, random_seed=None, **shared)


def devices_that_fit(threads: int) -> int:
    """How many devices may run a kernel of ``threads`` threads a device at once: each thread
    and each device's thread map may hold a blocked callback, :data:`MAX_BLOCKED` in all (0:
    not even one device)."""
    return MAX_BLOCKED // (threads + 1)


def devices_at_once() -> int:
    """The devices the kernel runs on at once (the product of the traced device axes, as the
    interpreter counts them)."""
    import math

    from jax._src import core as jax_core

    return int(math.prod(jax_core.get_axis_env().axis_sizes.values()))


def _replace(params: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(params, fast_path_off=REASON, **changes)


def layout(subcores: int) -> tuple[int, ...]:
    """The subcore each interpreter core runs, in a kernel of ``subcores`` subcores run this
    way (set when it was prepared)."""
    with _layout_lock:
        return _subcore_of_thread[subcores]


def describe(sem_id: int, core: int | None) -> str | None:
    """How errors name a barrier semaphore (None: not one); ``core`` is the waiting core."""
    c = sem_id - BASE_ID
    if not 0 <= c < MAX_SPARSECORES:
        return None
    text = f"the plsc.subcore_barrier of SparseCore {c}"
    if core is None:
        return text
    with _layout_lock:
        layouts = list(_subcore_of_thread.values())
    if len(layouts) == 1 and 0 <= core < len(layouts[0]):
        text += f" (interpreter core {core} runs its subcore {layouts[0][core]})"
    return text


def _active(shared_memory: Any) -> bool:
    return shared_memory is not None and bool(shared_memory.__dict__.get(_FLAG, False))


def _rewrite(jaxpr: Any, core_name: str, cores: int, subcores: int) -> tuple[Any, Any] | None:
    """``jaxpr`` with each barrier as signals and a wait on the barrier semaphores, which it
    takes as one more constant (after its own), or None when it has no barrier."""
    import jax
    from jax import lax
    from jax._src import core as jax_core
    from jax._src.pallas.mosaic import sc_primitives as scp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from coremesh.testing.sim import inline

    if not any(eqn.primitive is scp.barrier_p for eqn in jaxpr.eqns):
        return None
    sem_aval = pltpu.SemaphoreType.REGULAR((cores,)).get_ref_aval()

    def barrier(sem: Any) -> list[Any]:
        own = sem.at[lax.axis_index(core_name) if cores > 1 else 0]
        for core in range(subcores):
            pl.semaphore_signal(own, 1, core_index=core)
        pl.semaphore_wait(own, subcores)
        return []

    with jax_core.extend_axis_env_nd(((core_name, cores),)):
        traced = inline.trace_body(barrier, [sem_aval])
    sem_var = traced.invars[0]
    eqns: list[Any] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is not scp.barrier_p:
            eqns.append(eqn)
            continue
        # fresh variables for each barrier: a jaxpr binds each variable once
        local: dict[Any, Any] = {sem_var: sem_var}
        for e in traced.eqns:
            outs = [jax_core.Var(v.aval) for v in e.outvars]
            local.update(zip(e.outvars, outs, strict=True))
            eqns.append(
                e.replace(
                    invars=[
                        v if isinstance(v, jax_core.Literal) else local.get(v, v) for v in e.invars
                    ],
                    outvars=outs,
                    effects=inline._renamed(e.effects, local),
                )
            )
    ids = jax.numpy.arange(BASE_ID, BASE_ID + cores, dtype=jax.numpy.int16)
    new = jaxpr.replace(constvars=[*jaxpr.constvars, sem_var], eqns=eqns)
    return new, ids


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas.mosaic import core as mosaic_core
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim import shadow

    orig_interpret = ipc._interpret_jaxpr
    orig_init = ipc._initialize_shared_memory
    orig_allocate = ipc._allocate_buffer
    hbm = ipc.TPU_MEMORY_SPACE_IDXS[mosaic_core.MemorySpace.HBM]
    cache: dict[tuple[Any, ...], tuple[Any, Any] | None] = {}
    cache_lock = threading.Lock()
    allocate_lock = threading.Lock()  # one thread allocates and renames at a time

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        params = ctx.interpret_params
        if getattr(params, "fast_path_off", "") != REASON:
            return orig_interpret(jaxpr, *args, ctx=ctx, token=token)
        gm = ctx.grid_mapping
        subcores, cores = gm.grid
        key = (id(jaxpr), gm.grid_names[1], cores, subcores)
        with cache_lock:
            hit = cache.get(key)
            if hit is None or hit[0] is not jaxpr:
                done = _rewrite(jaxpr, gm.grid_names[1], cores, subcores)
                hit = (jaxpr, done)  # holding jaxpr keeps its id unique
                cache[key] = hit
        done = hit[1]
        if done is None:
            return orig_interpret(jaxpr, *args, ctx=ctx, token=token)
        new, ids = done
        n = len(jaxpr.constvars)
        return orig_interpret(new, *args[:n], ids, *args[n:], ctx=ctx, token=token)

    def initialize_shared_memory(*args: Any, interpret_params: Any, **kw: Any) -> Any:
        out = orig_init(*args, interpret_params=interpret_params, **kw)
        if getattr(interpret_params, "fast_path_off", "") == REASON:
            sm = ipc._get_shared_memory()
            sm.__dict__[_FLAG] = True
            for c in range(MAX_SPARSECORES):
                sm.guarantee_semaphore_with_fixed_id(BASE_ID + c)
        return out

    @functools.wraps(orig_allocate)
    def allocate_buffer(
        token: Any,
        device_id: Any,
        local_core_id: Any,
        memory_space: Any,
        val: Any,
        *a: Any,
        **kw: Any,
    ) -> Any:
        sm = ipc._shared_memory
        if not _active(sm) or ipc.TPU_MEMORY_SPACE_NAMES[int(memory_space)] != "vmem_shared":
            return orig_allocate(token, device_id, local_core_id, memory_space, val, *a, **kw)
        # Allocated as HBM is (once for the device, counted once per core), then renamed.
        with allocate_lock:
            out = orig_allocate(token, device_id, local_core_id, np.int32(hbm), val, *a, **kw)
            _rename(sm, int(out[1]), int(device_id))
        return out

    def _rename(sm: Any, buffer_id: int, device: int) -> None:
        old, new = ("hbm", buffer_id, device, 0), ("vmem_shared", buffer_id, device, 0)
        with sm.lock:
            buffer = sm.mem.pop(old, None)
            maps = sm.__dict__.get(shadow._ATTR)
            written = maps.pop(old, None) if maps is not None else None
            if buffer is not None and new not in sm.mem:
                sm.mem[new] = buffer
                if written is not None:
                    maps[new] = written

    return [
        (ipc, "_interpret_jaxpr", interpret_jaxpr),
        (ipc, "_allocate_buffer", allocate_buffer),
        *shared_vmem.targets(initialize=initialize_shared_memory),
    ]


__all__: Sequence[str] = ("REASON", "describe", "prepare", "targets", "threaded_by", "uses_barrier")
