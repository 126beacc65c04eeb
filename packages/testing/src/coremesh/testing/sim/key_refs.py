"""PRNG keys as kernel operands, results and refs: held as their key data.

Mosaic lowers kernels whose operands, results or scratch are PRNG keys (``key<pl>`` from
``pltpu.to_pallas_key``, ``key<fry>`` from ``jax.random.key(0, impl="threefry2x32")``): a key
block is its key data (uint32, the key's trailing dims), loaded into a key and stored from one
(lowering.py ``_load_lowering_rule``, ``_prng_key_load_lowering_rule``). Pallas' interpreter
holds no buffers of key dtypes: it fills a key result with NaN (``NotImplementedError: nan +
key<fry>``) and copies a key operand as a buffer ("Cannot interpret 'key<fry>' as a data type").
Inside a kernel the ``pallas_tpu`` key's sampling is the TensorCore's PRNG: ``random_bits``
seeds it with the key's words and draws (``_random_bits``), ``prng_seed`` takes a key,
``unwrap_pallas_seed`` / ``wrap_pallas_seed`` split and join its words; none of them has a CPU
lowering.

Simulated so. A kernel that takes, returns or allocates keys, or samples with ``pallas_tpu``
keys, runs rewritten (:func:`rewrite`):

* a key operand is passed as ``jax.random.key_data(key)`` and a key result comes back through
  ``jax.random.wrap_key_data``; their blocks (and key scratch) are uint32 blocks with the key's
  trailing dims whole;
* in the body, a load of a key ref (through any indexers, ``key_ref.at[0, 0][...]``) loads the
  data and wraps it, a store unwraps, and a DMA (``pltpu.sync_copy``, async copies) copies the
  data; ``run_scoped`` key scratch is data scratch;
* ``random_bits`` on a ``pallas_tpu`` key is ``prng_seed`` of its words and ``prng_random_bits``
  (what Mosaic lowers it to: the bits are the ``hardware_prng`` patch's), ``random_fold_in`` is
  jax's own ``fold_in`` of the impl, ``prng_seed`` of a key seeds with its words.

Keys of jax's own impls (threefry, rbg) sample inside the kernel as jax does outside it: the same
bits. What the chip refuses is refused as it refuses it (a ``pallas_tpu`` key loaded from VMEM,
several keys in one load); what the rewrite does not cover (a key ref through a reshape or
bitcast, in an equation it does not know) is refused (:class:`NotSimulatedError`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim import compat
from coremesh.testing.sim.errors import NotSimulatedError
from coremesh.testing.sim.jaxprs import memory_space, sub_jaxprs


def _not_simulated(what: str, chip: str) -> NotSimulatedError:
    return NotSimulatedError(
        f"a kernel with PRNG keys {what} is not simulated",
        rule="key refs are simulated as their key data: loads, stores, DMAs and run_scoped "
        "scratch of them, through indexers",
        chip=chip,
        fix="index the key ref (key_ref.at[i][...]) instead, or pass jax.random.key_data(key) "
        "(uint32) and rebuild the key in the kernel with jax.random.wrap_key_data",
    )


def _is_key(dtype: Any) -> bool:
    import jax

    return dtype is not None and bool(jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key))


def _inner(aval: Any) -> Any:
    """A ref's value aval, or the aval itself."""
    return getattr(aval, "inner_aval", aval)


def _is_key_ref(aval: Any) -> bool:
    return hasattr(aval, "inner_aval") and _is_key(getattr(aval.inner_aval, "dtype", None))


def _is_key_aval(aval: Any) -> bool:
    return _is_key(getattr(_inner(aval), "dtype", None))


def _is_pallas(impl: Any) -> bool:
    from jax._src.pallas.mosaic import random as pallas_random

    return impl is pallas_random.tpu_key_impl


def physical(aval: Any) -> Any:
    """A key aval (array or ref) as its key data's: uint32 (the impl's), trailing dims added."""
    from jax._src import core as jax_core

    if hasattr(aval, "inner_aval"):
        return aval.update(inner_aval=physical(aval.inner_aval))
    if not _is_key(getattr(aval, "dtype", None)):
        return aval
    element = jax_core.physical_element_aval(aval.dtype)
    return aval.update(shape=(*aval.shape, *element.shape), dtype=element.dtype)


