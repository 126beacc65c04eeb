"""An SMEM array made outside the kernels of a megacore chip: one per TensorCore.

Each TensorCore has its own SMEM. An array a jitted function makes there
(``pl.empty_ref_like(pltpu.SMEM(...))``) and hands to kernels over a ``TensorCoreMesh`` of
several cores is one array per core: a value core 1 writes in one kernel is what core 1 reads in
the next, whatever core 0 wrote (JAX's ``test_smem_async_copy_megacore``). Pallas' interpreter
holds one array: every core copies it in whole and copies it out whole, so the cores' writes
overwrite each other.

Simulated so, for an SMEM ref made by ``new_ref`` in the jitted function whose every use is as
an operand of kernels over the same ``C`` > 1 TensorCores (``core_map``, ``pl.kernel``):

* before the function's refs are discharged, the ref becomes ``C`` of them, ``(C, *shape)``,
  and each kernel body uses its core's (``ref.at[lax.axis_index(axis)]``); the kernel carries
  the positions of such operands in its metadata (``CORE_LOCAL``);
* in such a kernel, the result aliased to the operand is no longer the operand's buffer but a
  result in HBM, into which each core copies its own row when the kernel ends (after the copies
  it left in flight have landed), so no core's write reaches another's row.

A ref used anywhere else (read outside a kernel, returned, passed to a kernel of one core) is
left as it is, and such kernels stay refused (``resident_aliases``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from coremesh.testing.sim import compat, inline, ref_views_eval
from coremesh.testing.sim.jaxprs import memory_space

#: Kernel metadata key: the operands (kernel input positions, comma-separated) that hold one row
#: per core.
CORE_LOCAL = "coremesh_core_local"

_KERNELS = ("core_map", "mpmd_map")


def _mesh_cores(eqn: Any) -> tuple[str, int] | None:
    """(axis, cores) of a kernel equation over a ``TensorCoreMesh`` of several cores."""
    if eqn.primitive.name == "core_map":
        mesh = eqn.params["mesh"]
    elif eqn.primitive.name == "mpmd_map" and len(eqn.params["meshes"]) == 1:
        (mesh,) = eqn.params["meshes"]
    else:
        return None
    found = compat.tensorcore_cores(mesh)
    return found if found is not None and found[1] > 1 else None


def _core_local(jaxpr: Any) -> dict[Any, int]:
    """The SMEM refs ``jaxpr`` makes whose every use is as an operand of kernels over the same
    number of TensorCores (more than one), with that number."""
    from jax._src import core as jax_core

    made = {
        e.outvars[0]
        for e in jaxpr.eqns
        if e.primitive is jax_core.ref_p and memory_space(e.outvars[0].aval) == "smem"
    }
    if not made:
        return {}
    cores: dict[Any, int] = {}
    left_alone: set[Any] = {v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal)}
    for eqn in jaxpr.eqns:
        used = [v for v in eqn.invars if not isinstance(v, jax_core.Literal) and v in made]
        if not used:
            continue
        mesh = _mesh_cores(eqn)
        for v in used:
            if mesh is None or cores.setdefault(v, mesh[1]) != mesh[1]:
                left_alone.add(v)
    return {v: c for v, c in cores.items() if v not in left_alone}


def _trace(fn: Callable[..., list[Any]], avals: Sequence[Any], axis: tuple[str, int]) -> Any:
    """``fn`` (a kernel body over refs) as an open jaxpr, inside the mesh's axis."""
    from jax._src import config
    from jax._src import core as jax_core

    with config.mutable_array_checks(False), jax_core.extend_axis_env_nd([axis]):
        return inline.trace_body(fn, avals)


def _kernel_rule(plan: dict[Any, int]) -> ref_views_eval.Rule:
    """A ``core_map`` / ``mpmd_map`` rule: a kernel handed widened refs gets a body that uses
    its core's row of each, and says which operands those are."""

    def rule(eqn: Any, invals: list[Any]) -> Any:
        from jax._src import core as jax_core
        from jax._src import frozen_dict

        local = [
            i for i, v in enumerate(eqn.invars) if not isinstance(v, jax_core.Literal) and v in plan
        ]
        if not local:
            params = eqn.primitive.get_bind_params(eqn.params)
            return eqn.primitive.bind(*invals, **params)
        axis, cores = _mesh_cores(eqn) or ("", 0)
        avals = [jax_core.typeof(x) for x in invals]
        is_core_map = eqn.primitive.name == "core_map"
        body = eqn.params["jaxpr"] if is_core_map else eqn.params["jaxprs"][0]
        inner, consts = getattr(body, "jaxpr", body), list(getattr(body, "consts", ()))

        def per_core(*refs: Any) -> list[Any]:
            from jax import lax

            core = lax.axis_index(axis)
            views = [r.at[core] if i in local else r for i, r in enumerate(refs)]
            if is_core_map:  # the refs are the body's constvars (jax 0.10)
                return ref_views_eval.eval_jaxpr(inner, views, [])
            return ref_views_eval.eval_jaxpr(inner, consts, views)

        new = _trace(per_core, avals, (axis, cores))
        metadata = dict(eqn.params.get("metadata") or {})
        metadata[CORE_LOCAL] = ",".join(map(str, local))
        params = {**eqn.params, "metadata": frozen_dict.FrozenDict(metadata)}
        if is_core_map:
            params["jaxpr"] = new.replace(constvars=new.invars, invars=[])
        else:
            closed = compat.closed_jaxpr_class()
            params["jaxprs"] = (closed(new, ()) if isinstance(body, closed or ()) else new,)
        params = eqn.primitive.get_bind_params(params)
        return eqn.primitive.bind(*invals, **params)

    return rule


