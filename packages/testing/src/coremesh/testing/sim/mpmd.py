"""MPMD kernels (``pl.kernel`` over several meshes) as one interpreted kernel.

On a TPU, Mosaic lowers the bodies of an MPMD kernel into one module, one function per mesh
(``pallas_call_registration.mpmd_map_tpu_lowering_rule``), and the SparseCore runs them at once:
the vector subcores one body, the scalar subcores another, on the same operands, outputs and
scratch. A scratch semaphore tied to a mesh (``pltpu.SemaphoreType.REGULAR(()) @ v_mesh``) is one
semaphore per core of that mesh; a body signals another mesh's semaphore by naming its cores in
``device_id`` (``lowering._device_id_to_logical``: an axis left out is the signaller's own, and
addressing vector subcores from a scalar subcore must name the subcore axis). jax's CPU lowering
(``mpmd._mpmd_map_fallback_lowering``) refuses more than one body.

Here the bodies are one kernel on a grid ``(body, *axes of all meshes)``. Its first axis, and
the core axis every mesh leads with (a SparseCore mesh's ``core``), are parallel and split over
one interpreter core (a thread) per body and core: each core of each mesh runs on its own thread,
concurrently with the others, and the subcores of a vector-subcore mesh run one after the other
as the grid steps of that thread (as they do in the simulator's SparseCore kernels; a step whose
coordinates lie outside the body's mesh does nothing). So a barrier across the cores of the
meshes (each signals every core, then waits) runs as on the chip; with the cores one after the
other on a body's thread it was a false deadlock. A semaphore tied to a mesh is allocated with
one element per core of that mesh; a wait, read or signal takes the element of the core it names,
and a signal goes to the interpreter core that runs that body's core. So bodies that wait for one
another make progress, and a wait nothing can meet is the watchdog's named deadlock. Each thread
may hold a blocked host callback, and XLA:CPU runs only about 31 at once per process: a kernel
whose devices x threads exceed what was measured to run is refused by name.

Refused by name: scratch in ``VMEM_SHARED`` that more than one body uses (each interpreter core
has its own), DMAs on mesh-tied semaphores, refs tied to a mesh outside the kernel (an
asynchronous copy into a TensorCore's VMEM; in a one-body kernel too, where jax's CPU lowering
raises "External meshes are not currently supported"), and closed-over scalars.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src import tree_util
from jax._src.pallas import core as pallas_core
from jax._src.pallas import primitives as pallas_primitives
from jax._src.pallas.mosaic import core as tpu_core
from jax._src.state import types as state_types
from jax.experimental import pallas as pl

from coremesh.testing.sim import compat, inline, shared_vmem
from coremesh.testing.sim.chip import current
from coremesh.testing.sim.errors import NotSimulatedError
from coremesh.testing.sim.jaxprs import map_jaxprs, with_vars

#: The grid axis that picks the body.
BODY_AXIS = "__coremesh_mpmd_body"


_SEMAPHORE_PRIMITIVES = ("semaphore_signal", "semaphore_wait", "semaphore_read")
_DMA_PRIMITIVES = ("dma_start", "dma_wait")

_ClosedJaxpr = compat.closed_jaxpr_class()


_AOT = "check the kernel with the compile-only target (coremesh.testing.aot)"


def _refusal(
    what: str,
    why: str,
    kernel: str = " in an MPMD kernel (several body/mesh pairs)",
    fix: str = _AOT,
) -> NotSimulatedError:
    return NotSimulatedError(
        f"{what}{kernel} is not simulated", rule=why, chip=current().name, fix=fix
    )


@dataclasses.dataclass(frozen=True, eq=False)  # core_of is an array: no field-wise == or hash
class Plan:
    """The kernel's meshes, the super-mesh of their axes (the ``parallel`` ones first) and the
    interpreter core of each body and core: ``core_of[body][*coordinates on parallel]``."""

    meshes: tuple[Any, ...]
    axes: tuple[tuple[str, int], ...]
    parallel: tuple[str, ...]
    core_of: np.ndarray

    def interpreter_core(self, body: int, coords: dict[str, Any]) -> Any:
        """The interpreter core running ``body`` at ``coords`` (its parallel axes' values,
        Python ints or traced; an axis its mesh lacks, a scalar mesh's subcore, is 0)."""
        at = [coords.get(name, 0) for name in self.parallel]
        if all(isinstance(c, int) for c in at):
            return int(self.core_of[(body, *at)])
        # A select per core, not an index into the table: the body may not close over arrays.
        out: Any = 0
        for idx in np.ndindex(*self.core_of.shape[1:]):
            hit = functools.reduce(
                jnp.logical_and, [c == i for c, i in zip(at, idx, strict=True)], True
            )
            out = jnp.where(hit, int(self.core_of[(body, *idx)]), out)
        return out

    def index(self, mesh: Any) -> int:
        for k, m in enumerate(self.meshes):
            if m is mesh or m == mesh:
                return k
        raise _refusal(
            f"a ref tied to a mesh outside the kernel ({mesh})",
            "the simulator runs the kernel's own meshes; an asynchronous copy into another "
            "kernel's memory (an external mesh) is not modelled",
        )


def _tied(aval: Any) -> Any:
    space = getattr(aval, "memory_space", None)
    return space if isinstance(space, pallas_core.CoreMemorySpace) else None


def _is_semaphore_space(space: Any) -> bool:
    return space is tpu_core.MemorySpace.SEMAPHORE


def _fix_aval(aval: Any, plan: Plan) -> Any:
    """A mesh-tied semaphore as one semaphore per core of its mesh; another mesh-tied space as
    the space it wraps (each interpreter core has its own)."""
    space = _tied(aval)
    if space is None:
        return aval
    mesh = plan.meshes[plan.index(space.mesh)]
    if _is_semaphore_space(space.memory_space):
        shape = (*mesh.shape.values(), *aval.shape)
        return aval.update(
            inner_aval=aval.inner_aval.update(shape=shape), memory_space=space.memory_space
        )
    return aval.update(memory_space=space.memory_space)


def _axis(name: str) -> Any:
    return lax.axis_index(name)


def _missing_axes_error(src: Any, dest: Any, given: set[str], missing: set[str]) -> ValueError:
    # Mosaic's words (lowering.py _device_id_to_logical).
    return ValueError(
        f"When addressing {dest.core_type} from {src.core_type} and specifying axes={given} "
        f"the following axes are missing from the mesh: {missing}."
    )


def _target(
    device_id: Any, src: Any, dest: Any
) -> tuple[tuple[Any, ...], dict[Any, Any] | Any | None]:
    """The coordinates in ``dest`` a signal from a core of ``src`` names, and the device part
    of its ``device_id``; an axis left out is the signaller's own, as Mosaic resolves it."""
    named = dict(device_id) if isinstance(device_id, dict) else {}
    axes = list(dest.shape)
    if dest is not src and dest.core_type != src.core_type:
        missing = set(axes) - set(src.shape) - set(named)
        if missing:
            raise _missing_axes_error(src, dest, set(named), missing)
    coords = tuple(named.pop(a) if a in named else _axis(a) for a in axes)
    if isinstance(device_id, dict):
        rest: Any = named or None
    else:
        rest = device_id
    return coords, rest


def _at(ref: Any, coords: Sequence[Any], transforms: Any) -> Any:
    view = ref.at[tuple(coords)]
    return state_types.TransformedRef(view.ref, (*view.transforms, *transforms))


def _semaphore_rule(eqn: Any, src: Any, plan: Plan) -> Any:
    """A rule tracing ``eqn`` (a semaphore op on a mesh-tied semaphore) on the widened one."""
    dest = _tied(eqn.invars[0].aval).mesh
    name = eqn.primitive.name
    tree = eqn.params["args_tree"]

    def rule(*flat: Any, **params: Any) -> list[Any]:
        if name == "semaphore_signal":
            sem, transforms, inc, device_id, core_index = tree_util.tree_unflatten(tree, flat)
            if core_index is not None:
                raise _refusal("core_index on a mesh-tied semaphore", "name the cores in device_id")
            coords, rest = _target(device_id, src, dest)
            kind = params["device_id_type"]
            extra = {} if kind == pl.DeviceIdType.MESH else {"device_id_type": kind}
            pl.semaphore_signal(
                _at(sem, coords, transforms),
                inc,
                device_id=rest,
                core_index=plan.interpreter_core(
                    plan.index(dest), dict(zip(dest.shape, coords, strict=True))
                ),
                **extra,
            )
            return []
        if dest is not src:
            raise _refusal(
                f"a {name} on another mesh's semaphore", "a core waits on its own semaphores"
            )
        own = tuple(_axis(a) for a in dest.shape)
        if name == "semaphore_wait":
            sem, transforms, value, decrement = tree_util.tree_unflatten(tree, flat)
            pl.semaphore_wait(_at(sem, own, transforms), value, decrement=decrement)
            return []
        sem, transforms = tree_util.tree_unflatten(tree, flat)
        return [pallas_primitives.semaphore_read(_at(sem, own, transforms))]

    return rule


def _get(table: dict[Any, Any], v: Any) -> Any:
    return table.get(v, v)


def _remap_effects(effects: Any, var: Any) -> Any:
    out = set()
    for eff in effects:
        target = getattr(eff, "input", None)
        out.add(eff.replace(var(target)) if isinstance(target, jax_core.Var) else eff)
    return type(effects)(out) if not isinstance(effects, set) else out


def _fix_level(jaxpr: Any, src: Any, plan: Plan) -> Any:
    """``jaxpr`` (a body of mesh ``src``, or a jaxpr inside one) with mesh-tied refs as the
    interpreter holds them and each op on a mesh-tied semaphore addressing its element."""
    if _ClosedJaxpr is not None and isinstance(jaxpr, _ClosedJaxpr):
        return jaxpr.replace(jaxpr=_fix_level(jaxpr.jaxpr, src, plan))
    new_vars: dict[Any, Any] = {}

    def var(v: Any) -> Any:
        if isinstance(v, jax_core.Literal):
            return v
        if v not in new_vars:
            aval = _fix_aval(v.aval, plan)
            new_vars[v] = v if aval is v.aval else type(v)(aval)
        return new_vars[v]

    def nested(inner: Any) -> Any:
        return _fix_level(inner, src, plan)

    eqns: list[Any] = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        tied = [v for v in eqn.invars if not isinstance(v, jax_core.Literal) and _tied(v.aval)]
        tied_sems = [v for v in tied if _is_semaphore_space(_tied(v.aval).memory_space)]
        if name in _DMA_PRIMITIVES and tied_sems:
            raise _refusal(
                "a DMA on a mesh-tied semaphore",
                "the simulator addresses mesh-tied semaphores in signals and waits only",
            )
        if name in _SEMAPHORE_PRIMITIVES and tied_sems:
            new_in = [var(v) for v in eqn.invars]
            traced = inline.trace_body(
                lambda *a, _e=eqn: _semaphore_rule(_e, src, plan)(*a, **_e.params),
                [v.aval for v in new_in],
            )
            local = dict(zip(traced.invars, new_in, strict=True))
            for e in traced.eqns:
                eqns.append(
                    e.replace(
                        invars=[
                            v if isinstance(v, jax_core.Literal) else local.get(v, v)
                            for v in e.invars
                        ],
                        effects=_remap_effects(e.effects, functools.partial(_get, local)),
                    )
                )
            for out, new in zip(eqn.outvars, traced.outvars, strict=True):
                new_vars[out] = local.get(new, new)
            continue
        eqns.append(
            eqn.replace(
                invars=[var(v) for v in eqn.invars],
                outvars=[var(v) for v in eqn.outvars],
                params={k: map_jaxprs(p, nested) for k, p in eqn.params.items()},
                effects=_remap_effects(eqn.effects, var),
            )
        )
    return with_vars(
        jaxpr,
        constvars=[var(v) for v in jaxpr.constvars],
        invars=[var(v) for v in jaxpr.invars],
        outvars=[var(v) for v in jaxpr.outvars],
        eqns=eqns,
        effects=_remap_effects(jaxpr.effects, var),
    )


def _used(jaxpr: Any) -> set[Any]:
    from coremesh.testing.sim.jaxprs import all_eqns

    used: set[Any] = set()
    for eqn in all_eqns(jaxpr):
        used.update(v for v in eqn.invars if isinstance(v, jax_core.Var))
    return used


def _in_vmem_shared(aval: Any) -> bool:
    """Is ``aval`` a ref in VMEM_SHARED (also tied to a mesh: ``VMEM_SHARED(...) @ mesh``)?"""
    space = getattr(aval, "memory_space", None)
    space = getattr(space, "memory_space", space)  # a mesh-tied space wraps one
    return space is tpu_core.MemorySpace.VMEM_SHARED


def _shared_scratch(jaxprs: Sequence[Any], n_operands: int) -> bool:
    """Does more than one body use a scratch ref in VMEM_SHARED?"""
    used = [_used(j) for j in jaxprs]
    for i in range(n_operands, len(jaxprs[0].invars)):
        if not _in_vmem_shared(jaxprs[0].invars[i].aval):
            continue
        if sum(j.invars[i] in u for j, u in zip(jaxprs, used, strict=True)) > 1:
            return True
    return False


def _check_scoped_shared(jaxprs: Sequence[Any]) -> None:
    """VMEM_SHARED allocated in a body (``pl.run_scoped``, ``jax.empty_ref``) is refused: the
    simulator shares the kernel's VMEM_SHARED scratch between the threads of a SparseCore
    (:func:`shared_vmem_cores`), not what each body allocates for itself."""
    from coremesh.testing.sim.jaxprs import all_eqns

    for jaxpr in jaxprs:
        for eqn in all_eqns(jaxpr):
            allocated = (
                eqn.params["jaxpr"].invars if eqn.primitive.name == "run_scoped" else eqn.outvars
            )
            if any(_in_vmem_shared(v.aval) for v in allocated):
                raise _refusal(
                    "VMEM_SHARED allocated in a body (pl.run_scoped or jax.empty_ref)",
                    "the simulator shares the kernel's VMEM_SHARED scratch between the bodies "
                    "and subcores of a SparseCore, not what a body allocates itself",
                    fix="allocate it as the kernel's scratch (scratch_types=...), or " + _AOT,
                )


def shared_vmem_cores(plan: Plan) -> tuple[int, ...]:
    """For each interpreter core of the kernel, the interpreter core whose VMEM_SHARED it
    uses: the first one running the same SparseCore (its coordinate on the meshes' core axis).
    So the bodies of a SparseCore, and the subcores of a body that run on threads, share it,
    as the subcores of a SparseCore do on the chip; the interpreter keeps one per core. Empty
    when the meshes share no core axis (each body's cores then take turns on one thread)."""
    if not plan.parallel:
        return ()
    first: dict[int, int] = {}
    out = list(range(plan.core_of.size))
    for body in range(len(plan.meshes)):
        for idx in np.ndindex(*plan.core_of.shape[1:]):
            core = int(plan.core_of[(body, *idx)])
            out[core] = first.setdefault(idx[0], core)  # the core axis leads the parallel ones
    return tuple(out)


def _super_axes(meshes: Sequence[Any], lead: tuple[str, ...] = ()) -> tuple[tuple[str, int], ...]:
    """Every axis of the meshes, those of ``lead`` (the parallel ones) first."""
    axes: dict[str, int] = {}
    for mesh in meshes:
        axes.update(mesh.shape)
    return tuple((n, axes[n]) for n in lead) + tuple(
        (n, s) for n, s in axes.items() if n not in lead
    )


def _parallel_axes(jaxprs: Sequence[Any], meshes: Sequence[Any]) -> tuple[str, ...]:
    """The axes whose points run at once, each on its own thread: the core axis the meshes
    share (the first axis of each, when it is one name and size: a SparseCore mesh's
    ``core``), and after it the subcore axis of a vector-subcore mesh whose subcores signal one
    another (:func:`_subcores_signal`), which cannot take turns. Else none: each body's cores
    run one after the other."""
    firsts = {tuple(m.shape.items())[:1] for m in meshes}
    if len(firsts) != 1 or () in firsts:
        return ()
    (((core, _),),) = firsts
    subcores = _subcores_signal(jaxprs, meshes)
    return (core,) if subcores is None else (core, subcores)


def _subcores_signal(jaxprs: Sequence[Any], meshes: Sequence[Any]) -> str | None:
    """The subcore axis of a vector-subcore mesh when a body of that mesh signals a semaphore
    of it naming that axis (a subcore signalling a subcore: JAX's cross-core barriers); the
    subcores must then run at once. None when no body does."""
    from coremesh.testing.sim.jaxprs import all_eqns, device_ids

    for jaxpr, src in zip(jaxprs, meshes, strict=True):
        if len(src.shape) < 2:
            continue
        subcore = list(src.shape)[1]
        for eqn in all_eqns(jaxpr):
            if eqn.primitive.name != "semaphore_signal":
                continue
            tied = _tied(eqn.invars[0].aval) if isinstance(eqn.invars[0], jax_core.Var) else None
            if tied is None or (tied.mesh is not src and tied.mesh != src):
                continue
            if src.shape[subcore] > 1 and any(subcore in d for d in device_ids(eqn)):
                return str(subcore)
    return None


_PLACEHOLDER = "coremesh_mpmd_body_"


def _placeholder(k: int) -> Any:
    """A call the combined kernel makes where body ``k`` runs; its jaxpr is swapped for the
    body's afterwards (re-binding a body's equations would re-stage them: jax 0.12 turns a
    ``run_scoped``'s captured refs into inputs, which its interpreter then allocates)."""

    def call(*refs: Any) -> None:
        del refs

    call.__name__ = call.__qualname__ = f"{_PLACEHOLDER}{k}"
    return jax.jit(call)


def _swap_placeholders(jaxpr: Any, bodies: Sequence[Any]) -> Any:
    if _ClosedJaxpr is not None and isinstance(jaxpr, _ClosedJaxpr):
        return jaxpr.replace(jaxpr=_swap_placeholders(jaxpr.jaxpr, bodies))

    def nested(inner: Any) -> Any:
        return _swap_placeholders(inner, bodies)

    eqns = []
    for eqn in jaxpr.eqns:
        name = str(eqn.params.get("name", ""))
        if eqn.primitive.name in ("pjit", "jit") and name.startswith(_PLACEHOLDER):
            body = bodies[int(name[len(_PLACEHOLDER) :])]
            old = eqn.params["jaxpr"]
            new = old.replace(jaxpr=body) if _ClosedJaxpr is not None else body
            eqns.append(eqn.replace(params={**eqn.params, "jaxpr": new}))
            continue
        eqns.append(eqn.replace(params={k: map_jaxprs(p, nested) for k, p in eqn.params.items()}))
    return jaxpr.replace(eqns=eqns)


def combine(
    jaxprs: Sequence[Any], meshes: Sequence[Any], n_operands: int, plan: Plan, shared: bool
) -> Any:
    """One kernel jaxpr: at grid point ``(body, *axes)`` the body's jaxpr, when the point lies
    in its mesh. ``shared``: the interpreter will share VMEM_SHARED between the threads of a
    SparseCore (:func:`shared_vmem_cores`)."""
    from jax._src.pallas import mpmd as upstream

    _check_scoped_shared(jaxprs)
    if not shared and _shared_scratch(jaxprs, n_operands):
        raise _refusal(
            "VMEM_SHARED scratch used by more than one body",
            "the simulator shares it between the threads running one SparseCore when the "
            "meshes share their core axis and the kernel's interpret parameters are the "
            "simulator's; else each body's threads have their own",
            fix="leave the kernel's interpret parameters to simulate(), or " + _AOT,
        )
    fixed = []
    for jaxpr, mesh in zip(jaxprs, meshes, strict=True):
        with upstream.mpmd_map_tracing_context(mesh, tuple(meshes)):
            fixed.append(_fix_level(jaxpr, mesh, plan))
    avals = [v.aval for v in fixed[0].invars]

    def body(*refs: Any) -> list[Any]:
        which = _axis(BODY_AXIS)
        for k, mesh in enumerate(meshes):
            active = which == k
            for name, _ in plan.axes:
                if name not in mesh.shape:
                    active = active & (_axis(name) == 0)
            pl.when(active)(lambda k=k: _placeholder(k)(*refs))
        return []

    with jax_core.extend_axis_env_nd(((BODY_AXIS, len(meshes)), *plan.axes)):
        combined = inline.trace_body(body, avals)
    return _swap_placeholders(combined, fixed)


def _core_of(grid: tuple[int, ...], params: Any, parallel: int) -> np.ndarray:
    """The interpreter core that runs each point of the grid's first ``parallel`` axes (one
    point per core): the interpreter shuffles each parallel axis with the call's seed
    (``_get_randomized_grid_coordinates``) and deals the points in row-major order of their
    loop indices, so core k runs the point its k-th loop index draws."""
    from jax._src import mesh as mesh_lib
    from jax._src import sharding_impls
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    # Outside the lowering's shard_map mesh, on the host (as the interpreter computes it).
    with (
        jax.ensure_compile_time_eval(),
        sharding_impls._internal_use_concrete_mesh(mesh_lib.empty_concrete_mesh),
        mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh),
    ):
        coords = ipc._get_randomized_grid_coordinates(grid, params, None)
    shape = grid[:parallel]
    drawn = [np.asarray(coords[d]) for d in range(parallel)]
    table = np.zeros(shape, np.int64)
    for core, loop in enumerate(np.ndindex(*shape)):
        table[tuple(int(drawn[d][i]) for d, i in enumerate(loop))] = core
    return table


