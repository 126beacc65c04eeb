"""SparseCore primitives under the interpreter: simulate what can be simulated, refuse the rest.

Pallas' TPU interpreter (jax 0.10.2 to 0.12.0.1) has no rule for the SparseCore primitives: it
binds them as they are, with buffer ids where refs belong, and fails with a misleading
``TypeError`` or an "MLIR translation rule not found" error. Each kernel jaxpr level is scanned
before it is interpreted: the primitives below are rewritten into ref reads and writes the
interpreter understands (so they run with its memory model, DMAs and race detection), and every
other SparseCore primitive is refused with :class:`NotSimulatedError` at trace time, so a result is
never silently wrong.

* ``load_gather`` / ``store_scatter`` / ``addupdate_scatter``: read the ref, gather or scatter with
  numpy semantics, write it back. Masked-off lanes load the interpreter's uninitialised value and
  store nothing; unmasked out-of-range indices raise.
* ``sort_key_val`` (``masked_sort``): a stable sort of the valid lanes by key (descending: by the
  reversed order, still stable), the invalid lanes after them in their own order, and the output
  mask the first count(valid) lanes, as JAX's ``test_sort_key_val`` checks against numpy.
* ``cumsum`` / ``cummax`` / ``cummin`` with a mask: the running sum (max, min) of the valid lanes;
  a lane before the first valid one keeps its own value under max and min.
* ``all_reduce_population_count`` / ``all_reduce_ffs`` with ``reduce=1``: the number of true
  lanes / the first true lane (or the lane count), in every lane; another ``reduce`` is refused.
* ``parallel_loop``: a sequential loop, one valid schedule of independent iterations (carries
  included). A body that depends on another iteration's writes is a bug the simulator cannot see.
* an indexed DMA (``sync_copy(table.at[idx_ref], ...)`` gathers rows, ``sync_copy(rows,
  table.at[idx_ref])`` scatters them): one row DMA per index on the same semaphores, so a wait
  for the whole copy sees every row's bytes. Stock, the interpreter's DMA reads the index ref's
  buffer id as if it were the index. An index outside the table raises; what Mosaic refuses
  (16-bit elements, rows not of whole 128-word tiles: ``coremesh.core.dma``) raises the same
  coremesh error as the compile check. Only a 1-D index vector on the first dim of the indexed
  view, given last, is simulated; other forms are refused. The indices are read when the DMA
  starts; hardware reads them as it runs, so overwriting them before the wait is a bug the
  simulator does not see.
* a DMA with ``add=True`` (the destination accumulates): refused. The interpreter ignores
  ``add`` and overwrites.
* ``subcore_barrier``: refused. The interpreter runs a SparseCore mesh's subcores one after the
  other on one thread, which cannot honour a barrier between them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.pallas.mosaic import primitives as tpu_primitives
from jax._src.pallas.mosaic import sc_primitives as scp
from jax._src.pallas.mosaic.interpret import utils as interpret_utils
from jax._src.state import indexing
from jax._src.state import types as state_types
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim import inline
from coremesh.testing.sim.errors import NotSimulatedError

_Rule = inline.Rule

#: User-facing spelling of each refused primitive, for the error message.
_API_NAMES = {
    "barrier": "plsc.subcore_barrier",
    "load": "plsc.load_expanded",
    "swap": "plsc.store_compressed / plsc.addupdate / plsc.addupdate_compressed",
    "bitcast": "plsc.bitcast",
    "unique": "plsc.scan_count",
    "masked_cummax": "plsc.cummax",
    "masked_cummin": "plsc.cummin",
    "masked_cumsum": "plsc.cumsum",
    "masked_sort": "plsc.sort_key_val",
    "pack": "plsc.pack",
    "unpack": "plsc.unpack",
    "sc_fetch_and_add": "plsc.fetch_and_add",
}

_WHY_BARRIER = (
    "the interpreter runs the subcores of a SparseCore mesh one after the other on one thread, "
    "so a barrier between them cannot be honoured"
)


def _uninitialized(dtype: Any) -> Any:
    return interpret_utils.get_uninitialized_value(dtype, "nan")


def _ref(ref: Any, transforms: Any) -> Any:
    return state_types.TransformedRef(ref, transforms) if transforms else ref


def _check_indices(what: str, shape: tuple[int, ...], indices: Any, mask: Any) -> None:
    """Host-side check: unmasked gather/scatter lanes must index inside the ref."""
    active = np.ones(np.shape(indices[0]), bool) if mask is None else np.asarray(mask, bool)
    for dim, (size, index) in enumerate(zip(shape, indices, strict=True)):
        lanes = np.asarray(index)
        bad = active & ((lanes < 0) | (lanes >= size))
        if bad.any():
            lane = int(np.argmax(bad))
            raise IndexError(
                f"{what}: lane {lane} indexes {int(lanes[lane])} in dimension {dim} of a ref of "
                f"shape {shape}"
            )


def _checked(what: str, shape: tuple[int, ...], indices: Sequence[Any], mask: Any) -> None:
    def check(*flat: Any) -> None:
        idx, m = list(flat[: len(indices)]), (flat[-1] if mask is not None else None)
        try:
            _check_indices(what, shape, idx, m)
        except IndexError as err:
            from coremesh.testing.sim.deadlock import WATCHDOG

            WATCHDOG.record(err)
            raise

    extra = () if mask is None else (mask,)
    io_callback(check, None, *indices, *extra)


def _gather(*flat_args: Any, tree: Any) -> Sequence[Any]:
    ref, transforms, indices, mask = tree.unflatten(flat_args)
    src = _ref(ref, transforms)
    _checked("plsc.load_gather", tuple(src.shape), indices, mask)
    values = src[...]
    idx = tuple(jnp.clip(i, 0, n - 1) for i, n in zip(indices, src.shape, strict=True))
    out = values[idx]
    if mask is not None:
        out = jnp.where(mask, out, jnp.asarray(_uninitialized(out.dtype), out.dtype))
    return [out]


def _scatter(*flat_args: Any, tree: Any, add: bool) -> Sequence[Any]:
    ref, transforms, indices, x, mask = jax.tree.unflatten(tree, flat_args)
    dst = _ref(ref, transforms)
    what = "plsc.addupdate_scatter" if add else "plsc.store_scatter"
    _checked(what, tuple(dst.shape), indices, mask)
    if mask is not None:  # masked-off lanes point past the end and are dropped
        indices = [jnp.where(mask, i, n) for i, n in zip(indices, dst.shape, strict=True)]
    current = dst[...]
    at = current.at[tuple(indices)]
    # A masked store of the whole ref: only the scattered elements count as written (the
    # uninitialized-read check sees the others as untouched).
    touched = jnp.zeros(current.shape, bool).at[tuple(indices)].set(True, mode="drop")
    new = at.add(x, mode="drop") if add else at.set(x, mode="drop")
    tpu_primitives.store(dst, new, mask=touched)
    return []


def _parallel_loop(*flat_args: Any, tree: Any, unroll: int, jaxpr: Any) -> Sequence[Any]:
    del unroll
    lower, upper, step, consts, carry = tree.unflatten(flat_args)
    lower, upper, step = (jnp.asarray(v, jnp.int32) for v in (lower, upper, step))
    trips = jnp.maximum((upper - lower + step - 1) // step, 0)

    def body(k: Any, c: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(jax_core.eval_jaxpr(jaxpr, consts, lower + k * step, *c))

    return list(lax.fori_loop(jnp.int32(0), trips, body, tuple(carry)))


def _sort_key(keys: Any, descending: bool) -> Any:
    """A key whose ascending order is ``keys``' order (reversed if ``descending``): bitwise not
    reverses an integer order without overflow, negation a float one."""
    if not descending:
        return keys
    return -keys if jnp.issubdtype(keys.dtype, jnp.floating) else ~keys


def _masked_sort(keys: Any, values: Any, *maybe_mask: Any, descending: bool) -> Sequence[Any]:
    # Mosaic's tpu.sort: a stable sort of the valid lanes by key, the invalid ones after them in
    # their own order; with a mask, the mask of the result is its first count(valid) lanes.
    mask = maybe_mask[0] if maybe_mask else jnp.ones(keys.shape, bool)
    order = jnp.arange(keys.shape[0], dtype=jnp.int32)
    key = _sort_key(keys, descending)
    invalid = (~mask).astype(jnp.int32)
    key = jnp.where(mask, key, jnp.zeros_like(key))
    _, _, _, out_keys, out_values = lax.sort(
        (invalid, key, order, keys, values), num_keys=3, is_stable=True
    )
    if not maybe_mask:
        return [out_keys, out_values]
    return [out_keys, out_values, order < jnp.sum(mask.astype(jnp.int32))]


def _masked_cumsum(x: Any, mask: Any) -> Sequence[Any]:
    return [jnp.cumsum(jnp.where(mask, x, jnp.zeros_like(x)), dtype=x.dtype)]


def _masked_cum_extreme(x: Any, mask: Any, *, biggest: bool) -> Sequence[Any]:
    # The running max (min) of the valid lanes so far; a lane before the first valid one keeps
    # its own value (JAX's test_masked_cummax checks both).
    if jnp.issubdtype(x.dtype, jnp.floating):
        neutral = -jnp.inf if biggest else jnp.inf
    else:
        info = jnp.iinfo(x.dtype)
        neutral = info.min if biggest else info.max
    filled = jnp.where(mask, x, jnp.full_like(x, neutral))
    running = lax.cummax(filled, axis=0) if biggest else lax.cummin(filled, axis=0)
    seen = jnp.cumsum(mask.astype(jnp.int32)) > 0
    return [jnp.where(seen, running, x)]


def _mask_all_reduce(x: Any, *, reduce: int, first: bool) -> Sequence[Any]:
    # reduce > 1 is for the packed masks of some chips, whose layout the docstring leaves open.
    if reduce != 1:
        raise _not_simulated(
            f"plsc.{'all_reduce_ffs' if first else 'all_reduce_population_count'} with "
            f"reduce={reduce}",
            "only reduce=1 (one count for the whole mask, in every lane) is specified",
        )
    n = x.shape[0]
    if first:
        value = jnp.min(jnp.where(x, jnp.arange(n, dtype=jnp.int32), jnp.int32(n)))
    else:
        value = jnp.sum(x.astype(jnp.int32))
    return [jnp.full((n,), value, jnp.int32)]


_RULES: dict[Any, _Rule] = {
    scp.gather_p: _gather,
    scp.scatter_p: _scatter,
    scp.parallel_loop_p: _parallel_loop,
    scp.masked_sort_p: _masked_sort,
    scp.masked_cumsum_p: _masked_cumsum,
    scp.masked_cummax_p: lambda x, mask: _masked_cum_extreme(x, mask, biggest=True),
    scp.masked_cummin_p: lambda x, mask: _masked_cum_extreme(x, mask, biggest=False),
    scp.all_reduce_population_count_p: lambda x, reduce: _mask_all_reduce(
        x, reduce=reduce, first=False
    ),
    scp.all_reduce_ffs_p: lambda x, reduce: _mask_all_reduce(x, reduce=reduce, first=True),
}


def _rule(eqn: Any) -> _Rule | None:
    """How ``eqn`` is rewritten for the interpreter, or None if it runs as it is."""
    if _is_indexed_dma(eqn):
        return _indexed_copy
    return _RULES.get(eqn.primitive)


def _sparsecore_primitives() -> dict[Any, str]:
    return {
        v: v.name
        for v in vars(scp).values()
        if isinstance(v, jax_core.Primitive) and v not in _RULES
    }


_REFUSED = _sparsecore_primitives()


def refusal(primitive: Any) -> NotSimulatedError | None:
    """The error for a SparseCore primitive the simulator does not run, else None."""
    name = _REFUSED.get(primitive)
    if name is None:
        return None
    api = _API_NAMES.get(name, f"the SparseCore primitive {name!r}")
    why = _WHY_BARRIER if name == "barrier" else "jax's TPU interpreter has no rule for it"
    return _not_simulated(api, why)


def _not_simulated(what: str, why: str) -> NotSimulatedError:
    return NotSimulatedError(
        f"{what} is not simulated: {why}",
        rule="the CPU simulator refuses what it cannot reproduce instead of returning a result "
        "that may be wrong",
        fix="check this kernel with the compile-only target (coremesh.testing.aot) or on TPU "
        "hardware; restructure it without this to simulate it",
    )


def _index_vector(ref: Any) -> tuple[Any, Any] | None:
    """(the view without its last indexer, that indexer) when ``ref`` ends in an indexer with
    a vector of indices; None when it has none. Refuses forms the rule does not handle."""
    transforms: tuple[Any, ...] = (
        tuple(ref.transforms) if isinstance(ref, state_types.TransformedRef) else ()
    )
    vectors = [
        i
        for i, t in enumerate(transforms)
        if isinstance(t, indexing.NDIndexer) and t.int_indexer_shape
    ]
    if not vectors:
        return None
    last = transforms[-1]
    if isinstance(last.indices[0], plsc.Indices):
        raise _not_simulated(
            "an indexed DMA with plsc.Indices (indices with an ignored value)",
            "only a plain vector of indices (table.at[idx_ref]) is simulated",
        )
    fixed = (indexing.Slice, int)
    if (
        vectors != [len(transforms) - 1]
        or len(last.int_indexer_shape) != 1
        or isinstance(last.indices[0], fixed)
        or not all(isinstance(i, fixed) for i in last.indices[1:])
    ):
        raise _not_simulated(
            f"an indexed DMA with {last}",
            "only a 1-D vector of indices on the first dim of the view, given last "
            "(table.at[idx_ref] or table.at[idx_ref, pl.ds(...)]), is simulated",
        )
    return state_types.TransformedRef(ref.ref, transforms[:-1]), last


def _indexed_side(src: Any, dst: Any) -> tuple[Any, Any, bool] | None:
    """(view, indexer, whether it gathers) for a DMA indexed by a vector on one side, None
    for a plain DMA; refuses the forms the rule does not handle."""
    gather, scatter = _index_vector(src), _index_vector(dst)
    if gather is not None and scatter is not None:
        raise _not_simulated(
            "an indexed DMA with index vectors on both sides",
            "only one side of a simulated DMA may be indexed by a vector",
        )
    if gather is not None:
        return (*gather, True)
    if scatter is not None:
        return (*scatter, False)
    return None


def _cumsum_refusal(eqn: Any) -> UnsupportedOnChipError | None:
    """Mosaic's SparseCore lowering of ``jnp.cumsum`` (sc_primitives.py
    ``_cumsum_lowering_rule``) takes a rank-1 vector along axis 0, not reversed; the
    interpreter runs any."""
    if eqn.primitive.name != "cumsum":
        return None
    aval = eqn.invars[0].aval
    if aval.ndim == 1 and not eqn.params.get("reverse") and eqn.params.get("axis", 0) == 0:
        return None
    from coremesh.testing.sim.chip import current_name

    return UnsupportedOnChipError(
        f"SC cumsum: x={aval.str_short()} must be rank 1, along axis 0 and not reversed",
        rule="a SparseCore vector subcore scans one vector of lanes",
        chip=current_name(),
        fix="reshape to one axis and scan it, or scan each row in a loop",
    )


def _dma_refusal(eqn: Any) -> NotSimulatedError | None:
    """The error for a DMA the simulator cannot run, else None. An indexed DMA that Mosaic
    refuses raises Mosaic's coremesh error here instead."""
    if eqn.primitive is not tpu_primitives.dma_start_p:
        return None
    if eqn.params.get("add"):
        return _not_simulated(
            "a DMA with add=True",
            "jax's TPU interpreter ignores add and overwrites the destination",
        )
    src, dst, *_ = eqn.params["tree"].unflatten(eqn.invars)
    try:
        indexed = _indexed_side(src, dst)
    except NotSimulatedError as err:
        return err
    if indexed is not None:
        view, indexer, gathers = indexed
        _check_like_mosaic(view, indexer, "source" if gathers else "destination")
    return None