@dataclasses.dataclass(frozen=True)
class _KeyRef:
    """A key ref of the old body, as the data ref standing in for it."""

    data: Any
    aval: Any  # the key ref's aval

    @property
    def dtype(self) -> Any:
        return self.aval.inner_aval.dtype


# ------------------------------------------------------------------------------------------
# Which equations need the rewrite.
# ------------------------------------------------------------------------------------------


def _pallas_key_eqn(eqn: Any) -> bool:
    """Does ``eqn`` sample, split or join ``pallas_tpu`` keys (no CPU lowering)?"""
    from jax._src.pallas.mosaic import primitives as mosaic_primitives
    from jax._src.random import prng

    prim = eqn.primitive
    if prim in (mosaic_primitives.split_key_p, mosaic_primitives.join_key_p):
        return True
    if prim is mosaic_primitives.prng_seed_p:
        return any(_is_key_aval(v.aval) for v in eqn.invars)
    if prim in (prng.random_bits_p, prng.random_fold_in_p):
        return _is_pallas(eqn.invars[0].aval.dtype._impl)
    return False


def _touches(eqn: Any) -> bool:
    if _pallas_key_eqn(eqn):
        return True
    if any(_is_key_ref(v.aval) for v in (*eqn.invars, *eqn.outvars)):
        return True
    return any(needs_rewrite(j) for j in sub_jaxprs(eqn))


def needs_rewrite(jaxpr: Any) -> bool:
    """Does ``jaxpr`` (or a jaxpr inside it) hold key refs or sample with ``pallas_tpu`` keys?"""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    if any(_is_key_ref(v.aval) for v in (*inner.constvars, *inner.invars)):
        return True
    return any(_touches(eqn) for eqn in inner.eqns)


# ------------------------------------------------------------------------------------------
# The body's evaluation with key refs as data refs.
# ------------------------------------------------------------------------------------------


class _Evaluator:
    """Re-evaluates a kernel body (inside a trace of the new one) with each key ref a
    :class:`_KeyRef`; equations that do not touch keys are bound as they are."""

    def __init__(self, chip: str) -> None:
        self.chip = chip

    # -- driving ---------------------------------------------------------------------------

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        from jax._src import core as jax_core
        from jax._src import source_info_util

        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jax_core.Literal) else env[v]

        for var, val in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args], strict=True):
            env[var] = val
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            with (
                source_info_util.user_context(
                    eqn.source_info.traceback, name_stack=eqn.source_info.name_stack
                ),
                eqn.ctx.manager,
            ):
                outs = self.eqn(eqn, ins) if _touches(eqn) else _bind(eqn, ins)
            for var, val in zip(eqn.outvars, outs, strict=True):
                env[var] = val
        return [read(v) for v in jaxpr.outvars]

    def run_closed(self, closed: Any, args: Sequence[Any]) -> list[Any]:
        return self.run(closed.jaxpr, closed.consts, args)

    def eqn(self, eqn: Any, ins: list[Any]) -> list[Any]:
        rule = _RULES.get(eqn.primitive.name)
        if rule is None:
            raise _not_simulated(f"in a {eqn.primitive.name}", self.chip)
        return rule(self, eqn, ins)

    def refuse_chip(self, what: str, rule: str, fix: str) -> UnsupportedOnChipError:
        return UnsupportedOnChipError(what, rule=rule, chip=self.chip, fix=fix)

    # -- key refs --------------------------------------------------------------------------

    def data_transforms(self, ref: _KeyRef, transforms: Sequence[Any]) -> tuple[Any, ...]:
        """``transforms`` of a key ref as transforms of its data ref (whole trailing dims)."""
        from jax._src.state import indexing

        element = _element_shape(ref.dtype)
        out = []
        for t in transforms:
            if not isinstance(t, indexing.NDIndexer):
                raise _not_simulated(f"through a {type(t).__name__} of a key ref", self.chip)
            if t.int_indexer_shape:
                raise _not_simulated("gathered by an index array", self.chip)
            out.append(
                indexing.NDIndexer(
                    (*t.indices, *(indexing.Slice(0, d) for d in element)),
                    (*t.shape, *element),
                    t.int_indexer_shape,
                )
            )
        return tuple(out)

    def check_load(self, ref: _KeyRef, loaded: Any) -> None:
        """Refuse a load of ``pallas_tpu`` keys Mosaic refuses (lowering.py
        ``_load_lowering_rule``, ``_prng_key_load_lowering_rule``)."""
        import math

        if not _is_pallas(ref.dtype._impl):
            return
        space = memory_space(ref.aval)
        if space != "smem":
            where = "VMEM (the default)" if space in ("none", "default") else space.upper()
            raise self.refuse_chip(
                f"a pallas_tpu PRNG key loaded from {where}",
                "PRNG keys must be loaded from SMEM (Mosaic: 'Did you set the memory space to "
                "MemorySpace.SMEM in the BlockSpec for the PRNG key input?')",
                "give the key's BlockSpec (or scratch) memory_space=pltpu.SMEM",
            )
        if math.prod(loaded.shape) != 1:
            raise self.refuse_chip(
                f"a load of {math.prod(loaded.shape)} pallas_tpu PRNG keys at once",
                "Mosaic loads a single key per load ('Can only load a single key per load.')",
                "load one key at a time: key_ref.at[i][...]",
            )


