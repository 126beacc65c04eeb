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
* ``load_expanded`` (``load`` with a mask): the i-th true lane gets ``ref[i]``; only the first
  count(mask) elements are read (one by one: the interpreter has no masked load); false lanes
  hold the interpreter's uninitialised value (the docstring leaves them undefined).
* ``store_compressed`` / ``addupdate_compressed`` / ``addupdate`` (``swap`` with a mask or
  ``add``): the true lanes of ``x``, in lane order, are stored to (added to) ``ref[0]``,
  ``ref[1]``, ...; the elements past count(mask) are neither read nor written. Without a mask,
  ``addupdate`` adds ``x`` to the whole ref. Mosaic lowers both jax lines' forms to the same
  expanded load and compressed store (``vector_load`` / ``vector_store`` with a mask). Only
  1-D refs are simulated with a mask; a ref in HBM or VMEM_SHARED is refused as Mosaic
  refuses it.
* ``pack`` / ``unpack`` with their default types (float32 <-> bfloat16 rounding to nearest
  even, int32 <-> int16 keeping the low bits / sign-extending): ``INTERLEAVED`` is
  ``[a0, b0, a1, b1, ...]``, ``COMPRESSED`` is ``a`` then ``b`` (``[[a0, a1], [b0, b1]]`` for
  two lanes), as ``plsc.PackFormat`` and Mosaic's ``tpu.pack_subelements`` describe them.
  Another ``preferred_element_type`` is refused.