def _check_external(params: Any) -> None:
    """Refs tied to a mesh the kernel does not run on (a SparseCore kernel's output in a
    TensorCore's VMEM, with the DMA semaphore another kernel waits on) are refused by name."""
    external = params.get("external_meshes")
    if external:
        names = ", ".join(f"{type(m).__name__}({dict(m.shape)})" for m in external)
        raise _refusal(
            f"a kernel's ref tied to a mesh it does not run on ({names})",
            "the simulator runs a kernel's own meshes; an asynchronous copy into another "
            "kernel's memory (an external mesh), finished by a later kernel's wait, is not "
            "modelled",
            kernel="",  # one body or several
        )


def _check_bodies(jaxprs: Sequence[Any], meshes: Sequence[Any], params: Any) -> None:
    """Refuse what Mosaic's SparseCore lowering refuses in a body, as for a kernel over that
    mesh alone (the combined kernel has no mesh to tell it by)."""
    from coremesh.testing.sim.refusals import kernel_label
    from coremesh.testing.sim.sc_ops import check_subcore_kernel

    for jaxpr, mesh in zip(jaxprs, meshes, strict=True):
        check_subcore_kernel(
            jaxpr,
            mesh,
            label=kernel_label(jaxpr, params.get("name")),
            chip=current().name,
            compiler_params=params["compiler_params"],
        )


