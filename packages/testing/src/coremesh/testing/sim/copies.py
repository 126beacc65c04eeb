"""Copies by a load and a store: ``o_ref[...] = acc_ref[...]`` hands on what it loads.

The shadow map (:mod:`coremesh.testing.sim.shadow`) counts a DMA as a copy, not a use: its
destination takes the states of its source. A kernel copies with a load and a store too, often
through a cast or a reshape (JAX's ``ragged_paged_attention`` ends with ``o_ref[...] =
acc_ref[...].astype(q_ref.dtype)``, rows of ``acc_ref`` included that it never wrote and its
caller never reads). The values cannot tell such a copy from arithmetic (``max`` and ``neg``
keep the tagged NaN, a cast to bfloat16 drops it), so each jaxpr level the interpreter runs is
read for its dataflow: a store whose value is a load of a ref, directly or through operations
that move each element unchanged to one or more places (``convert_element_type``,
``reshape``, ``squeeze``, ``broadcast_in_dim``, ``transpose``, ``slice``, ``rev``, a
same-width ``bitcast_convert_type``, ``copy``, and a ``jit`` of those), has its source info
replaced by a :class:`StoreSource` naming the load (a :class:`LoadSource`) and the map from the
load's elements to the stored ones. The interpreter hands both to the shared memory with the
access; the shadow records the load's states per core and the store writes them, moved as the
elements were, in place of "written" or "computed from unwritten memory".

A store that merges a computed value into the place it loaded (``out[...] = select(mask, acc,
out[...])``, JAX's megablox gmm) copies that load where the select takes it: such a store's
value is a ``select_n`` with one case a load of the same ref at the same indices, moved
unchanged, and its :class:`StoreSource` is marked ``merge``. The shadow then keeps the states
of the elements the store leaves bit for bit as they were (gmm's first group shard leaves the
rows of other groups unwritten, and the next shard fills them) and marks the others as any
store's. A computed element that happens to equal what it replaces, the tagged NaN included,
counts as left as it was: an element computed from unwritten memory and merged over one
nobody wrote holds the fill, as a never-written element does.

A load whose value goes nowhere but into such copies is no use of it either
(``LoadSource.copy_only``): unwritten integer memory it reads raises nothing there. What it
reads from a DMA still in flight is checked as any load is. Loads and stores through
``ref.reshape`` / ``transpose`` / ``bitcast`` views, and dataflow that crosses a jaxpr level
(a value loaded outside a loop and stored inside), are left as they were: the store counts as a
computation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax._src import source_info_util

from coremesh.testing.sim.jaxprs import PerJaxpr

#: Maps a load's states (one per element it loaded) to the states of the value derived from it.
Move = Callable[[np.ndarray], np.ndarray]


class LoadSource(source_info_util.SourceInfo):  # type: ignore[misc]
    """A load's source info, for a load some store copies: the shape it loads, whether its
    value goes into copies only, and per (device, core) the states it last loaded (the shadow
    records them; a store of the copy follows its load on the same core)."""

    __slots__ = ("copy_only", "shape", "states")

    def __init__(self, info: Any, shape: tuple[int, ...], copy_only: bool) -> None:
        super().__init__(info.traceback, info.name_stack)
        self.shape = shape
        self.copy_only = copy_only
        self.states: dict[tuple[int, int], np.ndarray] = {}


class StoreSource(source_info_util.SourceInfo):  # type: ignore[misc]
    """A store's source info, for a store whose value is a copy of ``load``'s: ``move`` takes
    the load's states to the stored value's, of ``shape``; ``merge``: only where the value
    leaves memory as it was (a select between the load of the same place and a computation)."""

    __slots__ = ("load", "merge", "move", "shape")

    def __init__(
        self,
        info: Any,
        load: LoadSource,
        move: Move,
        shape: tuple[int, ...],
        *,
        merge: bool = False,
    ) -> None:
        super().__init__(info.traceback, info.name_stack)
        self.load = load
        self.move = move
        self.shape = shape
        self.merge = merge


def _same(states: np.ndarray) -> np.ndarray:
    return states


def _then(first: Move, second: Move) -> Move:
    if first is _same:
        return second
    if second is _same:
        return first
    return lambda states: second(first(states))


def _shape(var: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in var.aval.shape)


def _broadcast(dims: tuple[int, ...], shape: tuple[int, ...]) -> Move:
    def move(states: np.ndarray) -> np.ndarray:
        kept = [1] * len(shape)
        for axis, dim in enumerate(dims):
            kept[dim] = states.shape[axis]
        return np.broadcast_to(states.reshape(kept), shape)

    return move


def _slice(starts: Any, limits: Any, strides: Any) -> Move:
    index = tuple(
        slice(int(a), int(b), int(s))
        for a, b, s in zip(starts, limits, strides or (1,) * len(starts), strict=True)
    )
    return lambda states: states[index]


def _step(eqn: Any) -> Move | None:
    """How ``eqn`` moves the elements of its first operand to its result, if it moves each one
    unchanged (a cast counts) and reads no other operand; None otherwise."""
    name = eqn.primitive.name
    if len(eqn.outvars) != 1 or not eqn.invars:
        return None
    shape = _shape(eqn.outvars[0])
    params = eqn.params
    if name in ("convert_element_type", "copy", "copy_p"):
        return _same
    if len(eqn.invars) != 1:
        return None
    if name == "bitcast_convert_type":
        return _same if _shape(eqn.invars[0]) == shape else None
    if name == "reshape" and params.get("dimensions") is None:
        return lambda states: states.reshape(shape)
    if name == "squeeze":
        return lambda states: states.reshape(shape)
    if name == "broadcast_in_dim":
        return _broadcast(tuple(int(d) for d in params["broadcast_dimensions"]), shape)
    if name == "transpose":
        permutation = tuple(int(d) for d in params["permutation"])
        return lambda states: np.transpose(states, permutation)
    if name == "slice":
        return _slice(params["start_indices"], params["limit_indices"], params.get("strides"))
    if name == "rev":
        dims = tuple(int(d) for d in params["dimensions"])
        return lambda states: np.flip(states, dims)
    return None


def _is_var(atom: Any) -> bool:
    from jax._src import core as jax_core

    return isinstance(atom, jax_core.Var)


def _inner(eqn: Any) -> Any | None:
    """The jaxpr of a ``jit`` equation (its value flows through it as through a step)."""
    if eqn.primitive.name not in ("pjit", "jit"):
        return None
    inner = eqn.params.get("jaxpr")
    return getattr(inner, "jaxpr", inner)


#: Where a value comes from: (origin, move). The origin is a load equation at a kernel's level,
#: an input's position inside a ``jit``.
Flow = dict[Any, tuple[Any, Move]]


#: The values a ``select_n`` took from origins: value -> each such origin, with its move.
Merges = dict[Any, list[tuple[Any, Move]]]


def _merged_cases(eqn: Any, flow: Flow) -> list[tuple[Any, Move]]:
    """The origins of the cases of a ``select_n`` that flow from one, at the result's shape."""
    if eqn.primitive.name != "select_n" or len(eqn.outvars) != 1:
        return []
    shape = _shape(eqn.outvars[0])
    return [flow[v] for v in eqn.invars[1:] if _is_var(v) and v in flow and _shape(v) == shape]


