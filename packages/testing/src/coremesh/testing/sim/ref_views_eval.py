"""Evaluating a jaxpr traced on plain refs with views of refs (``buffer.at[slot]``) in their
place, into the current trace.

A view is a ``TransformedRef``: a base ref and the transforms (indexers, ...) that select from
it. No JAX primitive takes one; a kernel body written in Python folds a view's transforms into
each access as it traces (``x_ref.at[i][...]`` is one ``get`` of ``x_ref`` through two
indexers). :func:`eval_jaxpr` does that fold for a jaxpr: an equation that reads, writes,
copies or signals through a view gets the view's transforms put in front of its own; a loop,
conditional, ``jit`` or ``run_scoped`` that is handed a view has its body evaluated the same
way inside it. An equation not handed a view is bound as it is. A view reaching any other
primitive is refused by name (:class:`~coremesh.testing.sim.errors.NotSimulatedError`), never
bound wrongly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from coremesh.testing.sim import compat
from coremesh.testing.sim.errors import NotSimulatedError


def _view_type() -> Any:
    from jax._src.state import types as state_types

    return state_types.TransformedRef


def is_view(x: Any) -> bool:
    return isinstance(x, _view_type())


def fold(x: Any) -> Any:
    """A view of a view as one view of the base ref."""
    view = _view_type()
    while isinstance(x, view) and isinstance(x.ref, view):
        x = view(x.ref.ref, (*x.ref.transforms, *x.transforms))
    return x


#: A rule of the caller's own: (equation, its operands) -> its results, views or not.
Rule = Callable[[Any, list[Any]], Any]


def eval_jaxpr(
    jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], own: dict[str, Rule] | None = None
) -> list[Any]:
    """Evaluate ``jaxpr`` (open; ``consts`` for its constvars) on ``args``, any of which may be
    views, binding its equations into the current trace; returns its results. ``own`` maps
    primitive names to the caller's rules, applied at every depth."""
    from jax._src import core as jax_core
    from jax._src import source_info_util

    own = own or {}
    env: dict[Any, Any] = {}

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, jax_core.Literal) else env[atom]

    for var, val in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args], strict=True):
        env[var] = val
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        with source_info_util.user_context(
            eqn.source_info.traceback, name_stack=eqn.source_info.name_stack
        ):
            if eqn.primitive.name in own:
                out = own[eqn.primitive.name](eqn, invals)
            elif any(is_view(x) for x in invals):
                out = _through_views(eqn, invals, own)
            else:
                params = eqn.primitive.get_bind_params(eqn.params)
                with eqn.ctx.manager:
                    out = eqn.primitive.bind(*invals, **params)
            outs = list(out) if eqn.primitive.multiple_results else [out]
        for var, val in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, jax_core.DropVar):
                env[var] = val
    return [read(v) for v in jaxpr.outvars]


def _through_views(eqn: Any, invals: list[Any], own: dict[str, Rule]) -> Any:
    name = eqn.primitive.name
    if name in _ACCESSES:
        return _ACCESSES[name](eqn, invals)
    if name in _CALLS:
        return _CALLS[name](eqn, invals, own)
    names = ", ".join(sorted([*_ACCESSES, *_CALLS, *own]))
    raise NotSimulatedError(
        f"a view of a ref (ref.at[...], a pipeline buffer's slot) handed to '{name}' inside "
        "an emit_pipeline body is not simulated",
        rule=f"views reach these primitives in an emit_pipeline body: {names} (jax 0.10's "
        "interpreter has no rule for the emit_pipeline primitive; coremesh runs it as jax 0.11 "
        "does)",
        fix="index the ref inside the operation instead, turn off "
        "jax_use_emit_pipeline_primitive, or use jax 0.11 or later",
    )


def _state_access(eqn: Any, invals: list[Any]) -> Any:
    """get / swap / addupdate: ``ref, [value,] *transform leaves`` with ``tree`` the
    transforms."""
    from jax._src import tree_util

    view = fold(invals[0])
    n_vals = 0 if eqn.primitive.name == "get" else 1
    vals, leaves = invals[1 : 1 + n_vals], invals[1 + n_vals :]
    transforms = (*view.transforms, *eqn.params["tree"].unflatten(leaves))
    flat, tree = tree_util.tree_flatten(transforms)
    params = {**eqn.params, "tree": tree}
    return eqn.primitive.bind(view.ref, *vals, *flat, **params)


def _ref_and_transforms_first(eqn: Any, invals: list[Any]) -> Any:
    """Pallas' masked load/swap and semaphore operations: ``args_tree`` of ``[ref,
    transforms, ...]``."""
    from jax._src import tree_util

    args = list(eqn.params["args_tree"].unflatten(invals))
    view = fold(args[0])
    if is_view(view):
        args[0], args[1] = view.ref, (*view.transforms, *args[1])
    flat, tree = tree_util.tree_flatten(args)
    return eqn.primitive.bind(*flat, **{**eqn.params, "args_tree": tree})