def _check_like_mosaic(view: Any, indexer: Any, side: str) -> None:
    """What Mosaic refuses in an indexed DMA, the simulator refuses (``coremesh.core.dma``)."""
    from coremesh.core import current_target
    from coremesh.core.dma import check_indexed_dma

    last = indexer.indices[-1]
    row: int | None = None  # a 1-D table: single elements, which Mosaic gathers
    if len(indexer.indices) > 1:
        row = last.size if isinstance(last, indexing.Slice) else 1
    dtype = view.ref.aval.dtype
    check_indexed_dma(f"an indexed DMA whose {side}", dtype, row, current_target().chip)


def _is_indexed_dma(eqn: Any) -> bool:
    if eqn.primitive is not tpu_primitives.dma_start_p:
        return False
    src, dst, *_ = eqn.params["tree"].unflatten(eqn.invars)
    return _indexed_side(src, dst) is not None


def _row_view(view: Any, indexer: Any, row: Any) -> Any:
    """``view.at[row:row+1, <the indexer's other dims>]``: one row of an indexed view."""
    return view.at[(pl.ds(row, 1), *indexer.indices[1:])]


def _indexed_copy(
    *flat_args: Any, tree: Any, device_id_type: Any, priority: int, add: bool
) -> Sequence[Any]:
    """An indexed DMA as one row DMA per index, all on the DMA's semaphores."""
    src, dst, dst_sem, src_sem, device_id = tree.unflatten(flat_args)
    indexed = _indexed_side(src, dst)
    assert indexed is not None  # _rule chose this rule for an indexed DMA
    view, indexer, gathers = indexed
    rows = indexer.indices[0][...]
    what = "an indexed DMA " + ("source" if gathers else "destination")
    _checked(what, (view.shape[0],), [rows], None)

    def one(k: Any, carry: Any) -> Any:
        row = rows[k]
        if gathers:
            s, d = _row_view(view, indexer, row), dst.at[pl.ds(k, 1)]
        else:
            s, d = src.at[pl.ds(k, 1)], _row_view(view, indexer, row)
        flat, t = tpu_primitives._dma_flatten(s, d, dst_sem, src_sem, device_id)
        tpu_primitives.dma_start_p.bind(
            *flat, tree=t, device_id_type=device_id_type, priority=priority, add=add
        )
        return carry

    lax.fori_loop(0, rows.shape[0], one, 0)
    return []


# ------------------------------------------------------------------------------------------
# The jaxpr rewrite
# ------------------------------------------------------------------------------------------

_cache: weakref.WeakKeyDictionary[Any, tuple[Any, list[Any]] | None] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def rewrite(jaxpr: Any, axis_env: Sequence[tuple[Any, int]]) -> tuple[Any, list[Any]] | None:
    """``jaxpr`` with simulated SparseCore primitives inlined as ref operations.

    Returns None when nothing needs rewriting, else ``(new_jaxpr, extra_consts)``: the new jaxpr
    takes ``(*old_constvars, *extra_consts, *invars)``. Refused primitives raise.
    """
    with _cache_lock:
        if jaxpr in _cache:
            return _cache[jaxpr]
    for eqn in jaxpr.eqns:
        err = refusal(eqn.primitive) or _dma_refusal(eqn) or _cumsum_refusal(eqn)
        if err is not None:
            raise err
    if not any(_rule(eqn) is not None for eqn in jaxpr.eqns):
        result = None
    else:
        with jax_core.extend_axis_env_nd(tuple(axis_env)):
            result = inline.inline(jaxpr, _rule)
    with _cache_lock:
        _cache[jaxpr] = result
    return result