def _flow(
    jaxpr: Any, flow: Flow, loads: Callable[[Any], bool], merges: Merges | None = None
) -> Flow:
    """``flow`` extended over ``jaxpr``'s equations: each value that is some origin's elements
    moved unchanged. ``loads(eqn)`` says which equations start a flow of their own. Values that
    are origins' elements only where a ``select_n`` took them go into ``merges`` (when given),
    moved on through the same steps."""
    for eqn in jaxpr.eqns:
        if loads(eqn):
            flow[eqn.outvars[0]] = (eqn, _same)
            continue
        if merges is not None and (cases := _merged_cases(eqn, flow)):
            merges[eqn.outvars[0]] = cases
            continue
        if not eqn.invars:
            continue
        source = eqn.invars[0]
        step = _step(eqn)
        if step is not None and _is_var(source):
            if merges is not None and source in merges:
                merges[eqn.outvars[0]] = [(o, _then(m, step)) for o, m in merges[source]]
            elif source in flow:
                origin, move = flow[source]
                flow[eqn.outvars[0]] = (origin, _then(move, step))
            continue
        inner = _inner(eqn)
        if inner is None or not any(_is_var(v) and v in flow for v in eqn.invars):
            continue
        seeds = {
            v: (k, _same)
            for k, v in enumerate(inner.invars)
            if _is_var(eqn.invars[k]) and eqn.invars[k] in flow
        }
        inner_merges: Merges | None = None if merges is None else {}
        inner_flow = _flow(inner, dict(seeds), lambda _: False, inner_merges)
        for out, inner_out in zip(eqn.outvars, inner.outvars, strict=True):
            if not _is_var(inner_out):
                continue
            if inner_out in inner_flow:
                k, inner_move = inner_flow[inner_out]
                origin, move = flow[eqn.invars[k]]
                flow[out] = (origin, _then(move, inner_move))
            elif merges is not None and inner_merges and inner_out in inner_merges:
                outer = [
                    (flow[eqn.invars[k]], inner_move) for k, inner_move in inner_merges[inner_out]
                ]
                merges[out] = [(origin, _then(move, inner)) for (origin, move), inner in outer]
    return flow