def _new_ref_rule(plan: dict[Any, int]) -> ref_views_eval.Rule:
    """``new_ref``: a widened ref starts as its initial value on every core."""

    def rule(eqn: Any, invals: list[Any]) -> Any:
        from jax import lax

        (init,) = invals
        cores = plan.get(eqn.outvars[0])
        if cores is not None:
            shape = (cores, *init.shape)
            init = lax.broadcast_in_dim(init, shape, tuple(range(1, len(shape))))
        return eqn.primitive.bind(init, **eqn.params)

    return rule


def widened(closed: Any) -> Any | None:
    """``closed`` (a jitted function's jaxpr, before its refs are discharged) with its
    core-local SMEM refs widened (see the module); None if it has none."""
    jaxpr = getattr(closed, "jaxpr", closed)
    plan = _core_local(jaxpr)
    if not plan:
        return None
    consts = list(getattr(closed, "consts", ()))
    own = {"new_ref": _new_ref_rule(plan), **dict.fromkeys(_KERNELS, _kernel_rule(plan))}
    avals = [v.aval for v in jaxpr.invars]

    def run(*args: Any) -> list[Any]:
        return ref_views_eval.eval_jaxpr(jaxpr, consts, args, own)

    from jax._src import api_util, config
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe

    debug = jaxpr.debug_info or api_util.debug_info("coremesh core-local SMEM", run, avals, {})
    with config.mutable_array_checks(False):
        new, _, new_consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(run, debug_info=debug), avals)
    closed_class = compat.closed_jaxpr_class()
    if closed_class is not None:
        return closed_class(new, new_consts)
    return compat.with_consts(new, new_consts)


def local_operands(kw: dict[str, Any]) -> frozenset[int]:
    """The kernel input positions a kernel's metadata names core-local."""
    text = dict(kw.get("metadata") or {}).get(CORE_LOCAL, "")
    return frozenset(int(i) for i in text.split(",") if i)


def _body(jaxpr: Any, pairs: Sequence[tuple[int, int]], axis: str) -> Callable[..., list[Any]]:
    def body(*refs: Any) -> list[Any]:
        import jax
        from jax.experimental.pallas import tpu as pltpu

        kernel_refs = list(refs)
        for operand, result in pairs:
            kernel_refs[result] = refs[operand]
        inline.eval_kernel(jaxpr, kernel_refs)
        core = jax.lax.axis_index(axis)
        for operand, result in pairs:
            pltpu.sync_copy(refs[operand].at[core], refs[result].at[core])
        return []

    return body


def rewrite(kw: dict[str, Any]) -> dict[str, Any] | None:
    """``kw`` for a kernel with core-local operands, each one's aliased result made a result in
    HBM that each core copies its row to (see the module); None for any other kernel."""
    from jax.experimental import pallas as pl

    local = local_operands(kw)
    if not local:
        return None
    gm = kw["grid_mapping"]
    jaxpr = kw["jaxpr"]
    first = gm.num_index_operands
    axis, cores = compat.tensorcore_cores(kw.get("mesh")) or ("", 0)
    pairs = []
    aliases = []
    for k, o in kw["input_output_aliases"]:
        if k - first in local:
            pairs.append((k, first + gm.num_inputs + o))
        else:
            aliases.append((k, o))
    if not pairs:
        return None
    avals = [v.aval for v in jaxpr.invars]
    for operand, _ in pairs:
        aval = avals[operand]
        if memory_space(aval) != "smem" or not aval.shape or aval.shape[0] != cores:
            from coremesh.testing.sim.chip import current
            from coremesh.testing.sim.errors import NotSimulatedError

            raise NotSimulatedError(
                f"kernel operand {operand - first} was made one row per core ({cores} cores) "
                f"but reached the interpreter as {aval}",
                rule="a core-local SMEM operand reaches the kernel as (cores, *shape) in SMEM",
                chip=current().name,
                fix="report this kernel to coremesh; meanwhile keep the array in HBM and copy "
                "it into SMEM scratch in each kernel",
            )
    block_mappings = list(gm.block_mappings)
    for _, result in pairs:
        aval = avals[result]
        avals[result] = pl.ANY(tuple(aval.shape), aval.dtype).get_ref_aval()
        block_mappings[result - first] = block_mappings[result - first].replace(
            **{compat.block_aval_field(): avals[result]}
        )
    new_gm = gm.replace(block_mappings=tuple(block_mappings))
    new_jaxpr = inline.retrace_kernel(gm, _body(jaxpr, pairs, str(axis)), avals)
    return {
        **kw,
        "jaxpr": new_jaxpr,
        "grid_mapping": new_gm,
        "input_output_aliases": tuple(aliases),
    }


def targets() -> list[tuple[Any, str, Any]]:
    """The state discharge (the widening) and the interpreter's kernel entry (the rows'
    copies)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
    from jax._src.state import discharge

    orig_discharge = discharge.discharge_state
    orig_call = ipc.interpret_pallas_call

    def discharge_state(jaxpr: Any, *args: Any, **kw: Any) -> Any:
        return orig_discharge(widened(jaxpr) or jaxpr, *args, **kw)

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        return orig_call(*args, **(rewrite(kw) or kw))

    return [
        (discharge, "discharge_state", discharge_state),
        (ipc, "interpret_pallas_call", interpret_pallas_call),
    ]