def _check_threads(threads: int) -> None:
    """Refuse a kernel whose threads, on all the devices it runs on at once, could hold more
    blocked host callbacks than XLA:CPU runs (a stall, seen as a false deadlock)."""
    from coremesh.testing.sim.subcore_barrier import MAX_BLOCKED, devices_at_once, devices_that_fit

    devices, fit = devices_at_once(), devices_that_fit(threads)
    if devices > fit:
        raise _refusal(
            f"a kernel of {threads} threads run on {devices} device(s) at once",
            f"each device runs each core of each body on a thread, each of which may hold a "
            f"blocked host callback (plus the device's thread map); XLA:CPU runs only about 31 "
            f"blocked callbacks at once per process, and {devices} x {threads + 1} of them stall",
            fix=(
                f"run the kernel on at most {fit} device(s) (outside "
                f"shard_map, or a smaller mesh), or {_AOT}"
                if fit
                else f"use meshes of fewer cores or subcores (at most {MAX_BLOCKED - 1} threads "
                f"a device: bodies x cores, x subcores where they signal one another), or {_AOT}"
            ),
        )


def lower(ctx: Any, *in_nodes: Any, **params: Any) -> Any:
    """The CPU lowering of an MPMD kernel: one interpreted kernel, a thread per core of each
    body (per subcore too where subcores signal one another)."""
    from jax._src import tree_util as tu
    from jax._src.pallas import pallas_call
    from jax._src.state import types as st

    meshes, jaxprs = tuple(params["meshes"]), params["jaxprs"]  # external ones refused: targets()
    out_avals = params["out_avals"]
    n_in = len(in_nodes)
    if any(
        isinstance(v.aval, jax_core.ShapedArray) and not v.aval.shape
        for v in jaxprs[0].invars[:n_in]
    ):
        raise _refusal("a closed-over scalar", "only ref operands are passed to MPMD bodies")
    _check_bodies(jaxprs, meshes, params)
    parallel = _parallel_axes(jaxprs, meshes)
    axes = _super_axes(meshes, parallel)
    grid = (len(meshes), *(size for _, size in axes))
    semantics = ("parallel", *("parallel" if n in parallel else "arbitrary" for n, _ in axes))
    compiler_params = params["compiler_params"] or tpu_core.CompilerParams()
    compiler_params = compiler_params.replace(dimension_semantics=semantics)
    plan = Plan(meshes, axes, parallel, _core_of(grid, compiler_params, 1 + len(parallel)))
    interpret = params["interpret"]
    shared = shared_vmem.table_for(interpret, shared_vmem_cores(plan))
    jaxpr = combine(jaxprs, meshes, n_in + len(out_avals), plan, bool(shared))  # Mosaic's 1st
    threads = plan.core_of.size  # one per point of the parallel axes
    _check_threads(threads)

    default = meshes[0].default_memory_space

    def spec(aval: Any) -> Any:
        space = aval.memory_space if isinstance(aval, jax_core.ShapedArray) else None
        keep = space is not None and not isinstance(space, jax_core.MemorySpace)
        return pallas_core.BlockSpec(memory_space=space if keep else default)

    n_scratch = len(jaxpr.invars) - n_in - len(out_avals)
    scratch = [v.aval for v in jaxpr.invars[len(jaxpr.invars) - n_scratch :]] if n_scratch else []
    grid_spec = pallas_core.GridSpec(
        grid=((BODY_AXIS, len(meshes)), *axes),
        in_specs=tuple(spec(a) for a in ctx.avals_in),
        out_specs=tuple(spec(a) for a in out_avals),
        scratch_shapes=tuple(pallas_core.MemoryRef(a.inner_aval, a.memory_space) for a in scratch),
    )

    def inner(v: Any) -> Any:
        return v.aval.inner_aval if isinstance(v.aval, st.AbstractRef) else v.aval

    _, grid_mapping = pallas_core.get_grid_mapping(
        grid_spec,
        [inner(v) for v in jaxpr.invars[:n_in]],
        tu.tree_structure(in_nodes),
        [f"arg{i}" for i in range(n_in)],
        [inner(v) for v in jaxpr.invars[n_in : n_in + len(out_avals)]],
        tu.tree_structure(out_avals),
        [f"out{i}" for i in range(len(out_avals))],
        debug=params["debug"],
    )
    changes: dict[str, Any] = {"num_cores_or_threads": threads, "random_seed": None, **shared}
    if hasattr(interpret, "fast_path_off"):
        changes["fast_path_off"] = "an MPMD kernel (its bodies' cores run on threads of their own)"
    interpret = dataclasses.replace(interpret, **changes)
    return pallas_call._pallas_call_lowering(
        ctx,
        *in_nodes,
        jaxpr=jaxpr,
        grid_mapping=grid_mapping,
        mesh=None,
        input_output_aliases=tuple(params["input_output_aliases"].items()),
        debug=params["debug"],
        interpret=interpret,
        compiler_params=compiler_params,
        cost_estimate=params["cost_estimate"],
        out_avals=out_avals,
        metadata=params["metadata"],
        name=params["name"],
    )


def targets() -> list[tuple[Any, str, Any]]:
    from jax._src.pallas import mpmd as upstream

    orig = upstream._mpmd_map_fallback_lowering

    def fallback_lowering(ctx: Any, *in_nodes: Any, **params: Any) -> Any:
        # Upstream (mpmd.py _mpmd_map_fallback_lowering) raises NotImplementedError for more
        # than one mesh/function pair on CPU, interpret mode included, and for external meshes.
        _check_external(params)
        if len(params["jaxprs"]) > 1:
            return lower(ctx, *in_nodes, **params)
        return orig(ctx, *in_nodes, **params)

    return [(upstream, "_mpmd_map_fallback_lowering", fallback_lowering), *shared_vmem.targets()]