def _parts(eqn: Any) -> tuple[Any, Any, Any, Any, Any] | None:
    """(ref, transforms, value operand or None, loaded value or None, mask or None) of a load
    or store (jax's ``get`` / ``swap``, Pallas' ``load`` / ``swap``); None for any other."""
    from jax._src import tree_util
    from jax._src.pallas import primitives as pallas_primitives
    from jax._src.state import primitives as state_primitives

    prim = eqn.primitive
    if prim is state_primitives.get_p:
        transforms = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars[1:])
        return eqn.invars[0], transforms, None, eqn.outvars[0], None
    if prim is state_primitives.swap_p:
        transforms = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars[2:])
        return eqn.invars[0], transforms, eqn.invars[1], None, None
    if prim is pallas_primitives.load_p:
        ref, transforms, mask, _ = tree_util.tree_unflatten(eqn.params["args_tree"], eqn.invars)
        return ref, transforms, None, eqn.outvars[0], mask
    if prim is pallas_primitives.swap_p:
        ref, transforms, value, mask = tree_util.tree_unflatten(eqn.params["args_tree"], eqn.invars)
        return ref, transforms, value, None, mask
    return None


def _place(eqn: Any) -> tuple[Any, ...]:
    """What a plain load or store addresses: its ref and its indices, as written (the same
    variables, or literals of the same values, in the same structure)."""
    from jax._src import tree_util

    parts = _parts(eqn)
    assert parts is not None  # a plain access (_plain_access)
    ref, transforms = parts[0], parts[1]
    leaves, structure = tree_util.tree_flatten(transforms)
    atoms = tuple(id(a) if _is_var(a) else repr(a.val) for a in leaves)
    return id(ref), atoms, str(structure)


def _plain_access(eqn: Any) -> tuple[Any, Any] | None:
    """(value operand or None, loaded value or None) of a load or store whose transforms are all
    indices and that has no mask; None for any other equation."""
    from jax._src.state import indexing

    parts = _parts(eqn)
    if parts is None:
        return None
    _ref, transforms, value, loaded, mask = parts
    if mask is not None:
        return None
    if not all(isinstance(t, indexing.NDIndexer) for t in transforms or ()):
        return None
    return value, loaded