* ``scan_count`` (``unique`` on jax 0.10.2): per lane, how many valid lanes up to it hold the
  same value (1 for an invalid lane), and the output mask true at the last valid occurrence of
  each value (Mosaic's ``tpu.scan_count``). What the output mask holds in an invalid lane is not
  specified: a run where that mask is used and a lane is invalid raises, as does one where a
  float NaN or both zeros are among the valid lanes (bitwise and numeric equality differ).
* ``parallel_loop``: a sequential loop, one valid schedule of independent iterations (carries
  included). A body that depends on another iteration's writes is a bug the simulator cannot see.
* an indexed DMA (``sync_copy(table.at[idx_ref], ...)`` gathers rows, ``sync_copy(rows,
  table.at[idx_ref])`` scatters them): one row DMA per index on the same semaphores, so a wait
  for the whole copy sees every row's bytes. Stock, the interpreter's DMA reads the index ref's
  buffer id as if it were the index. An index outside the table raises; what Mosaic refuses
  (16-bit elements, rows not of whole 128-word tiles: ``coremesh.core.dma``) raises the same
  coremesh error as the compile check, and what its SparseCore lowering refuses (indices not
  1-D or not in VMEM, both sides indexed, HBM to HBM) raises ``UnsupportedOnChipError`` with
  Mosaic's words. Only a 1-D index vector on the first dim of the indexed view, given last, is
  simulated; other forms are refused. A count known only at run time (``idx_ref.at[pl.ds(0,
  n)]``) reads each index in its turn, and the wait waits row by row. Filtered indices
  (``plsc.Indices(idx_ref, ignored_value=v)``) skip the rows whose index is ``v``. The indices
  are read when the DMA starts; hardware reads them as it runs, so overwriting them before the
  wait is a bug the simulator does not see.
* ``pl.select_ref(k, ...)`` as a DMA's source, destination or semaphore: a switch on ``k``
  (Mosaic's nested ``scf.if``: an index outside the first n-1 takes the last ref, as on the
  chip); a choice outside a DMA is refused.
* ``pltpu.VMEM(...) @ mesh`` (a memory space tied to the kernel's own mesh): the space it wraps
  (:func:`own_memory_spaces`); one tied to another core type is refused.
* a DMA with ``add=True`` (the destination accumulates): the interpreter ignores ``add`` and
  overwrites; patch ``dma_add`` (:mod:`.dma_add`) adds, atomically, so several subcores can
  scatter-add into one VMEM_SHARED buffer. What Mosaic's SparseCore lowering refuses is refused
  here with its words: an add that is not a gather (HBM or VMEM_SHARED into VMEM, the source
  indexed) or a scatter (VMEM into HBM or VMEM_SHARED, the destination indexed), and from jax
  0.12 a scatter-add into anything but VMEM_SHARED. With the patch off it is refused.
* ``subcore_barrier``: simulated by patch ``subcore_barrier`` (:mod:`.subcore_barrier`), which
  runs a kernel that has one with its subcores on threads and takes the barrier out before this
  scan. Refused here only with that patch off: the subcores then run one after the other on one
  thread, which cannot honour a barrier between them.
* ``fetch_and_add`` (an atomic add into another subcore's SMEM): simulated by patch
  ``fetch_and_add`` (:mod:`.fetch_and_add`), which runs a kernel that has one on subcore threads
  as a barrier kernel runs, and takes it out before this scan. Refused here only with that patch
  (or ``subcore_barrier``) off: the subcores then share one interpreter core, so another
  subcore's SMEM does not exist apart from this one's.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as jax_core
from jax._src.pallas import core as pallas_core
from jax._src.pallas.mosaic import core as tpu_core
from jax._src.pallas.mosaic import primitives as tpu_primitives
from jax._src.pallas.mosaic import sc_primitives as scp
from jax._src.pallas.mosaic.interpret import utils as interpret_utils
from jax._src.state import indexing
from jax._src.state import types as state_types
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core.errors import CoremeshError, UnsupportedOnChipError
from coremesh.testing.sim import compat, inline, shadow
from coremesh.testing.sim.errors import NotSimulatedError, SimulationFault, not_simulated
from coremesh.testing.sim.jaxprs import map_jaxprs, sub_jaxprs

_Rule = inline.Rule

#: The ``plsc`` call behind each SparseCore primitive whose name is not the call's, for error
#: messages (``swap`` and ``scatter`` need their parameters too: ``refusals._sparsecore_call``).
API_NAMES = {
    "gather": "plsc.load_gather",
    "load": "plsc.load_expanded",
    "unique": "plsc.scan_count",  # its name on jax 0.10
    "barrier": "plsc.subcore_barrier",
    "bitcast": "plsc.bitcast",
    "masked_cummax": "plsc.cummax",
    "masked_cummin": "plsc.cummin",
    "masked_cumsum": "plsc.cumsum",
    "masked_sort": "plsc.sort_key_val",
    "sc_fetch_and_add": "plsc.fetch_and_add",
}

_WHY_BARRIER = (
    "with patch subcore_barrier off, the interpreter runs the subcores of a SparseCore mesh one "
    "after the other on one thread, so a barrier between them cannot be honoured"
)
_WHY_FETCH_AND_ADD = (
    "jax's TPU interpreter has no rule for it, and with patch fetch_and_add (or subcore_barrier) "
    "off the subcores of a SparseCore share one interpreter core, so another subcore's SMEM "
    "does not exist apart"
)
_WHY_BITCAST = (
    "before jax 0.12 it is a SparseCore primitive with no interpreter rule and no CPU "
    "lowering, and patch sparsecore_bitcast, which runs it, is off"
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


def _index_fault(err: IndexError, source_info: Any, position: dict[str, int]) -> SimulationFault:
    """The fault for an index outside its ref, at the user's line."""
    from coremesh.testing.sim.faults import fault_at

    operation = f"{str(err).partition(':')[0]} out of bounds"
    return fault_at(
        operation,
        source_info,
        position,
        operation=operation,
        detail=str(err),
        rule="every index of a gather, scatter or indexed DMA lies inside the ref it indexes; "
        "the chip does not check, and reads or overwrites other memory",
        fix="clamp the indices to the ref's first dim (jnp.clip), or mask the lanes off",
    )


def _checked(what: str, shape: tuple[int, ...], indices: Sequence[Any], mask: Any) -> None:
    """Check the indices when the kernel runs; a fault names the kernel, the user's line and the
    mesh position (every axis in scope: devices, cores, subcores)."""
    eqn = inline.replaced_eqn()
    source_info = getattr(eqn, "source_info", None)
    names = [n for n in jax_core.get_axis_env().axis_names() if isinstance(n, str)]
    coords = [lax.axis_index(n) for n in names]

    def check(*flat: Any) -> None:
        k = len(indices)
        idx, m = list(flat[:k]), (flat[k] if mask is not None else None)
        try:
            _check_indices(what, shape, idx, m)
        except IndexError as err:
            here = dict(zip(names, (int(c) for c in flat[len(flat) - len(names) :]), strict=True))
            raise _index_fault(err, source_info, here) from err

    extra = () if mask is None else (mask,)
    io_callback(check, None, *indices, *extra, *coords)


def _gather(*flat_args: Any, tree: Any) -> Sequence[Any]:
    ref, transforms, indices, mask = tree.unflatten(flat_args)
    src = _ref(ref, transforms)
    _checked("plsc.load_gather", tuple(src.shape), indices, mask)
    # A use of the whole ref: an integer element nobody wrote raises even where no lane gathers
    # it (there is no NaN to carry its taint to the lanes that do); a float one taints its lanes.
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
    with jax.named_scope(shadow.WHOLE_REF_READ_SCOPE):  # not a use: only kept where not stored
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


def _runtime_check(check: Any, *args: Any) -> None:
    """Run ``check`` on the host with ``args``' values; what it raises fails the kernel."""

    def run(*values: Any) -> None:
        try:
            check(*(np.asarray(v) for v in values))
        except Exception as err:
            from coremesh.testing.sim.deadlock import WATCHDOG

            WATCHDOG.record(err)
            raise

    io_callback(run, None, *args)


def _one_dim(what: str, shape: tuple[int, ...]) -> None:
    if len(shape) != 1:
        raise _not_simulated(
            f"{what} on a ref view of shape {shape}",
            "only 1-D views are simulated (the i-th true lane goes with element i)",
        )


def _leading(ref: Any, count: Any) -> Any:
    """``ref[:count]`` (1-D, ``count`` traced) at the front of a vector of the ref's length, the
    rest uninitialised: one element read at a time, since the interpreter has no masked load
    and a read of the whole ref would read elements the kernel may never have written."""
    n = ref.shape[0]
    dtype = ref.dtype

    def one(k: Any, acc: Any) -> Any:
        return acc.at[k].set(ref[pl.ds(k, 1)][0])

    init = jnp.full((n,), _uninitialized(dtype), dtype)
    return lax.fori_loop(jnp.int32(0), count, one, init)


def _expanded(ref: Any, mask: Any) -> Any:
    """``plsc.load_expanded(ref, mask=mask)``: the i-th true lane gets ``ref[i]``; only the
    first count(mask) elements are read, false lanes hold the uninitialised value."""
    _one_dim("plsc.load_expanded", tuple(ref.shape))
    read = _leading(ref, jnp.sum(mask.astype(jnp.int32)))
    source = jnp.maximum(jnp.cumsum(mask.astype(jnp.int32)) - 1, 0)
    return jnp.where(mask, read[source], jnp.asarray(_uninitialized(read.dtype), read.dtype))


def _load(ref: Any, *args: Any, has_mask: bool, tree: Any) -> Sequence[Any]:
    if not has_mask:  # not made by any plsc function: load_expanded always passes a mask
        raise _not_simulated(
            "the SparseCore load primitive without a mask",
            "plsc.load_expanded (which passes a mask) is the form that is simulated",
        )
    *flat_transforms, mask = args
    return [_expanded(_ref(ref, jax.tree.unflatten(tree, flat_transforms)), mask)]


def _swap(
    ref: Any,
    x: Any,
    *args: Any,
    has_mask: bool,
    tree: Any,
    add: bool,
    compress: bool | None = None,
    result_used: bool = True,
) -> Sequence[Any]:
    """``store_compressed`` / ``addupdate_compressed`` (mask) and ``addupdate`` (no mask).

    The result is what Mosaic's lowering returns (sc_lowering ``_store_lowering_rule``): the
    ref's old contents, loaded expanded with the mask; it is read only if the kernel uses it
    (the plsc functions drop it). ``compress`` is jax >= 0.11's name for "masked" (0.10.2
    lowers a masked swap to the same compressed ``tpu.vector_store``).
    """
    if compress is not None and compress != has_mask:
        raise _not_simulated(
            f"the SparseCore swap primitive with compress={compress} and "
            f"{'a' if has_mask else 'no'} mask",
            "Mosaic lowers a mask only as a compressed store, and compression needs a mask",
        )
    flat_transforms = args[:-1] if has_mask else args
    dst = _ref(ref, jax.tree.unflatten(tree, flat_transforms))
    if not has_mask:
        old = dst[...] if (add or result_used) else None
        dst[...] = old + x if add else x
        return [old if old is not None else x]  # x only when the result is unused
    mask = args[-1]
    what = "plsc.addupdate_compressed" if add else "plsc.store_compressed"
    _one_dim(what, tuple(dst.shape))
    old = _expanded(dst, mask) if result_used else x
    n = mask.shape[0]
    count = jnp.sum(mask.astype(jnp.int32))
    written = jnp.arange(n, dtype=jnp.int32) < count
    # The true lanes first, in lane order.
    _, order = lax.sort(((~mask).astype(jnp.int32), jnp.arange(n, dtype=jnp.int32)), num_keys=2)
    packed = x[order]
    if add:
        packed = _leading(dst, count) + packed
    tpu_primitives.store(dst, packed, mask=written)
    return [old]


#: ``plsc.pack``'s default packed type for each source type (sc_primitives.py).
_PACKED = {np.dtype(np.float32): jnp.bfloat16, np.dtype(np.int32): jnp.int16}
_UNPACKED = {np.dtype(jnp.bfloat16): jnp.float32, np.dtype(np.int16): jnp.int32}


def _pack_types(what: str, source: Any, preferred: Any, table: dict[Any, Any]) -> Any:
    default = table.get(np.dtype(source))
    if default is None or (preferred is not None and np.dtype(preferred) != np.dtype(default)):
        raise _not_simulated(
            f"{what} from {np.dtype(source).name} to "
            f"{np.dtype(preferred if preferred is not None else source).name}",
            "only the default types (float32 <-> bfloat16, int32 <-> int16) are simulated; "
            "Mosaic's conversion to another type is not specified",
        )
    return default


def _pack(a: Any, b: Any, *, format: Any, preferred_element_type: Any) -> Sequence[Any]:
    # tpu.pack_subelements: floats round to nearest even, integers keep their low bits.
    packed = _pack_types("plsc.pack", a.dtype, preferred_element_type, _PACKED)
    a, b = a.astype(packed), b.astype(packed)
    if format == scp.PackFormat.INTERLEAVED:  # [a0, b0, a1, b1, ...]
        return [jnp.stack([a, b], axis=1).reshape(-1)]
    return [jnp.concatenate([a, b]).reshape(a.shape[0], 2)]  # [[a0, a1], [b0, b1]]


def _unpack(ab: Any, *, format: Any, preferred_element_type: Any) -> Sequence[Any]:
    # tpu.unpack_subelements: integers sign-extend (integer_extended, signed by default).
    wide = _pack_types("plsc.unpack", ab.dtype, preferred_element_type, _UNPACKED)
    if format == scp.PackFormat.INTERLEAVED:
        a, b = ab[0::2], ab[1::2]
    else:
        flat = ab.reshape(-1)
        a, b = flat[: ab.shape[0]], flat[ab.shape[0] :]
    return [a.astype(wide), b.astype(wide)]


def _check_scan_count(x: np.ndarray, mask: np.ndarray, mask_used: bool) -> None:
    if mask_used and not mask.all():
        raise _not_simulated(
            "plsc.scan_count's output mask where the input mask has a false lane",
            "what tpu.scan_count's output mask holds in a lane that was not counted is not "
            "specified",
        )
    if np.issubdtype(x.dtype, np.floating):
        valid = x[mask]
        zeros = valid[valid == 0]
        if np.isnan(valid).any() or len(np.unique(np.signbit(zeros))) > 1:
            raise _not_simulated(
                "plsc.scan_count of float lanes holding a NaN, or both +0.0 and -0.0",
                "whether the chip compares such lanes by bits or by value is not specified",
            )


def _scan_count(x: Any, mask: Any, *, mask_used: bool = True) -> Sequence[Any]:
    """Mosaic's tpu.scan_count along the last axis: for a valid lane, the number of valid
    lanes up to and including it with the same value; 1 for an invalid lane. The output mask
    is true at the last valid occurrence of each value."""
    _runtime_check(functools.partial(_check_scan_count, mask_used=mask_used), x, mask)
    n = x.shape[-1]
    same = (x[..., :, None] == x[..., None, :]) & mask[..., None, :]  # [..., lane, other]
    lane, other = jnp.arange(n)[:, None], jnp.arange(n)[None, :]  # traced: no array constants
    upto = jnp.sum(same & (other <= lane), axis=-1, dtype=jnp.int32)
    later = jnp.any(same & (other > lane), axis=-1)
    return [jnp.where(mask, upto, jnp.int32(1)), mask & ~later]


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
    scp.load_p: _load,
    scp.swap_p: _swap,
    scp.pack_p: _pack,
    scp.unpack_p: _unpack,
    scp.scan_count_p: _scan_count,
}


def _rule(eqn: Any, used: frozenset[Any] | None = None) -> _Rule | None:
    """How ``eqn`` is rewritten for the interpreter, or None if it runs as it is. ``used``:
    the variables the jaxpr reads (None: take every result as used)."""
    if _multiref_operands(eqn) is not None:
        return functools.partial(_selected_dma, _primitive=eqn.primitive)
    if _is_indexed_dma(eqn):
        return _indexed_copy
    if eqn.primitive is tpu_primitives.dma_wait_p:
        src, *_ = eqn.params["tree"].unflatten(eqn.invars)
        if _dynamic_rows(src) is not None:
            return _rows_wait
    if used is not None and eqn.primitive is scp.swap_p:
        return functools.partial(_swap, result_used=eqn.outvars[0] in used)
    if used is not None and eqn.primitive is scp.scan_count_p:
        return functools.partial(_scan_count, mask_used=eqn.outvars[1] in used)
    return _RULES.get(eqn.primitive)


def _used(jaxpr: Any) -> frozenset[Any]:
    """The variables ``jaxpr``'s equations and outputs read (inner jaxprs close over nothing)."""
    atoms = [v for eqn in jaxpr.eqns for v in eqn.invars] + list(jaxpr.outvars)
    return frozenset(v for v in atoms if not isinstance(v, jax_core.Literal))


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
    api = API_NAMES.get(name, f"the SparseCore primitive {name!r}")
    why = {
        "barrier": _WHY_BARRIER,
        "bitcast": _WHY_BITCAST,
        "sc_fetch_and_add": _WHY_FETCH_AND_ADD,
    }.get(name, "jax's TPU interpreter has no rule for it")
    return _not_simulated(api, why)


def _not_simulated(what: str, why: str) -> NotSimulatedError:
    return not_simulated(
        f"{what} is not simulated: {why}",
        chip=None,
        instead="restructure it without this to simulate it",
    )


def _is_multiref(ref: Any) -> bool:
    return isinstance(ref, state_types.TransformedRef) and bool(ref.multiref)


def _multiref_operands(eqn: Any) -> list[Any] | None:
    """The operands of a DMA start or wait, when one is a ``pl.select_ref`` choice; else None."""
    if eqn.primitive not in (tpu_primitives.dma_start_p, tpu_primitives.dma_wait_p):
        return None
    operands = list(eqn.params["tree"].unflatten(eqn.invars))
    return operands if any(_is_multiref(op) for op in operands) else None


def _choice(n: int, idx: Any) -> Any:
    """The ref Mosaic's nested ``scf.if`` takes for index ``idx`` among ``n``: ``idx`` when it
    is one of the first n-1, else the last (an index past the refs, or a negative one, falls
    through every ``idx == 0`` test to the final else; JAX's test_select_ref picks among two
    semaphores with indices 0 to 3)."""
    if isinstance(idx, int | np.integer):
        return int(idx) if 0 <= int(idx) < n - 1 else n - 1
    index = jnp.asarray(idx, jnp.int32)
    return jnp.where((index >= 0) & (index < n - 1), index, n - 1)


def _bind_chosen(primitive: Any, params: dict[str, Any], operands: list[Any]) -> None:
    """Bind a DMA start or wait on ``operands``, each ``pl.select_ref`` choice among them made
    by a switch on its index (Mosaic's nested ``scf.if``, lowering.py ``_select_to_ifop``)."""
    at = next((i for i, op in enumerate(operands) if _is_multiref(op)), None)
    if at is None:
        flat, tree = tpu_primitives._dma_flatten(*operands)
        primitive.bind(*flat, **{**params, "tree": tree})
        return
    choice = operands[at]
    options = list(choice.ref)
    idx = choice.transforms[0].idx

    def branch(option: Any) -> Callable[[], None]:
        def run() -> None:
            _bind_chosen(primitive, params, [*operands[:at], option, *operands[at + 1 :]])

        return run

    if isinstance(idx, int | np.integer):
        branch(options[_choice(len(options), idx)])()
        return
    lax.switch(_choice(len(options), idx), [branch(option) for option in options])


def _selected_dma(*flat_args: Any, **params: Any) -> Sequence[Any]:
    """A DMA start or wait with a ``pl.select_ref`` operand (Mosaic takes the choice in DMAs
    only): the DMA on the chosen ref. The interpreter reads the choice's transform as an index
    of a single ref and fails."""
    primitive = params.pop("_primitive")
    operands = list(params["tree"].unflatten(flat_args))
    _bind_chosen(primitive, params, operands)
    return []


def _multiref_refusal(eqn: Any) -> NotSimulatedError | None:
    """A ``pl.select_ref`` choice outside a DMA (Mosaic lowers it in DMAs only)."""
    if eqn.primitive in (tpu_primitives.dma_start_p, tpu_primitives.dma_wait_p):
        return None
    for name in ("tree", "args_tree"):
        tree = eqn.params.get(name)
        if tree is None or getattr(tree, "num_leaves", None) != len(eqn.invars):
            continue
        if any(
            _is_multiref(op)
            for op in jax.tree.leaves(tree.unflatten(eqn.invars), is_leaf=_is_multiref)
        ):
            return _not_simulated(
                f"pl.select_ref in {eqn.primitive.name}",
                "Mosaic lowers a choice of refs in DMAs only (pltpu.async_copy / sync_copy and "
                "their waits)",
            )
    return None


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
    if vectors[-1] != len(transforms) - 1:
        from coremesh.testing.sim.chip import current_name

        raise UnsupportedOnChipError(
            f"an indexed DMA whose ref has {transforms[-1]} after its indexer: the ref of an "
            "indexed DMA cannot have any transforms following the indexer",
            rule="Mosaic lowers an indexed DMA only with the vector indexer last "
            "(JAX's test_invalid_gather_1d_with_extra_transforms)",
            chip=current_name(),
            fix="index last: reshape or slice the table before .at[idx_ref], or the "
            "destination instead of the gathered view",
        )
    last = transforms[-1]
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
    """A cumsum Mosaic's SparseCore lowering refuses (:func:`.sc_ops.cumsum_refusal`), in any
    kernel that reaches the SparseCore rules (a vector subcore kernel's is refused before)."""
    from coremesh.testing.sim.chip import current_name
    from coremesh.testing.sim.sc_ops import cumsum_refusal

    what = cumsum_refusal(eqn)
    if what is None:
        return None
    text, rule, fix = what
    return UnsupportedOnChipError(text, rule=rule, chip=current_name(), fix=fix)


def _vector_memory_refusal(eqn: Any) -> UnsupportedOnChipError | None:
    """Mosaic's SparseCore load and store (sc_lowering.py ``_load_lowering_rule`` /
    ``_store_lowering_rule``, which ``load_expanded``, ``store_compressed`` and ``addupdate``
    lower through) refuse a ref in HBM or VMEM_SHARED; the interpreter would run them."""
    from coremesh.testing.sim.sc_accesses import accessed

    found = accessed(eqn) if eqn.primitive in (scp.load_p, scp.swap_p) else None
    if found is None or found[3] not in ("hbm", "vmem_shared"):
        return None
    from coremesh.testing.sim.chip import current_name

    get, aval, _, name = found
    op, verb = ("Get", "loading from") if get else ("Swap", "storing to")
    return UnsupportedOnChipError(
        f"{op} does not support {verb} {str(name).upper()}: a SparseCore vector load or store "
        f"(plsc.load_expanded / store_compressed / addupdate) of a {aval.str_short()} ref",
        rule="a SparseCore vector subcore loads and stores its own VMEM only",
        chip=current_name(),
        fix="copy the data to VMEM with pltpu.async_copy / sync_copy first",
    )


class _MosaicValueError(UnsupportedOnChipError, ValueError):
    """What Mosaic's lowering refuses with a ``ValueError``: code written for the chip (JAX's
    tests) expects that type."""


def _space(ref: Any) -> str | None:
    """The memory space of a DMA operand (a ref or a view of one) as Mosaic's SparseCore lowering
    names it in its errors ("HBM", "VMEM", ...); None where that depends on the kernel's core type
    (DEFAULT), for ANY, and for a ``pl.select_ref`` choice: the checks that need it are skipped."""
    if isinstance(ref, state_types.TransformedRef):
        if any(type(t).__name__ == "MemorySpaceCastTransform" for t in ref.transforms):
            return None
        ref = ref.ref
    aval = getattr(ref, "aval", None)
    if not isinstance(aval, state_types.AbstractRef):
        return None
    space = aval.memory_space
    space = getattr(space, "memory_space", space)  # a core memory space: the one it wraps
    if space is None:  # unset: HBM on a SparseCore (core.py memory_space_to_tpu_memory_space)
        return "HBM"
    return space.name if isinstance(space, tpu_core.MemorySpace) else None


def _offsets_check(index: Any) -> tuple[bool, str | None]:
    """(whether Mosaic takes ``index``, an indexer's first, as the offsets of an indexed DMA,
    its refusal of them or None): sc_lowering.py ``_extract_indirect_offsets_from_indices``."""
    if isinstance(index, plsc.Indices):
        index = index.values
    if isinstance(index, state_types.TransformedRef):
        if not isinstance(index.ref, jax_core.Var):
            return False, None
        if np.dtype(index.ref.aval.dtype) != np.dtype(np.int32):
            return True, (
                "Only int32 indices are supported by scatter/gather via `pltpu.async_copy` with "
                "a dynamically-shaped indexer"
            )
        space = _space(index)
    else:
        aval: Any = getattr(index, "aval", None)
        is_ref = isinstance(aval, state_types.AbstractRef)
        if not is_ref and not (isinstance(aval, jax_core.ShapedArray) and aval.shape):
            return False, None
        if len(aval.shape) != 1:
            return True, (
                "Only 1D indices are supported by scatter/gather via `pltpu.async_copy` on "
                f"SparseCore, got rank {len(aval.shape)}"
            )
        space = _space(index) if is_ref else "VMEM"
    if space is not None and space != "VMEM":
        return True, (
            f"Indices for scatter/gather via `pltpu.async_copy` must be in VMEM, got {space}"
        )
    return True, None


def _has_offsets(ref: Any) -> tuple[bool, str | None]:
    """(whether an indexer of ``ref`` gives an indexed DMA's offsets, Mosaic's refusal of them
    or None), as sc_lowering.py ``_has_indirect_offsets`` checks a DMA operand."""
    if not isinstance(ref, state_types.TransformedRef) or _is_multiref(ref):
        return False, None
    found = False
    for t in ref.transforms:
        if isinstance(t, indexing.NDIndexer) and t.indices:
            offsets, refused = _offsets_check(t.indices[0])
            if refused is not None:
                return True, refused
            found = found or offsets
    return found, None


def _scatter_add_to_shared_only() -> bool:
    """jax 0.12's SparseCore lowering scatter-adds into VMEM_SHARED only (sc_lowering.py
    ``_prepare_dma_refs``; jax 0.10.2 and 0.11.2 lower one into HBM too)."""
    from coremesh.core import jax_versions

    return jax_versions.at_least("0.12.0")


def _base_space(ref: Any) -> Any:
    """The memory space of the ref under a DMA operand's views, as Mosaic prints it."""
    ref = ref.ref if isinstance(ref, state_types.TransformedRef) else ref
    return getattr(getattr(ref, "aval", None), "memory_space", None)


def _add_outside_gather_scatter(src: Any, dst: Any) -> str:
    """Mosaic's words for a DMA with ``add=True`` that is neither a gather nor a scatter."""
    spaces = (_base_space(src), _base_space(dst))
    if _scatter_add_to_shared_only():
        return (
            "DMAs with `add=True` are only supported from HBM/VMEM_SHARED to VMEM or from VMEM "
            f"to VMEM_SHARED. Got (src, dst)={spaces}"
        )
    return (
        "DMAs with `add=True` are only supported between VMEM and HBM/VMEM_SHARED."
        f"Got (src, dst)={spaces}"
    )


def _add_without_offsets(side: str) -> str:
    return (
        "DMAs with `add=True` must (for now) specify offsets of the majormost dimension. You "
        f"can do this by writing `pltpu.async_copy(..., {side}={side}.at[jnp.arange(vec_dim)], "
        f"...)` or `pltpu.async_copy(..., {side}={side}.at[indices_ref], ...)`."
    )


def _gather_scatter_message(
    src: Any, dst: Any, gather: bool, add: bool
) -> tuple[str | None, bool, bool]:
    """(Mosaic's refusal of a gather or scatter or None, whether a ValueError, whether the
    indexed side has offsets), in sc_lowering.py ``_prepare_dma_refs``'s order."""
    other, indexed = (dst, src) if gather else (src, dst)
    if add and not gather and _scatter_add_to_shared_only() and _space(dst) != "VMEM_SHARED":
        return (
            "Scatter from VMEM with `add=True` via `pltpu.async_copy` is only supported when "
            f"the destination is in VMEM_SHARED, got {_space(dst)}",
            True,
            False,
        )
    found, message = _has_offsets(other)
    if message is None and found:
        role, kind = ("source", "gather") if gather else ("destination", "scatter")
        message = f"Only the {role} ref can be indexed when doing a {kind} via `pltpu.async_copy`"
        return message, True, False
    if message is not None:
        return message, False, False
    offsets, message = _has_offsets(indexed)
    return message, False, offsets


def _mosaic_dma_message(src: Any, dst: Any, add: bool) -> tuple[str | None, bool]:
    """(Mosaic's refusal of a DMA indexed by a vector or adding, or None; whether it is a
    ValueError), in its order (sc_lowering.py ``_prepare_dma_refs``)."""
    src_space, dst_space = _space(src), _space(dst)
    gather = src_space in ("HBM", "VMEM_SHARED") and dst_space == "VMEM"
    scatter = src_space == "VMEM" and dst_space in ("HBM", "VMEM_SHARED")
    if gather or scatter:
        message, value_error, offsets = _gather_scatter_message(src, dst, gather, add)
        side = "src_ref" if gather else "dst_ref"
    else:
        src_found, message = _has_offsets(src)
        dst_found, value_error, side = False, False, ""
        if message is None and not src_found:
            dst_found, message = _has_offsets(dst)
        offsets = src_found or dst_found
        known = src_space is not None and dst_space is not None
        if message is None and offsets and known:
            message = (
                f"Scatter/gather via `pltpu.async_copy` from {src_space} to {dst_space} is not "
                "supported"
            )
        elif message is None and add and known:
            message, value_error = _add_outside_gather_scatter(src, dst), True
    if message is None and add and not offsets:
        message = _add_without_offsets(side)
    return message, value_error


def _mosaic_dma_refusal(src: Any, dst: Any, add: bool = False) -> UnsupportedOnChipError | None:
    """Mosaic's refusal of a DMA indexed by a vector or with ``add=True``, in its order
    (sc_lowering.py ``_prepare_dma_refs``, the same in jax 0.10.2 to 0.12.0.1 but for adds): a
    gather runs from HBM or VMEM_SHARED into VMEM with only the source indexed, a scatter from
    VMEM into HBM or VMEM_SHARED with only the destination indexed, the indices a 1-D vector in
    VMEM; an add is a gather or scatter (into VMEM_SHARED only, from jax 0.12)."""
    message, value_error = _mosaic_dma_message(src, dst, add)
    if message is None:
        return None
    from coremesh.testing.sim.chip import current_name

    error = _MosaicValueError if value_error else UnsupportedOnChipError
    if add and "add=True" in message:
        return error(
            f"a DMA with add=True: {message}",
            rule="Mosaic's SparseCore lowering (sc_lowering.py) adds in an indexed DMA only: a "
            "gather from HBM or VMEM_SHARED into VMEM, or a scatter from VMEM into "
            + ("VMEM_SHARED" if _scatter_add_to_shared_only() else "HBM or VMEM_SHARED"),
            chip=current_name(),
            fix="index the DMA's HBM / VMEM_SHARED side with a vector of row indices "
            "(table.at[idx_ref], or .at[jnp.arange(n)] for every row), or add in VMEM with "
            "plsc.addupdate",
        )
    return error(
        f"an indexed DMA: {message}",
        rule="Mosaic's SparseCore lowering of an indexed DMA (sc_lowering.py) refuses this: it "
        "gathers from HBM or VMEM_SHARED into VMEM and scatters from VMEM into HBM or "
        "VMEM_SHARED, by a 1-D vector of int32 indices held in VMEM",
        chip=current_name(),
        fix="copy the table or the indices to VMEM first (pltpu.sync_copy), index one side only, "
        "and give the indices as one row (idx_ref.at[i])",
    )


#: The name scope of the row DMAs :func:`_indexed_copy` makes of an indexed DMA.
_ROW_SCOPE = "coremesh_indexed_dma_row"


def _row_of_indexed_dma(eqn: Any) -> bool:
    """Is ``eqn`` one of the row DMAs :func:`_indexed_copy` made of an indexed DMA? (Its
    traceback cannot say: the interpreter traces a level's rewrite under the user's.)"""
    return _ROW_SCOPE in str(getattr(eqn.source_info, "name_stack", ""))


def _dma_refusal(eqn: Any, sc_tiling: bool) -> CoremeshError | None:
    """The error for a DMA the simulator cannot run, else None. An indexed or adding DMA that
    Mosaic refuses (for the kernel's tiling) raises Mosaic's coremesh error here instead."""
    if eqn.primitive is not tpu_primitives.dma_start_p:
        return None
    from coremesh.testing.sim import patches

    src, dst, *_ = eqn.params["tree"].unflatten(eqn.invars)
    add = bool(eqn.params.get("add"))
    # A row of an indexed DMA this module rewrote was checked as the indexed DMA.
    mosaic = _mosaic_dma_refusal(src, dst, add and not _row_of_indexed_dma(eqn))
    if mosaic is not None:
        return mosaic
    if add and "dma_add" not in patches.enabled():
        return _not_simulated(
            "a DMA with add=True",
            "jax's TPU interpreter ignores add and overwrites the destination (patch dma_add "
            "is off)",
        )
    try:
        indexed = _indexed_side(src, dst)
    except NotSimulatedError as err:
        return err
    if indexed is not None:
        view, indexer, gathers = indexed
        _check_like_mosaic(view, indexer, "source" if gathers else "destination", sc_tiling)
    return None


def _check_like_mosaic(view: Any, indexer: Any, side: str, sc_tiling: bool) -> None:
    """What Mosaic refuses in an indexed DMA, the simulator refuses (``coremesh.core.dma``)."""
    from coremesh.core import current_target
    from coremesh.core.dma import check_indexed_dma

    last = indexer.indices[-1]
    row: int | None = None  # a 1-D table: single elements, which Mosaic gathers
    if len(indexer.indices) > 1:
        row = last.size if isinstance(last, indexing.Slice) else 1
    dtype = view.ref.aval.dtype
    check_indexed_dma(
        f"an indexed DMA whose {side}",
        dtype,
        row,
        current_target().chip,
        sparse_core_tiling=sc_tiling,
    )


def _is_indexed_dma(eqn: Any) -> bool:
    if eqn.primitive is not tpu_primitives.dma_start_p:
        return False
    src, dst, *_ = eqn.params["tree"].unflatten(eqn.invars)
    return _indexed_side(src, dst) is not None


def _row_view(view: Any, indexer: Any, row: Any) -> Any:
    """``view.at[row:row+1, <the indexer's other dims>]``: one row of an indexed view."""
    return view.at[(pl.ds(row, 1), *indexer.indices[1:])]


def _row_of(ref: Any, k: Any) -> Any:
    """``ref.at[pl.ds(k, 1)]``, also for a view whose first dim is a slice of a size known only
    when the kernel runs (``ref.at[pl.ds(0, n)]``, ``n`` traced), which ``.at`` cannot index."""
    transforms = tuple(ref.transforms) if isinstance(ref, state_types.TransformedRef) else ()
    last = transforms[-1] if transforms else None
    if not isinstance(last, indexing.NDIndexer):
        return ref.at[pl.ds(k, 1)]
    slices = [i for i, index in enumerate(last.indices) if isinstance(index, indexing.Slice)]
    sizes = [last.indices[i].size for i in slices]
    if all(isinstance(size, int) for size in sizes):
        return ref.at[pl.ds(k, 1)]
    if not slices or not all(isinstance(size, int) for size in sizes[1:]):
        raise _not_simulated(
            f"an indexed DMA with the view {last}",
            "only a view whose first dim alone has a size known at run time is simulated",
        )
    first = last.indices[slices[0]]
    indices = list(last.indices)
    indices[slices[0]] = indexing.Slice(first.start + k * first.stride, 1, 1)
    row = indexing.NDIndexer.from_indices_shape(tuple(indices), last.shape)
    return state_types.TransformedRef(ref.ref, (*transforms[:-1], row))


def _dynamic_rows(ref: Any) -> Any | None:
    """The number of rows of a DMA operand whose first dim has a size known only when the kernel
    runs (``table.at[idx_ref.at[pl.ds(0, n)]]``, ``ref.at[pl.ds(0, n)]``), else None."""
    if not isinstance(ref, state_types.TransformedRef) or _is_multiref(ref) or not ref.transforms:
        return None
    last = ref.transforms[-1]
    if not isinstance(last, indexing.NDIndexer):
        return None
    if last.int_indexer_shape:
        count = last.int_indexer_shape[0]
        return None if isinstance(count, int) else count
    sizes = [i.size for i in last.indices if isinstance(i, indexing.Slice)]
    if sizes and not isinstance(sizes[0], int) and all(isinstance(n, int) for n in sizes[1:]):
        return sizes[0]
    return None


def _first_row(ref: Any) -> Any:
    vector = _index_vector(ref)
    if vector is not None:
        return _row_view(*vector, 0)
    return _row_of(ref, 0)


def _rows_wait(*flat_args: Any, tree: Any, **params: Any) -> Sequence[Any]:
    """The wait of a DMA of a number of rows known only when the kernel runs, as one wait per
    row. The interpreter sizes a wait by its source's type, which jax 0.10.2 cannot build with a
    traced dim ("Shapes must be 1D sequences of concrete values of integer type")."""
    src, dst, sem, src_sem, device_id = tree.unflatten(flat_args)
    count = _dynamic_rows(src)
    src = _first_row(src)
    if _dynamic_rows(dst) is not None:
        dst = _first_row(dst)

    def one(_k: Any, carry: Any) -> Any:
        flat, t = tpu_primitives._dma_flatten(src, dst, sem, src_sem, device_id)
        tpu_primitives.dma_wait_p.bind(*flat, tree=t, **params)
        return carry

    lax.fori_loop(jnp.int32(0), jnp.asarray(count, jnp.int32), one, 0)
    return []


def _indexed_copy(
    *flat_args: Any, tree: Any, device_id_type: Any, priority: int, add: bool, **more: Any
) -> Sequence[Any]:
    """An indexed DMA as one row DMA per index, all on the DMA's semaphores. With a number of
    indices known only at run time (an index view ``idx_ref.at[pl.ds(0, n)]``), each index is
    read in its turn, as the rows are copied. ``more``: the DMA's other params, passed on to
    each row (jax 0.12.1 adds ``_unsafe_no_write_effect``).

    An index equal to ``plsc.Indices``' ``ignored_value`` moves no data: the row of the VMEM
    side is copied onto itself instead (never adding), so the DMA's semaphores still count the
    whole DMA's bytes, as its wait expects, and its other rows are left as they were."""
    src, dst, dst_sem, src_sem, device_id = tree.unflatten(flat_args)
    indexed = _indexed_side(src, dst)
    assert indexed is not None  # _rule chose this rule for an indexed DMA
    view, indexer, gathers = indexed
    index, ignored = indexer.indices[0], None
    if isinstance(index, plsc.Indices):
        index, ignored = index.values, index.ignored_value
    count = indexer.int_indexer_shape[0]
    what = "an indexed DMA " + ("source" if gathers else "destination")

    def kept(row: Any) -> Any:
        return None if ignored is None else row != ignored

    rows = None
    if isinstance(count, int):
        rows = index[...]
        _checked(what, (view.shape[0],), [rows], kept(rows))

    def start(s: Any, d: Any, adds: bool) -> None:
        flat, t = tpu_primitives._dma_flatten(s, d, dst_sem, src_sem, device_id)
        with jax.named_scope(_ROW_SCOPE):  # checked as the indexed DMA: _dma_refusal
            tpu_primitives.dma_start_p.bind(
                *flat, tree=t, device_id_type=device_id_type, priority=priority, add=adds, **more
            )

    def one(k: Any, carry: Any) -> Any:
        if rows is not None:
            row = rows[k]
        else:
            row = _row_of(index, k)[...][0]
            _checked(what, (view.shape[0],), [row[None]], kept(row[None]))
        local = _row_of(dst, k) if gathers else _row_of(src, k)
        if ignored is not None:
            skip = row == ignored
            pl.when(skip)(lambda: start(local, local, False))
            row = jnp.where(skip, 0, row)
        table = _row_view(view, indexer, row)
        s, d = (table, local) if gathers else (local, table)
        if ignored is None:
            start(s, d, add)
        else:
            pl.when(jnp.logical_not(skip))(lambda: start(s, d, add))
        return carry

    lax.fori_loop(jnp.int32(0), jnp.asarray(count, jnp.int32), one, 0)
    return []


# ------------------------------------------------------------------------------------------
# Memory spaces tied to the kernel's own mesh
# ------------------------------------------------------------------------------------------

_ClosedJaxpr = compat.closed_jaxpr_class()  # merged into Jaxpr after jax 0.10


def _own_space(aval: Any, core_type: Any) -> Any:
    space = getattr(aval, "memory_space", None)
    if not isinstance(space, pallas_core.CoreMemorySpace):
        return aval
    if space.mesh.core_type is not core_type:
        raise _not_simulated(
            f"a ref in {space} in a kernel on a {core_type.name} mesh",
            "a ref in another core type's memory (a TensorCore semaphore a SparseCore kernel "
            "signals) is not modelled",
        )
    return aval.update(memory_space=space.memory_space)


def _has_core_spaces(jaxpr: Any) -> bool:
    """Does a variable of ``jaxpr`` or of a jaxpr inside it live in a core memory space?"""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    atoms = [*inner.constvars, *inner.invars]
    for eqn in inner.eqns:
        atoms += eqn.outvars
        if any(_has_core_spaces(sub) for sub in sub_jaxprs(eqn)):
            return True
    return any(
        isinstance(getattr(v.aval, "memory_space", None), pallas_core.CoreMemorySpace)
        for v in atoms
    )


def _swap_avals(jaxpr: Any, fix: Callable[[Any], Any]) -> Any:
    """``jaxpr`` (closed or not) with every variable's aval ``fix(aval)``, inner jaxprs
    included."""
    if _ClosedJaxpr is not None and isinstance(jaxpr, _ClosedJaxpr):
        return jaxpr.replace(jaxpr=_swap_avals(jaxpr.jaxpr, fix))
    new_vars: dict[Any, Any] = {}

    def var(v: Any) -> Any:
        if isinstance(v, jax_core.Literal):
            return v
        if v not in new_vars:
            aval = fix(v.aval)
            new_vars[v] = v if aval is v.aval else type(v)(aval)
        return new_vars[v]

    def nested(inner: Any) -> Any:
        return _swap_avals(inner, fix)

    fields: dict[str, Any] = {
        "constvars": [var(v) for v in jaxpr.constvars],
        "invars": [var(v) for v in jaxpr.invars],
    }
    eqns = [
        eqn.replace(
            invars=[var(v) for v in eqn.invars],
            outvars=[var(v) for v in eqn.outvars],
            params={k: map_jaxprs(p, nested) for k, p in eqn.params.items()},
        )
        for eqn in jaxpr.eqns
    ]
    if getattr(jaxpr, "consts", None):
        fields["consts"] = jaxpr.consts
    return jaxpr.replace(**fields, outvars=[var(v) for v in jaxpr.outvars], eqns=eqns)


def own_memory_spaces(jaxpr: Any, mesh: Any) -> Any:
    """``jaxpr`` (a kernel body on ``mesh``) with each memory space tied to the kernel's own
    mesh (``pltpu.VMEM(shape, dtype) @ mesh``) replaced by the one it wraps, as Mosaic reads it
    (core.py ``memory_space_to_tpu_memory_space``: the wrapped space when the mesh's core type
    is the kernel's). The interpreter's tables hold plain memory spaces only (``KeyError:
    VMEM@SC_VECTOR_SUBCORE``). A ref tied to another core type is refused."""
    core_type = getattr(mesh, "core_type", None)
    if core_type is None or not _has_core_spaces(jaxpr):
        return jaxpr
    return _swap_avals(jaxpr, functools.partial(_own_space, core_type=core_type))


# ------------------------------------------------------------------------------------------
# The jaxpr rewrite
# ------------------------------------------------------------------------------------------


def sparse_core_tiling(compiler_params: Any) -> bool:
    """Is a kernel with these compiler params compiled with the SparseCore's own tiling
    (``pltpu.CompilerParams(use_tc_tiling_on_sc=False)``)? Mosaic's indexed-DMA limits
    (``coremesh.core.dma``) are those of the TensorCore tiling, a SparseCore kernel's default
    (pallas_call_registration.py ``_resolve_tiling``)."""
    return getattr(compiler_params, "use_tc_tiling_on_sc", None) is False


_Cache = weakref.WeakKeyDictionary[Any, tuple[Any, list[Any]] | None]
#: One cache per tiling: the refusals differ.
_caches: dict[bool, _Cache] = {tiling: weakref.WeakKeyDictionary() for tiling in (False, True)}
_cache_lock = threading.Lock()


def rewrite(
    jaxpr: Any, axis_env: Sequence[tuple[Any, int]], *, sc_tiling: bool = False
) -> tuple[Any, list[Any]] | None:
    """``jaxpr`` with simulated SparseCore primitives inlined as ref operations (``sc_tiling``:
    the kernel has the SparseCore's own tiling, :func:`sparse_core_tiling`).

    Returns None when nothing needs rewriting, else ``(new_jaxpr, extra_consts)``: the new jaxpr
    takes ``(*old_constvars, *extra_consts, *invars)``. Refused primitives raise.
    """
    cache = _caches[sc_tiling]
    with _cache_lock:
        if jaxpr in cache:
            return cache[jaxpr]
    for eqn in jaxpr.eqns:
        err = (
            refusal(eqn.primitive)
            or _multiref_refusal(eqn)
            or _dma_refusal(eqn, sc_tiling)
            or _cumsum_refusal(eqn)
            or _vector_memory_refusal(eqn)
        )
        if err is not None:
            raise err
    if not any(_rule(eqn) is not None for eqn in jaxpr.eqns):
        result = None
    else:
        with jax_core.extend_axis_env_nd(tuple(axis_env)):
            used = _used(jaxpr)
            result = inline.inline(jaxpr, lambda eqn: _rule(eqn, used))
    with _cache_lock:
        cache[jaxpr] = result
    return result