def _dma(eqn: Any, invals: list[Any]) -> Any:
    """dma_start / dma_wait: ``tree`` flattens refs and views alike, as the primitives' own
    ``_dma_flatten`` does (``FlatTree``, from jax 0.12 in a module of its own)."""
    from jax._src.pallas.mosaic import primitives as tpu_primitives

    args = [fold(a) for a in eqn.params["tree"].unflatten(invals)]
    vals, tree = tpu_primitives._dma_flatten(*args)
    return eqn.primitive.bind(*vals, **{**eqn.params, "tree": tree})


def _on_base(eqn: Any, invals: list[Any]) -> Any:
    """A dependency on a ref (``pltpu.touch``) is one on its base ref, as ``touch`` binds it."""
    bases = [fold(x).ref if is_view(x) else x for x in invals]
    return eqn.primitive.bind(*bases, **eqn.params)


def _closed(jaxpr: Any) -> tuple[Any, list[Any]]:
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    return inner, list(getattr(jaxpr, "consts", ()))


def _run(jaxpr: Any, front: Sequence[Any], own: dict[str, Rule]) -> Callable[..., list[Any]]:
    """``jaxpr`` (closed or open) as a function of its inputs after ``front``."""
    inner, consts = _closed(jaxpr)
    return lambda *rest: eval_jaxpr(inner, consts, [*front, *rest], own)


def _cond(eqn: Any, invals: list[Any], own: dict[str, Rule]) -> Any:
    from jax import lax

    index, ops = invals[0], invals[1:]
    branches = [(lambda b=b: _run(b, ops, own)()) for b in eqn.params["branches"]]
    return lax.switch(index, branches)


def _while(eqn: Any, invals: list[Any], own: dict[str, Rule]) -> Any:
    from jax import lax

    p = eqn.params
    n_c, n_b = p["cond_nconsts"], p["body_nconsts"]
    cond_consts, body_consts, init = invals[:n_c], invals[n_c : n_c + n_b], invals[n_c + n_b :]
    cond, body = _run(p["cond_jaxpr"], cond_consts, own), _run(p["body_jaxpr"], body_consts, own)
    return lax.while_loop(lambda c: cond(*c)[0], lambda c: body(*c), list(init))


def _scan(eqn: Any, invals: list[Any], own: dict[str, Rule]) -> Any:
    from jax import lax

    p = eqn.params
    n_consts, n_carry = p["num_consts"], p["num_carry"]
    consts = invals[:n_consts]
    carry, xs = invals[n_consts : n_consts + n_carry], invals[n_consts + n_carry :]
    body = _run(p["jaxpr"], consts, own)

    def step(c: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        out = body(*c, *x)
        return out[:n_carry], out[n_carry:]

    final, ys = lax.scan(
        step, list(carry), list(xs), length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
    )
    return [*final, *ys]


def _call(eqn: Any, invals: list[Any], own: dict[str, Rule]) -> Any:
    """jit / closed_call: evaluated in line (a call boundary changes nothing a kernel does)."""
    return _run(eqn.params["jaxpr"], (), own)(*invals)


def _run_scoped(eqn: Any, invals: list[Any], own: dict[str, Rule]) -> Any:
    """run_scoped: its body traced again, the views it closes over folded in."""
    from jax._src import api_util, config
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe

    body_jaxpr = eqn.params["jaxpr"]
    avals = [v.aval for v in body_jaxpr.invars]

    def body(*allocs: Any) -> list[Any]:
        return eval_jaxpr(body_jaxpr, invals, allocs, own)

    debug = api_util.debug_info("coremesh run_scoped", body, avals, {})
    with config.mutable_array_checks(False):
        jaxpr, _, consts = pe.trace_to_jaxpr_dynamic(lu.wrap_init(body, debug_info=debug), avals)
    jaxpr = compat.with_consts(jaxpr, consts)
    return eqn.primitive.bind(*consts, **{**eqn.params, "jaxpr": jaxpr})


#: Equations that read, write, copy or signal through a ref: the view's transforms go first.
_ACCESSES: dict[str, Callable[[Any, list[Any]], Any]] = {
    "get": _state_access,
    "swap": _state_access,
    "addupdate": _state_access,
    "masked_load": _ref_and_transforms_first,
    "masked_swap": _ref_and_transforms_first,
    "semaphore_read": _ref_and_transforms_first,
    "semaphore_signal": _ref_and_transforms_first,
    "semaphore_wait": _ref_and_transforms_first,
    "dma_start": _dma,
    "dma_wait": _dma,
    "add_dependency": _on_base,
}
#: Equations with a body: it is evaluated (the same way) inside them.
_CALLS: dict[str, Callable[[Any, list[Any], dict[str, Rule]], Any]] = {
    "cond": _cond,
    "while": _while,
    "scan": _scan,
    "jit": _call,
    "pjit": _call,
    "closed_call": _call,
    "run_scoped": _run_scoped,
}