def _uses(jaxpr: Any) -> dict[Any, list[Any]]:
    """The equations that read each variable (``None`` for the level's results)."""
    uses: dict[Any, list[Any]] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if _is_var(v):
                uses.setdefault(v, []).append(eqn)
    for v in jaxpr.outvars:
        if _is_var(v):
            uses.setdefault(v, []).append(None)
    return uses


def tag(jaxpr: Any) -> Any | None:
    """``jaxpr`` with its copies by load and store marked (source infos :class:`LoadSource` and
    :class:`StoreSource`), or None when it has none."""
    accesses = {id(e): a for e in jaxpr.eqns if (a := _plain_access(e)) is not None}
    merges: Merges = {}
    flow = _flow(jaxpr, {}, lambda e: id(e) in accesses and accesses[id(e)][1] is not None, merges)
    copies: dict[int, tuple[Any, Move]] = {}  # store equation -> (load equation, move)
    merging: set[int] = set()  # the stores among them that merge into the place they loaded
    for eqn in jaxpr.eqns:
        access = accesses.get(id(eqn))
        value = access[0] if access is not None else None
        if value is None or not _is_var(value):
            continue
        if value in merges:  # a select of loads and computations: a copy of the same place's
            here = _place(eqn)
            same = [(o, m) for o, m in merges[value] if _place(o) == here]
            if len(same) == 1 and same[0][0] is not eqn:
                copies[id(eqn)] = same[0]
                merging.add(id(eqn))
            continue
        if value not in flow:
            continue
        load, move = flow[value]
        if load is not eqn:
            copies[id(eqn)] = (load, move)
    if not copies:
        return None
    copied = {id(load) for load, _ in copies.values()}
    sources: dict[int, LoadSource] = {}
    uses = _uses(jaxpr)
    eqns = []
    for eqn in jaxpr.eqns:
        new = eqn
        if id(eqn) in copied:
            source = LoadSource(
                eqn.source_info, _shape(eqn.outvars[0]), _copy_only(eqn, uses, flow, copies)
            )
            sources[id(eqn)] = source
            new = eqn.replace(source_info=source)
        elif id(eqn) in copies:
            load, move = copies[id(eqn)]
            value = accesses[id(eqn)][0]
            new = eqn.replace(
                source_info=StoreSource(
                    eqn.source_info,
                    sources[id(load)],
                    move,
                    _shape(value),
                    merge=id(eqn) in merging,
                )
            )
        eqns.append(new)
    return jaxpr.replace(eqns=eqns)


def _copy_only(
    load: Any, uses: dict[Any, list[Any]], flow: Flow, copies: dict[int, tuple[Any, Move]]
) -> bool:
    """Does ``load``'s value reach only copying stores (through steps that move it)?"""
    stack = [load.outvars[0]]
    while stack:
        var = stack.pop()
        for eqn in uses.get(var, ()):
            if eqn is not None and id(eqn) in copies and copies[id(eqn)][0] is load:
                value = _plain_access(eqn)
                if value is not None and value[0] is var:
                    continue  # the stored value (a store's indices are a use)
                return False
            if eqn is None or len(eqn.outvars) != 1 or eqn.invars[0] is not var:
                return False
            out = eqn.outvars[0]
            if out not in flow or flow[out][0] is not load or _step(eqn) is None:
                return False
            if any(v is var for v in eqn.invars[1:]):
                return False
            stack.append(out)
    return True


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's per-level jaxpr evaluation."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    orig = ipc._interpret_jaxpr
    tagged = PerJaxpr(tag)

    def interpret_jaxpr(jaxpr: Any, *args: Any, ctx: Any, token: Any) -> Any:
        done = tagged(jaxpr)
        return orig(jaxpr if done is None else done, *args, ctx=ctx, token=token)

    return [(ipc, "_interpret_jaxpr", interpret_jaxpr)]