def _element_shape(dtype: Any) -> tuple[int, ...]:
    from jax._src import core as jax_core

    return tuple(jax_core.physical_element_aval(dtype).shape)


def _bind(eqn: Any, ins: Sequence[Any]) -> list[Any]:
    out = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))  # as eval_jaxpr
    return list(out) if eqn.primitive.multiple_results else [out]


def _wrap(data: Any, dtype: Any) -> Any:
    from jax._src.random import prng

    return prng.random_wrap(data, impl=dtype._impl)


def _unwrap(key: Any) -> Any:
    from jax._src.random import prng

    return prng.random_unwrap(key)


def _get(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    import jax

    ref, *flat = ins
    if not isinstance(ref, _KeyRef):
        return _bind(eqn, ins)
    transforms = jax.tree.unflatten(eqn.params["tree"], flat)
    new = ev.data_transforms(ref, transforms)
    new_flat, new_tree = jax.tree.flatten(new)
    data = eqn.primitive.bind(ref.data, *new_flat, **{**eqn.params, "tree": new_tree})
    key = _wrap(data, ref.dtype)
    ev.check_load(ref, key)
    return [key]


def _swap(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    import jax

    ref, val, *flat = ins
    if not isinstance(ref, _KeyRef):
        return _bind(eqn, ins)
    transforms = jax.tree.unflatten(eqn.params["tree"], flat)
    new = ev.data_transforms(ref, transforms)
    new_flat, new_tree = jax.tree.flatten(new)
    old = eqn.primitive.bind(ref.data, _unwrap(val), *new_flat, **{**eqn.params, "tree": new_tree})
    return [_wrap(old, ref.dtype)]


def _dma(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    from jax._src.pallas.mosaic import primitives as mosaic_primitives
    from jax._src.state import types as state_types

    args = mosaic_primitives._dma_unflatten(eqn.params["tree"], ins)

    def data(x: Any) -> Any:
        if isinstance(x, _KeyRef):
            return x.data
        if isinstance(x, state_types.TransformedRef) and isinstance(x.ref, _KeyRef):
            return state_types.TransformedRef(x.ref.data, ev.data_transforms(x.ref, x.transforms))
        return x

    new_flat, new_tree = mosaic_primitives._dma_flatten(*(data(a) for a in args))
    out = eqn.primitive.bind(*new_flat, **{**eqn.params, "tree": new_tree})
    return list(out) if eqn.primitive.multiple_results else [out]


# -- pallas_tpu keys as values ---------------------------------------------------------------


def _words(key: Any) -> list[Any]:
    """The 32-bit words of one key (a scalar key)."""
    data = _unwrap(key).reshape(-1)
    return [data[i] for i in range(data.shape[0])]


def _scalar_key(ev: _Evaluator, key: Any, what: str) -> None:
    if key.shape != ():
        raise _not_simulated(f"({what} of a {key.shape} array of pallas_tpu keys)", ev.chip)


def _random_bits(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    import jax.numpy as jnp
    from jax import lax
    from jax._src.pallas.mosaic import primitives as mosaic_primitives

    (key,) = ins
    _scalar_key(ev, key, "random bits")
    if eqn.params["bit_width"] != 32:
        raise ev.refuse_chip(
            f"{eqn.params['bit_width']}-bit random bits from a pallas_tpu key",
            "the TensorCore's PRNG draws 32-bit words (lowering.py random_bits_lowering)",
            "draw 32-bit values (jax.random.bits(key, shape, jnp.uint32)) and convert them",
        )
    # pallas/mosaic/random.py _random_bits: seed the core's PRNG with the key, then draw.
    mosaic_primitives.prng_seed_p.bind(*_words(key))
    bits = mosaic_primitives.prng_random_bits_p.bind(shape=tuple(eqn.params["shape"]))
    return [lax.bitcast_convert_type(bits, jnp.uint32)]


def _traced(ev: _Evaluator, fn: Callable[..., Any], ins: Sequence[Any]) -> list[Any]:
    """``fn`` on ``ins``, traced and evaluated here (its pallas key equations rewritten)."""
    import jax
    from jax._src import core as jax_core

    closed = jax.make_jaxpr(fn)(*(jax_core.typeof(x) for x in ins))
    return ev.run_closed(closed, ins)


def _fold_in(ev: _Evaluator, _eqn: Any, ins: list[Any]) -> list[Any]:
    key, msg = ins
    _scalar_key(ev, key, "fold_in")
    return _traced(ev, key.dtype._impl.fold_in, [key, msg])


def _split_key(ev: _Evaluator, _eqn: Any, ins: list[Any]) -> list[Any]:
    (key,) = ins
    _scalar_key(ev, key, "unwrap_pallas_seed")
    return _words(key)


def _join_key(_ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    import jax.numpy as jnp
    from jax._src.random import prng

    impl = eqn.params["impl"]
    words = jnp.stack([jnp.asarray(w).astype(jnp.uint32) for w in ins])
    return [prng.random_wrap(words.reshape(impl.key_shape), impl=impl)]


def _prng_seed(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    seeds: list[Any] = []
    for value in ins:
        dtype: Any = getattr(value, "dtype", None)
        if not _is_key(dtype):
            seeds.append(value)
            continue
        if not _is_pallas(dtype._impl):
            raise ev.refuse_chip(
                f"pltpu.prng_seed of a {dtype} key",
                "Mosaic seeds with scalar integers or a pallas_tpu key ('All seed data must be "
                "scalar integers')",
                "seed with jax.random.key_data(key) words, or convert the key with "
                "pltpu.to_pallas_key outside the kernel",
            )
        _scalar_key(ev, value, "prng_seed")
        seeds += _words(value)
    return _bind(eqn, seeds)


# -- equations holding jaxprs ----------------------------------------------------------------


def _inline(param: str) -> Callable[[_Evaluator, Any, list[Any]], list[Any]]:
    def rule(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
        return ev.run_closed(eqn.params[param], ins)

    return rule


def _unkeyed(ins: Sequence[Any]) -> tuple[list[Any], Callable[[Sequence[Any]], list[Any]]]:
    """The operands that are not key refs (a traced function's arguments), and how to put the
    key refs (closed over by it) back among them."""
    kept = [x for x in ins if not isinstance(x, _KeyRef)]

    def merge(args: Sequence[Any]) -> list[Any]:
        it = iter(args)
        return [x if isinstance(x, _KeyRef) else next(it) for x in ins]

    return kept, merge


def _cond(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    from jax import lax

    index, *ops = ins
    kept, merge = _unkeyed(ops)

    def branch(closed: Any) -> Callable[..., list[Any]]:
        return lambda *args: ev.run_closed(closed, merge(args))

    return list(lax.switch(index, [branch(b) for b in eqn.params["branches"]], *kept))


def _while(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    from jax import lax

    nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cconsts, bconsts, init = ins[:nc], ins[nc : nc + nb], ins[nc + nb :]
    if any(isinstance(x, _KeyRef) for x in init):
        raise _not_simulated("carried by a while loop", ev.chip)

    def cond(carry: Any) -> Any:
        return ev.run_closed(eqn.params["cond_jaxpr"], [*cconsts, *carry])[0]

    def body(carry: Any) -> Any:
        return tuple(ev.run_closed(eqn.params["body_jaxpr"], [*bconsts, *carry]))

    return list(lax.while_loop(cond, body, tuple(init)))


def _scan(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    from jax import lax

    p = eqn.params
    if "num_consts" in p:
        nc, ncarry = p["num_consts"], p["num_carry"]
        consts, carry, xs = ins[:nc], ins[nc : nc + ncarry], ins[nc + ncarry :]
    else:  # jax >= 0.12: the operands' partition is a tree
        consts, carry, xs = (list(g) for g in p["ft_in"].update(ins).unpack())
    if any(isinstance(x, _KeyRef) for x in (*carry, *xs)):
        raise _not_simulated("carried by a loop", ev.chip)

    def step(c: Any, x: Any) -> Any:
        out = ev.run_closed(p["jaxpr"], [*consts, *c, *x])
        return tuple(out[: len(carry)]), tuple(out[len(carry) :])

    final, ys = lax.scan(
        step, tuple(carry), tuple(xs), length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
    )
    return [*final, *ys]


class _Aval:
    """A scratch type ``pl.run_scoped`` takes, given as its ref aval."""

    def __init__(self, aval: Any) -> None:
        self.aval = aval

    def get_ref_aval(self) -> Any:
        return self.aval


def _run_scoped(ev: _Evaluator, eqn: Any, ins: list[Any]) -> list[Any]:
    from jax.experimental import pallas as pl

    jaxpr = eqn.params["jaxpr"]
    if eqn.params.get("collective_axes"):
        raise _not_simulated("in a run_scoped with collective axes", ev.chip)
    if any(t for t in eqn.params.get("ref_transforms", ()) or ()):
        raise _not_simulated("in a run_scoped of transformed scratch", ev.chip)
    avals = [v.aval for v in jaxpr.invars]

    def body(*refs: Any) -> Any:
        args = [_KeyRef(r, a) if _is_key_ref(a) else r for r, a in zip(refs, avals, strict=True)]
        return tuple(ev.run(jaxpr, ins, args))

    out = pl.run_scoped(body, *(_Aval(physical(a)) for a in avals))
    return list(out)


_RULES: dict[str, Callable[[_Evaluator, Any, list[Any]], list[Any]]] = {
    "get": _get,
    "swap": _swap,
    "dma_start": _dma,
    "dma_wait": _dma,
    "random_bits": _random_bits,
    "random_fold_in": _fold_in,
    "prng_split": _split_key,
    "prng_join": _join_key,
    "prng_seed": _prng_seed,
    "pjit": _inline("jaxpr"),
    "jit": _inline("jaxpr"),
    "closed_call": _inline("call_jaxpr"),
    "custom_jvp_call": _inline("call_jaxpr"),
    "cond": _cond,
    "while": _while,
    "scan": _scan,
    "run_scoped": _run_scoped,
}


# ------------------------------------------------------------------------------------------
# The call: operands, results, blocks and scratch as key data.
# ------------------------------------------------------------------------------------------


def _data_block(bm: Any, chip: str) -> Any:
    """A key block mapping as its key data's: whole trailing dims, index 0 along them."""
    import numpy as np
    from jax import tree_util
    from jax._src import core as jax_core
    from jax._src.pallas import core as pallas_core

    if compat.block_transforms(bm):
        raise _not_simulated("in a block with transforms", chip)
    element = _element_shape(bm.array_aval.dtype)
    index_map = bm.index_map_jaxpr
    closed = compat.closed_jaxpr_class()  # jax < 0.11: the index map is closed
    inner = index_map.jaxpr if closed is not None else index_map
    dtype = inner.outvars[0].aval.dtype if inner.outvars else np.dtype("int32")
    zero = jax_core.Literal(np.zeros((), dtype), jax_core.ShapedArray((), dtype))
    new_inner = inner.replace(outvars=[*inner.outvars, *([zero] * len(element))])
    new_map = closed(new_inner, index_map.consts) if closed is not None else new_inner
    return bm.replace(
        block_shape=(*bm.block_shape, *(pallas_core.Blocked(d) for d in element)),
        index_map_jaxpr=new_map,
        index_map_out_tree=tree_util.tree_structure((0,) * len(new_inner.outvars)),
        array_aval=physical(bm.array_aval),
        **{compat.block_aval_field(): physical(compat.block_aval(bm))},
    )


def rewrite(
    args: Sequence[Any], kw: dict[str, Any], chip: str
) -> tuple[list[Any], dict[str, Any], Callable[[Sequence[Any]], list[Any]]] | None:
    """``(args, kw, finish)`` for a kernel with keys, rewritten as the module says
    (``finish`` wraps its key results); None for any other."""
    from coremesh.testing.sim import inline

    jaxpr = kw["jaxpr"]
    gm = kw["grid_mapping"]
    out_avals = list(kw["out_avals"])
    keyed_blocks = [i for i, bm in enumerate(gm.block_mappings) if _is_key(bm.array_aval.dtype)]
    keyed = keyed_blocks or any(_is_key_aval(a) for a in out_avals)
    if not keyed and not needs_rewrite(jaxpr):
        return None
    first = gm.num_index_operands
    if any(_is_key_aval(v.aval) for v in jaxpr.invars[:first]):
        raise _not_simulated("as scalar prefetch operands", chip)
    if jaxpr.constvars:
        raise _not_simulated("in a body with constants", chip)

    block_mappings = list(gm.block_mappings)
    for i in keyed_blocks:
        block_mappings[i] = _data_block(block_mappings[i], chip)
    scratch = tuple(physical(a) for a in gm.scratch_avals)
    new_gm = gm.replace(block_mappings=tuple(block_mappings), scratch_avals=scratch)
    old_avals = [v.aval for v in jaxpr.invars]
    ev = _Evaluator(chip)

    def body(*refs: Any) -> list[Any]:
        wrapped = [
            _KeyRef(r, a) if _is_key_ref(a) else r for r, a in zip(refs, old_avals, strict=True)
        ]
        ev.run(jaxpr, (), wrapped)
        return []

    new_jaxpr = inline.retrace_kernel(gm, body, [physical(a) for a in old_avals])

    lead = len(args) - gm.num_inputs
    new_args = [
        _unwrap(a) if i >= lead and _is_key(getattr(a, "dtype", None)) else a
        for i, a in enumerate(args)
    ]
    keyed_outs = {o: a for o, a in enumerate(out_avals) if _is_key_aval(a)}
    new_kw = {
        **kw,
        "jaxpr": new_jaxpr,
        "grid_mapping": new_gm,
        "out_avals": tuple(physical(a) for a in out_avals),
    }

    def finish(outs: Sequence[Any]) -> list[Any]:
        outs = list(outs)
        for o, aval in keyed_outs.items():
            outs[o] = _wrap(outs[o], aval.dtype)
        return outs

    return new_args, new_kw, finish


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's kernel entry (the rewrite)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    from coremesh.testing.sim.chip import current

    orig_call = ipc.interpret_pallas_call

    def interpret_pallas_call(*args: Any, **kw: Any) -> Any:
        done = rewrite(args, kw, current().name)
        if done is None:
            return orig_call(*args, **kw)
        new_args, new_kw, finish = done
        return finish(orig_call(*new_args, **new_kw))

    return [(ipc, "interpret_pallas_call", interpret_pallas_call)]
