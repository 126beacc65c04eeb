"""A ``pl.kernel`` / ``core_map`` kernel over a TensorCore mesh, or a SparseCore mesh (the named
grid of cores it becomes), as compiled XLA, with its local DMAs and DMA semaphores followed
exactly at the cost of a few comparisons each. A SparseCore indexed DMA (``table.at[idx_ref]``)
is one gather or scatter, its indices read as a load; a scatter whose repeated indices send
different data to one place is the interpreter's (which lands last is the order of the rows).

The interpreter runs every load, store, DMA and semaphore operation of such a kernel as a host
callback. A kernel whose cores only copy between their device's HBM and their own VMEM/SMEM with
DMAs they wait for themselves (JAX's ``emit_pipeline``, ``sync_copy``, hand-written double
buffering) needs none of that: its jaxpr is evaluated here with every ref a value, each DMA a
copy at its start, each core after the other, inside one XLA program. What makes that exact is
the bookkeeping it keeps beside the values (:class:`_Sem`): for every DMA semaphore the DMA in
flight on it (its source and destination regions) and its count. The kernel is run again, in the
same program, by the interpreter, from the same operands, and its result (or its error, at the
offending line) is the call's, where the order of DMAs could show or a check has something to
say: a load, store or DMA that touches a region a DMA in flight writes; a store or DMA write to a
region one in flight reads; a DMA on a semaphore with DMAs in flight to another ref or from
another (DMAs between the same two refs share one count: a paged-attention block's pages); a
wait that no DMA on its semaphore matches (its destination, or the count); a DMA left unwaited or
a count left over
when its scope ends; an index outside its ref; a result holding unwritten memory (the tagged NaN
of :mod:`coremesh.testing.sim.shadow`); a load of integer or bool memory nobody wrote (no NaN can
carry their taint: a mask of written elements follows them, through DMAs too). So the compiled
result is returned only when every DMA schedule gives it.

Cores run one after the other: they share nothing here but HBM, and what one core writes and
another reads without a semaphore between them is a race the interpreter does not order either
(``races=True`` watches it, and takes the interpreter).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from coremesh.testing.sim import shadow
from coremesh.testing.sim.jaxprs import (
    all_eqns,
    is_dma_semaphore,
    is_semaphore,
    memory_space,
    sub_jaxprs,
)

#: Why a compiled kernel's result was not trusted (bits of the flag the program computes).
FLAG_REASONS = {
    1: "a DMA in flight overlapped an access",
    2: "a wait no DMA in flight on its semaphore matched",
    4: "a DMA or semaphore count left when its scope ended",
    8: "an index outside its ref",
    16: "the result holds unwritten memory",
    32: "a load of unwritten integer or bool memory",
    64: "an indexed DMA writing different data to one element (the order is the interpreter's)",
}
_HAZARD, _WAIT, _LEFT, _BOUNDS, _TAINT, _UNWRITTEN, _REPEATED = 1, 2, 4, 8, 16, 32, 64

_MEMORY_SPACES = ("none", "default", "any", "hbm", "vmem", "smem", "semaphore_mem")
_REF_CONTAINERS = ("scan", "while", "cond", "pjit", "jit", "closed_call", "run_scoped")
_PURE_PALLAS = ("multiple_of",)


# ------------------------------------------------------------------ which kernels run here


def core_axes(kw: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """The kernel's core axes, major first, with their sizes: a TensorCore mesh's axis, or the
    named grid a SparseCore ``pl.kernel`` becomes (``('core', 'subcore')`` for a vector
    subcore mesh), whose points are the cores."""
    mesh, gm = kw.get("mesh"), kw["grid_mapping"]
    if mesh is not None:
        return tuple((str(name), int(size)) for name, size in mesh.shape.items())
    return tuple((str(name), int(size)) for name, size in zip(gm.grid_names, gm.grid, strict=True))


def why_interpreted(kw: dict[str, Any], checked: bool, zero_fill: bool) -> str | None:
    """None when the core kernel of ``kw`` (``interpret_pallas_call``'s keywords: a mesh, or a
    named grid of cores) runs here; else why it takes the interpreter. ``checked``: the
    uninitialized-read check is on."""
    from jax._src.pallas.mosaic import core as mosaic_core

    mesh, gm, jaxpr = kw.get("mesh"), kw["grid_mapping"], kw["jaxpr"]
    if mesh is not None and not isinstance(mesh, mosaic_core.TensorCoreMesh):
        return f"a kernel over a {type(mesh).__name__} (only TensorCore meshes run compiled)"
    if gm.num_dynamic_grid_bounds or gm.num_index_operands or gm.vmapped_dims:
        return "a mesh kernel with scalar prefetch, a dynamic or a vmapped grid"
    if getattr(jaxpr, "constvars", ()):
        return "a kernel that closes over constants"
    if mesh is None:
        if not all(isinstance(n, int) for n in gm.grid):
            return "a named grid whose size is known only at run time"
        for bm in gm.block_mappings:
            if memory_space(bm.block_aval) not in ("any", "hbm"):
                return (
                    f"a named grid with an operand in {memory_space(bm.block_aval)} (blocks the "
                    "pipeline copies at every grid point)"
                )
    axes = tuple(name for name, _ in core_axes(kw))
    n_io = len(gm.block_mappings)
    aliased = {o for _, o in kw.get("input_output_aliases") or ()}
    fresh = [v.aval for v in jaxpr.invars[n_io:]]
    fresh += [
        bm.array_aval
        for k, bm in enumerate(gm.block_mappings[n_io - gm.num_outputs :])
        if k not in aliased
    ]
    for v in jaxpr.invars:
        reason = _ref_reason(v.aval)
        if reason:
            return reason
    for eqn in all_eqns(jaxpr):
        reason = _eqn_reason(eqn, axes, named_grid=mesh is None)
        if reason:
            return reason
        if eqn.primitive.name == "run_scoped":
            fresh += [v.aval for v in eqn.params["jaxpr"].invars]
    if checked and zero_fill and any(not is_semaphore(a) for a in fresh):
        return "uninitialized_memory='zero' with the uninitialized-read check on"
    return None


def _dtype(aval: Any) -> Any:
    return getattr(getattr(aval, "inner_aval", aval), "dtype", None)


def _is_ref(v: Any) -> bool:
    from jax._src.state import types as state_types

    return isinstance(getattr(v, "aval", None), state_types.AbstractRef)


def _ref_reason(aval: Any) -> str | None:
    from jax._src.state import types as state_types

    if not isinstance(aval, state_types.AbstractRef):
        return None
    space = memory_space(aval)
    if space not in _MEMORY_SPACES:
        return f"a ref in {space} memory"
    if is_semaphore(aval) and not is_dma_semaphore(aval):
        return "a regular or barrier semaphore (its signals cross cores: the interpreter's)"
    return None


def _eqn_reason(eqn: Any, axes: tuple[str, ...], *, named_grid: bool) -> str | None:
    from jax._src import tree_util
    from jax._src.state import indexing

    from coremesh.testing.sim.fast_path import _NEEDS_INTERPRETER, _pallas_primitives

    name = eqn.primitive.name
    if name == "axis_index":
        if eqn.params.get("axis_name") not in axes:
            return f"axis_index({eqn.params.get('axis_name')!r}) (only the core axes run compiled)"
        return None
    if name in ("program_id", "num_programs") and not named_grid:
        return f"{name} in a mesh kernel"
    if name in ("dma_start", "dma_wait"):
        src, dst, sem, src_sem, device_id = eqn.params["tree"].unflatten(eqn.invars)
        if device_id is not None or src_sem is not None or eqn.params.get("is_wait_send"):
            return f"a remote {name} (DMAs to other devices are the interpreter's)"
        if eqn.params.get("add"):
            return "a DMA with add=True"
        for part in (src, dst, sem):
            reason = _dma_transforms_reason(getattr(part, "transforms", ()))
            if reason:
                return reason
        return None
    if eqn.primitive in _state_primitives() and "tree" in eqn.params:
        values = 1 if name == "get" else 2
        transforms = tree_util.tree_unflatten(eqn.params["tree"], eqn.invars[values:])
        for t in transforms or ():
            if not isinstance(t, indexing.NDIndexer):
                return f"a ref transform ({type(t).__name__})"
        return None
    if name == "run_scoped":
        if eqn.params.get("collective_axes"):
            return "run_scoped with collective axes"
        for v in eqn.params["jaxpr"].invars:
            reason = _ref_reason(v.aval)
            if reason:
                return reason
        return None
    if eqn.primitive in _pallas_primitives() and name not in _PURE_PALLAS:
        return f"{name} (semaphores, barriers and TPU-specific operations)"
    if name in _NEEDS_INTERPRETER:
        return f"{name} (collectives and callbacks)"
    if any(_is_ref(v) for v in eqn.invars):
        if name not in _REF_CONTAINERS:
            return f"a ref passed to {name}"
        if name == "scan":
            _, carry, xs = _scan_parts(eqn.params, list(eqn.invars))
            if any(_is_ref(v) for v in [*carry, *xs]):
                return "a ref carried by a loop"
        if name == "while":
            if any(_is_ref(v) for v in eqn.invars[: eqn.params["cond_nconsts"]]):
                return "a loop condition that reads a ref"
            first_carry = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
            if any(_is_ref(v) for v in eqn.invars[first_carry:]):
                return "a ref carried by a loop"
    if any(_is_ref(v) for v in eqn.outvars):
        return f"{name} returning a ref"
    return None


def _state_primitives() -> tuple[Any, ...]:
    """jax's ref get, swap and addupdate (a SparseCore ``plsc`` load or store shares a name)."""
    from jax._src.state import primitives as state_primitives

    return (state_primitives.get_p, state_primitives.swap_p, state_primitives.addupdate_p)


def _dma_transforms_reason(transforms: Any) -> str | None:
    """Why a DMA's ref transforms take the interpreter: one that is not an indexer, or an
    index vector (a SparseCore indexed DMA's ``table.at[idx_ref]``) whose length is known only
    at run time (``idx_ref.at[pl.ds(0, n)]``)."""
    from jax._src import indexing as slices
    from jax._src.state import indexing

    for t in transforms:
        if not isinstance(t, indexing.NDIndexer):
            return f"a DMA of a ref transform ({type(t).__name__})"
        if not all(isinstance(n, int) for n in t.int_indexer_shape):
            return "an indexed DMA whose number of indices is known only at run time"
        for index in t.indices:
            if isinstance(index, slices.Slice) and not isinstance(index.size, int):
                return "a DMA of a slice whose size is known only at run time"
            reason = _dma_transforms_reason(getattr(index, "transforms", ()))
            if reason:
                return reason
    return None


# ------------------------------------------------------------------ the evaluator's state


Sems = frozenset[Any] | None  # semaphores (their variables); None: any
Dma = tuple[Sems, Sems]  # those of the DMAs that write a ref, and of those that read it


@dataclasses.dataclass(frozen=True)
class _Ref:
    """A ref of the kernel: its key in the state, its shape, and the semaphores of the DMAs of
    the kernel that may write it (``dst_sems``) or read it (``src_sems``; None: any): an access
    is checked against the DMAs in flight on those only (:func:`dma_refs`)."""

    key: int
    shape: tuple[int, ...]
    dst_sems: Sems = None
    src_sems: Sems = None

    @property
    def dst(self) -> bool:
        return self.dst_sems is None or bool(self.dst_sems)

    @property
    def src(self) -> bool:
        return self.src_sems is None or bool(self.src_sems)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Sem:
    """A DMA semaphore array, flat: each element's count and the DMAs in flight on it: one
    destination and one source ref (keys), and the regions ``[lo, hi)`` that hold every
    destination and every source of them (the pages of a paged-attention block, started one
    by one and waited at once, or one by one). They stay in flight until the count is back at
    zero: a wait says that bytes arrived, not which.

    One int32 row per element (count, active, destination, source, then the regions' bounds):
    a DMA reads and writes one row, not eight arrays (each a kernel for XLA to compile)."""

    table: Any

    @classmethod
    def fresh(cls, size: int, rank: int) -> _Sem:
        table = np.zeros((size, 4 + 4 * rank), np.int32)
        table[:, 2:4] = -1
        return cls(jnp.asarray(table))

    def _cols(self, k: int, width: int = 0) -> Any:
        if not width:
            return self.table[:, k]
        return self.table[:, k : k + width]

    @property
    def rank(self) -> int:
        return (int(self.table.shape[1]) - 4) // 4

    @property
    def count(self) -> Any:
        return self._cols(0)

    @property
    def active(self) -> Any:
        return self._cols(1) != 0

    @property
    def dst(self) -> Any:
        return self._cols(2)

    @property
    def src(self) -> Any:
        return self._cols(3)

    @property
    def dst_lo(self) -> Any:
        return self._cols(4, self.rank)

    @property
    def dst_hi(self) -> Any:
        return self._cols(4 + self.rank, self.rank)

    @property
    def src_lo(self) -> Any:
        return self._cols(4 + 2 * self.rank, self.rank)

    @property
    def src_hi(self) -> Any:
        return self._cols(4 + 3 * self.rank, self.rank)


Region = tuple[Any, Any]  # (lo, hi), each int32[rank]


Carry = tuple[dict[int, Any], dict[int, _Sem], dict[int, Any], Any]


class _State:
    """The values of the refs alive, the semaphores, the flag, and which elements of fresh
    integer and bool buffers were written (no NaN can carry their taint), as one loop carry."""

    def __init__(self, rank: int, fill: Callable[..., Any], taint: bool) -> None:
        self.refs: dict[int, Any] = {}
        self.sems: dict[int, _Sem] = {}
        self.written: dict[int, Any] = {}
        self.flag: Any = jnp.int32(0)
        self.rank = rank
        self.fill = fill
        self.taint = taint
        self._keys = itertools.count()
        self.sem_keys: dict[Any, int] = {}  # a semaphore's variable -> its key

    def sems_of(self, sems: Sems) -> list[_Sem]:
        """The semaphores (alive) of ``sems`` (variables; None: all of them)."""
        if sems is not None and all(v in self.sem_keys for v in sems):
            keys = {self.sem_keys[v] for v in sems}
            return [sem for key, sem in self.sems.items() if key in keys]
        return list(self.sems.values())

    def carry(self) -> Carry:
        return dict(self.refs), dict(self.sems), dict(self.written), self.flag

    def load(self, carry: Carry) -> None:
        refs, sems, written, self.flag = carry
        self.refs, self.sems, self.written = dict(refs), dict(sems), dict(written)

    def raise_flag(self, bad: Any, bit: int) -> None:
        if bad is False:
            return  # known at trace time to be fine
        self.flag = self.flag | lax.select(jnp.asarray(bad, bool), jnp.int32(bit), jnp.int32(0))

    def allocate(self, aval: Any, dma: Dma = (None, None), var: Any = None) -> _Ref:
        shape, dtype = tuple(aval.shape), _dtype(aval)
        ref = _Ref(next(self._keys), shape, *dma)
        if is_semaphore(dtype):
            if var is not None:
                self.sem_keys[var] = ref.key
            self.sems[ref.key] = _Sem.fresh(max(int(np.prod(shape)), 1), self.rank)
            return ref
        self.refs[ref.key] = self.fill(shape, dtype)
        if self.taint and shadow.taint_layout(np.dtype(dtype)) is None:
            self.written[ref.key] = jnp.zeros(shape, bool)
        return ref

    def bind(self, aval: Any, value: Any, dma: Dma = (None, None)) -> _Ref:
        ref = _Ref(next(self._keys), tuple(aval.shape), *dma)
        self.refs[ref.key] = value
        return ref

    def check_idle(self, refs: Sequence[_Ref]) -> None:
        """The end of a scope or of a core: its semaphores must be idle, at zero."""
        for ref in refs:
            sem = self.sems.get(ref.key)
            if sem is not None:
                self.raise_flag(jnp.any(sem.active) | jnp.any(sem.count != 0), _LEFT)

    def release(self, refs: Sequence[_Ref]) -> None:
        """The end of a scope: its semaphores must be idle, at zero."""
        self.check_idle(refs)
        for ref in refs:
            self.sems.pop(ref.key, None)
            self.refs.pop(ref.key, None)
            self.written.pop(ref.key, None)

    def refill(self, ref: _Ref, aval: Any) -> None:
        """``ref`` (allocated from ``aval``) fresh again, as at its allocation (a new core)."""
        shape, dtype = tuple(aval.shape), _dtype(aval)
        if ref.key in self.sems:
            self.sems[ref.key] = _Sem.fresh(max(int(np.prod(shape)), 1), self.rank)
            return
        self.refs[ref.key] = self.fill(shape, dtype)
        if ref.key in self.written:
            self.written[ref.key] = jnp.zeros(shape, bool)

    def in_flight(self, ref: _Ref) -> Any:
        """Does a DMA in flight read or write ``ref``?"""
        hit = jnp.bool_(False)
        for sem in self.sems.values():
            hit = hit | jnp.any(sem.active & ((sem.dst == ref.key) | (sem.src == ref.key)))
        return hit

    def read_written(self, ref: _Ref, transforms: Any) -> Any:
        """Which elements of an access were written (None: the ref is not followed)."""
        if ref.key not in self.written:
            return None
        return _read(self.written[ref.key], transforms)

    def mark_written(self, ref: _Ref, transforms: Any, written: Any) -> None:
        """Elements an access wrote, and whether each holds written data (``written``)."""
        if ref.key in self.written:
            old = self.written[ref.key]
            new = jnp.broadcast_to(written, _read(old, transforms).shape)
            _, self.written[ref.key] = _swap(old, transforms, new)
        elif written is not True:  # unwritten data copied where nothing follows it
            self.raise_flag(~jnp.all(written), _UNWRITTEN)


def _scan_parts(params: dict[str, Any], ins: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """A scan's operands as (consts, carry, xs): counts on jax 0.10, a flat tree later."""
    if "num_consts" in params:
        nc, ncarry = params["num_consts"], params["num_carry"]
        return ins[:nc], ins[nc : nc + ncarry], ins[nc + ncarry :]
    consts, carry, xs = params["ft_in"].update(ins).unpack()
    return list(consts), list(carry), list(xs)


# ------------------------------------------------------------------ regions and bounds


def _bounds(transforms: Any, shape: tuple[int, ...]) -> tuple[list[Any], list[Any]]:
    """The region of a ref an access touches, as ``[lo, hi)`` per dimension, each bound an
    int where it is known at trace time: indexers of slices and scalars composed
    (``buf.at[b].at[i]``); from an indexer with an index vector on, the bounds hold what the
    later ones touch (they narrow inside it)."""
    from jax._src import indexing as slices
    from jax._src.state import indexing

    lo: list[Any] = [0] * len(shape)
    hi: list[Any] = list(shape)
    view: list[tuple[int, Any, int]] = [(d, 0, 1) for d in range(len(shape))]
    for t in transforms or ():
        if not isinstance(t, indexing.NDIndexer):
            break
        vector = any(not isinstance(i, slices.Slice) and np.ndim(i) > 0 for i in t.indices)
        kept = []
        for (d, offset, stride), index in zip(view, t.indices, strict=True):
            if isinstance(index, slices.Slice):
                start = offset + _scalar(index.start) * stride
                step = stride * int(index.stride)
                lo[d], hi[d] = start, start + (int(index.size) - 1) * step + 1
                kept.append((d, start, step))
            elif np.ndim(index) == 0:
                lo[d] = offset + _scalar(index) * stride
                hi[d] = lo[d] + 1
            else:
                value = offset + jnp.asarray(index, jnp.int32) * stride
                lo[d], hi[d] = jnp.min(value), jnp.max(value) + 1
        if vector:
            break
        view = kept
    return lo, hi


def _scalar(index: Any) -> Any:
    """An index as an int when it is known at trace time, else as an int32 value."""
    if isinstance(index, int | np.integer):
        return int(index)
    return jnp.asarray(index, jnp.int32)


def _region(transforms: Any, shape: tuple[int, ...], rank: int) -> Region:
    """:func:`_bounds` as two int32[rank] vectors (padded with ``[0, 1)``), to be stored."""
    lo, hi = _bounds(transforms, shape)
    pad = rank - len(shape)
    if not rank:
        return jnp.zeros((0,), jnp.int32), jnp.zeros((0,), jnp.int32)
    return (
        jnp.stack([jnp.asarray(x, jnp.int32) for x in lo] + [jnp.int32(0)] * pad),
        jnp.stack([jnp.asarray(x, jnp.int32) for x in hi] + [jnp.int32(1)] * pad),
    )


def _out_of_bounds(transforms: Any) -> Any:
    """Does an index of ``transforms`` fall outside its ref? Indices known at trace time are
    checked there: only the others cost the program comparisons."""
    from jax._src import indexing as slices
    from jax._src.state import indexing

    known = False
    traced: list[Any] = []
    for t in transforms or ():
        if not isinstance(t, indexing.NDIndexer):
            continue
        for index, dim in zip(t.indices, t.shape, strict=True):
            if isinstance(index, slices.Slice):
                if isinstance(index.size, int) and index.size == 0:
                    continue
                lo = _scalar(index.start)
                hi = lo + (index.size - 1) * int(index.stride)
            elif np.ndim(index) == 0:
                lo = hi = _scalar(index)
            else:
                value = jnp.asarray(index, jnp.int32)
                if value.size == 0:
                    continue
                lo, hi = jnp.min(value), jnp.max(value)
            if isinstance(lo, int) and isinstance(hi, int):
                known = known or lo < 0 or hi >= int(dim)
            else:
                traced.append((lo < 0) | (hi >= int(dim)))
    if known:
        return True
    return functools.reduce(jnp.logical_or, traced) if traced else False


def _indexed(transforms: Any) -> bool:
    """Is one of ``transforms`` indexed by a vector (a SparseCore gather or scatter)?"""
    from jax._src import indexing as slices

    return any(
        not isinstance(i, slices.Slice) and np.ndim(i) > 0
        for t in transforms
        for i in getattr(t, "indices", ())
    )


def _same_bits(a: Any, b: Any) -> Any:
    """Elementwise: do ``a`` and ``b`` hold the same bits (a NaN is the NaN it was)?"""
    if jnp.issubdtype(a.dtype, jnp.floating):
        width = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[a.dtype.itemsize]
        return lax.bitcast_convert_type(a, width) == lax.bitcast_convert_type(b, width)
    return a == b


def _overlaps(
    ref: _Ref, bounds: tuple[list[Any], list[Any]], keys: Any, lo: Any, hi: Any, active: Any
) -> Any:
    """Does an access of ``ref`` in ``bounds`` overlap one of the regions in flight? Only
    dimensions the access does not cover whole are compared (a region in flight on the ref
    is inside it), and no reduction is made over a few semaphores: each costs XLA a kernel
    of its own to compile, and a paged-attention step makes a hundred such checks."""
    hit = active & (keys == ref.key)
    for d, (a, b) in enumerate(zip(*bounds, strict=True)):
        if isinstance(a, int) and isinstance(b, int) and a <= 0 and b >= ref.shape[d]:
            continue
        hit = hit & (lo[:, d] < b) & (a < hi[:, d])
    if hit.shape[0] > 8:
        return jnp.any(hit)
    rows = [lax.index_in_dim(hit, j, keepdims=False) for j in range(hit.shape[0])]
    return functools.reduce(jnp.logical_or, rows)


def _at(values: Any, s: Any) -> Any:
    """``values[s]`` for a traced index in range (no wrap of negative indices)."""
    return lax.dynamic_index_in_dim(values, s, keepdims=False)


def _set(values: Any, s: Any, value: Any) -> Any:
    """``values`` with row ``s`` set to ``value``: a select, which fuses (a scatter does not)."""
    rows = lax.broadcasted_iota(jnp.int32, values.shape, 0) == s
    new = lax.broadcast_in_dim(
        jnp.asarray(value, values.dtype), values.shape, tuple(range(1, values.ndim))
    )
    return lax.select(rows, new, values)


def _box(transforms: Any, shape: tuple[int, ...]) -> tuple[list[Any], list[int], list[int]] | None:
    """(start, size per dimension of the ref, the dimensions the view keeps) of ``transforms``
    when they are indexers of unit-stride slices and scalars (one dynamic slice); else None."""
    from jax._src import indexing as slices
    from jax._src.state import indexing

    starts: list[Any] = [0] * len(shape)
    sizes = list(shape)
    view = list(range(len(shape)))
    for t in transforms or ():
        if not isinstance(t, indexing.NDIndexer):
            return None
        kept = []
        for d, index in zip(view, t.indices, strict=True):
            if isinstance(index, slices.Slice):
                if int(index.stride) != 1 or not isinstance(index.size, int):
                    return None
                starts[d] = starts[d] + index.start
                sizes[d] = index.size
                kept.append(d)
            elif np.ndim(index) == 0:
                starts[d] = starts[d] + index
                sizes[d] = 1
            else:
                return None
        view = kept
    return starts, sizes, view


def _read(value: Any, transforms: Any) -> Any:
    """The view ``transforms`` make of ``value``: one dynamic slice where they allow it."""
    from jax._src.state import discharge

    box = _box(transforms, tuple(value.shape))
    if box is None:
        return discharge.transform_array(value, transforms)
    starts, sizes, view = box
    out = lax.dynamic_slice(value, [jnp.asarray(s, jnp.int32) for s in starts], sizes)
    return out.reshape([sizes[d] for d in view])


def _swap(value: Any, transforms: Any, new: Any) -> tuple[Any, Any]:
    """(the old view, ``value`` with the view replaced by ``new``)."""
    from jax._src.state import discharge

    box = _box(transforms, tuple(value.shape))
    if box is None:
        old, updated = discharge.transform_swap_array(value, transforms, new)
        return old, updated
    starts, sizes, view = box
    at = [jnp.asarray(s, jnp.int32) for s in starts]
    old = lax.dynamic_slice(value, at, sizes)
    block = jnp.broadcast_to(jnp.asarray(new, value.dtype), [sizes[d] for d in view])
    return old.reshape(block.shape), lax.dynamic_update_slice(value, block.reshape(sizes), at)


#: For the refs some DMA of a kernel writes, and those one reads (their variables: the
#: kernel's arguments and its scoped allocations), the semaphores of those DMAs (variables);
#: None: not known, so every ref may be, on any semaphore.
DmaRefs = tuple[dict[Any, frozenset[Any]], dict[Any, frozenset[Any]]] | None


def dma_of(touched: DmaRefs, var: Any) -> Dma:
    """(the semaphores of the DMAs that may write, and read, the ref of ``var``)."""
    if touched is None:
        return None, None
    return touched[0].get(var, frozenset()), touched[1].get(var, frozenset())


def dma_union(a: Dma, b: Dma) -> Dma:
    """The semaphores of either (a ref that is two of the kernel's arguments)."""

    def join(x: Sems, y: Sems) -> Sems:
        return None if x is None or y is None else x | y

    return join(a[0], b[0]), join(a[1], b[1])


def dma_refs(jaxpr: Any) -> DmaRefs:
    """The refs (variables of ``jaxpr``'s arguments and scoped allocations) some DMA of the
    kernel writes and reads, followed through the containers that pass refs on."""
    from jax._src import core as jax_core

    dst: dict[Any, set[Any]] = {}
    src: dict[Any, set[Any]] = {}

    def walk(inner: Any, alias: dict[Any, Any]) -> bool:
        def root(v: Any) -> Any:
            return alias.get(v, v) if isinstance(v, jax_core.Var) else None

        for eqn in inner.eqns:
            name, p, ins = eqn.primitive.name, eqn.params, list(eqn.invars)
            if name in ("dma_start", "dma_wait"):
                parts = p["tree"].unflatten(ins)
                if name == "dma_start":
                    sem = root(getattr(parts[2], "ref", parts[2]))
                    src.setdefault(root(getattr(parts[0], "ref", parts[0])), set()).add(sem)
                    dst.setdefault(root(getattr(parts[1], "ref", parts[1])), set()).add(sem)
                continue
            ins = [root(v) for v in ins]
            if not any(_is_ref(v) for v in ins):
                continue
            if name == "cond":
                subs = [(b.jaxpr, b.jaxpr.invars, ins[1:]) for b in p["branches"]]
            elif name == "while":
                cn, bn = p["cond_nconsts"], p["body_nconsts"]
                body = p["body_jaxpr"].jaxpr
                subs = [(body, body.invars, ins[cn : cn + bn] + ins[cn + bn :])]
            elif name == "scan" or name in ("pjit", "jit"):
                subs = [(p["jaxpr"].jaxpr, p["jaxpr"].jaxpr.invars, ins)]
            elif name == "closed_call":
                subs = [(p["call_jaxpr"].jaxpr, p["call_jaxpr"].jaxpr.invars, ins)]
            elif name == "run_scoped":
                subs = [(p["jaxpr"], p["jaxpr"].constvars, ins)]
            elif sub_jaxprs(eqn):  # a container not followed here: any ref may be touched
                return False
            else:  # a load, store or other use of a ref, not a DMA
                continue
            for sub, params, outer in subs:
                inner_alias = {v: o for v, o in zip(params, outer, strict=True) if o is not None}
                if not walk(sub, inner_alias):
                    return False
        return True

    if not walk(getattr(jaxpr, "jaxpr", jaxpr), {}):
        return None
    return (
        {v: frozenset(sems) for v, sems in dst.items()},
        {v: frozenset(sems) for v, sems in src.items()},
    )


# ------------------------------------------------------------------ the evaluator


class _Evaluator:
    """Evaluates a kernel's jaxpr with its refs held in a :class:`_State` (at trace time, so
    loops become XLA loops that carry the state)."""

    def __init__(
        self,
        state: _State,
        coords: dict[str, Any],
        sizes: dict[str, int],
        touched: DmaRefs = None,
    ) -> None:
        self.state = state
        self.coords = coords  # core axis name -> this core's coordinate on it
        self.sizes = sizes
        self.touched = touched

    def dma(self, var: Any) -> Dma:
        """The semaphores of the DMAs that may write, and read, the ref of ``var``."""
        return dma_of(self.touched, var)

    def eval(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        from jax._src import core as jax_core
        from jax._src import source_info_util

        env: dict[Any, Any] = {}

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jax_core.Literal) else env[v]

        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for v, x in zip(jaxpr.invars, args, strict=True):
            env[v] = x
        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            rule = _RULES.get(eqn.primitive.name)
            with source_info_util.user_context(eqn.source_info.traceback):
                if rule is not None and _needs_rule(eqn):
                    outs = rule(self, eqn, ins)
                else:
                    params = eqn.primitive.get_bind_params(eqn.params)
                    outs = eqn.primitive.bind(*ins, **params)
                    if not eqn.primitive.multiple_results:
                        outs = [outs]
            for v, x in zip(eqn.outvars, outs, strict=True):
                env[v] = x
        return [read(v) for v in jaxpr.outvars]

    # -- refs

    def _access(self, ref: _Ref, transforms: Any, *, write: bool) -> None:
        st = self.state
        st.raise_flag(_out_of_bounds(transforms), _BOUNDS)
        if not (ref.dst or (write and ref.src)):  # no DMA of the kernel touches it
            return
        bounds = _bounds(transforms, ref.shape)
        hits = []
        if ref.dst:
            for sem in st.sems_of(ref.dst_sems):
                hits.append(_overlaps(ref, bounds, sem.dst, sem.dst_lo, sem.dst_hi, sem.active))
        if write and ref.src:
            for sem in st.sems_of(ref.src_sems):
                hits.append(_overlaps(ref, bounds, sem.src, sem.src_lo, sem.src_hi, sem.active))
        if hits:
            st.raise_flag(functools.reduce(jnp.logical_or, hits), _HAZARD)

    def _get(self, eqn: Any, ins: list[Any]) -> list[Any]:
        from jax._src import tree_util

        ref, *idx = ins
        transforms = tree_util.tree_unflatten(eqn.params["tree"], idx)
        self._access(ref, transforms, write=False)
        self._check_written(ref, transforms)
        return [_read(self.state.refs[ref.key], transforms)]

    def _check_written(self, ref: _Ref, transforms: Any) -> None:
        written = self.state.read_written(ref, transforms)
        if written is not None:
            self.state.raise_flag(~jnp.all(written), _UNWRITTEN)

    def _swap(self, eqn: Any, ins: list[Any]) -> list[Any]:
        from jax._src import tree_util

        ref, val, *idx = ins
        transforms = tree_util.tree_unflatten(eqn.params["tree"], idx)
        self._access(ref, transforms, write=True)
        old, new = _swap(self.state.refs[ref.key], transforms, val)
        self.state.refs[ref.key] = new
        self.state.mark_written(ref, transforms, True)
        return [old]

    def _addupdate(self, eqn: Any, ins: list[Any]) -> list[Any]:
        from jax._src import tree_util

        ref, val, *idx = ins
        transforms = tree_util.tree_unflatten(eqn.params["tree"], idx)
        self._access(ref, transforms, write=True)
        self._check_written(ref, transforms)
        value = self.state.refs[ref.key]
        old = _read(value, transforms)
        _, new = _swap(value, transforms, old + val)
        self.state.refs[ref.key] = new
        return []

    # -- DMAs

    def _dma_parts(self, eqn: Any, ins: list[Any]) -> tuple[Any, ...]:
        src, dst, sem, _, _ = eqn.params["tree"].unflatten(ins)
        parts = []
        for part in (src, dst, sem):
            ref = getattr(part, "ref", part)
            parts += [ref, tuple(self._read_indices(t) for t in getattr(part, "transforms", ()))]
        return tuple(parts)

    def _read_indices(self, transform: Any) -> Any:
        """``transform`` with each index that is a ref (a SparseCore indexed DMA's
        ``table.at[idx_ref]``) replaced by the indices the ref holds now, read as a load."""
        from jax._src.state import indexing

        if not isinstance(transform, indexing.NDIndexer):
            return transform
        indices = list(transform.indices)
        for d, index in enumerate(indices):
            ref = getattr(index, "ref", index)
            if isinstance(ref, _Ref):
                inner = tuple(self._read_indices(t) for t in getattr(index, "transforms", ()))
                self._access(ref, inner, write=False)
                self._check_written(ref, inner)

                indices[d] = _read(self.state.refs[ref.key], inner)
        if all(a is b for a, b in zip(indices, transform.indices, strict=True)):
            return transform
        return dataclasses.replace(transform, indices=tuple(indices))

    def _sem_index(self, sem_ref: _Ref, transforms: Any) -> Any:

        n = max(int(np.prod(sem_ref.shape)), 1)
        self.state.raise_flag(_out_of_bounds(transforms), _BOUNDS)
        box = _box(transforms, sem_ref.shape)
        if box is not None:  # the flat index of the element, as arithmetic
            flat: Any = jnp.int32(0)
            for start, dim in zip(box[0], sem_ref.shape, strict=True):
                flat = flat * dim + jnp.asarray(start, jnp.int32)
            return flat
        ids = jnp.arange(n, dtype=jnp.int32).reshape(sem_ref.shape)
        return jnp.reshape(_read(ids, transforms), (-1,))[0]

    def _dma_start(self, eqn: Any, ins: list[Any]) -> list[Any]:

        st = self.state
        src, src_t, dst, dst_t, sem_ref, sem_t = self._dma_parts(eqn, ins)
        s = self._sem_index(sem_ref, sem_t)
        self._access(src, src_t, write=False)
        self._access(dst, dst_t, write=True)
        sem = st.sems[sem_ref.key]
        row, r = _at(sem.table, s), st.rank
        # More DMAs on a semaphore with some in flight: one destination and one source ref
        # (their bytes are then one count, and their regions one box).
        active = row[1] != 0
        st.raise_flag(active & ((row[2] != dst.key) | (row[3] != src.key)), _HAZARD)
        data = _read(st.refs[src.key], src_t)
        _, st.refs[dst.key] = _swap(st.refs[dst.key], dst_t, data)
        if _indexed(dst_t):  # a scatter: repeated indices must carry the same data
            back = _read(st.refs[dst.key], dst_t)
            st.raise_flag(~jnp.all(_same_bits(back, data)), _REPEATED)
        # A DMA copies what it reads, written or not (the interpreter's shadow does the same).
        written = st.read_written(src, src_t)
        st.mark_written(dst, dst_t, True if written is None else written)
        dlo, dhi = _region(dst_t, dst.shape, st.rank)
        slo, shi = _region(src_t, src.shape, st.rank)
        # The boxes grow to hold this DMA's regions too.
        lows = jnp.concatenate([dlo, slo])
        highs = jnp.concatenate([dhi, shi])
        old_lo = jnp.concatenate([row[4 : 4 + r], row[4 + 2 * r : 4 + 3 * r]])
        old_hi = jnp.concatenate([row[4 + r : 4 + 2 * r], row[4 + 3 * r :]])
        lows = lax.select(jnp.broadcast_to(active, lows.shape), jnp.minimum(old_lo, lows), lows)
        highs = lax.select(jnp.broadcast_to(active, highs.shape), jnp.maximum(old_hi, highs), highs)
        count = row[0] + int(np.prod(data.shape))
        head = jnp.stack([count, jnp.int32(1), jnp.int32(dst.key), jnp.int32(src.key)])
        new = jnp.concatenate([head, lows[:r], highs[:r], lows[r:], highs[r:]])
        st.sems[sem_ref.key] = _Sem(_set(sem.table, s, new))
        return []

    def _dma_wait(self, eqn: Any, ins: list[Any]) -> list[Any]:

        st = self.state
        _, _, dst, dst_t, sem_ref, sem_t = self._dma_parts(eqn, ins)
        s = self._sem_index(sem_ref, sem_t)
        st.raise_flag(_out_of_bounds(dst_t), _BOUNDS)
        size = int(np.prod(_read(st.refs[dst.key], dst_t).shape))
        sem = st.sems[sem_ref.key]
        dlo, dhi = _region(dst_t, dst.shape, st.rank)
        # The wait names the destination of the DMAs in flight (a region inside theirs), and
        # no more bytes than they bring; they all stay in flight until the count is spent.
        row, r = _at(sem.table, s), st.rank
        count = row[0]
        matches = (
            (row[1] != 0)
            & (row[2] == dst.key)
            & jnp.all(row[4 : 4 + r] <= dlo)
            & jnp.all(dhi <= row[4 + r : 4 + 2 * r])
            & (count >= size)
        )
        st.raise_flag(~matches, _WAIT)
        left = count - size
        head = jnp.stack([left, (left > 0).astype(jnp.int32)])
        st.sems[sem_ref.key] = _Sem(_set(sem.table, s, jnp.concatenate([head, row[2:]])))
        return []

    # -- the core's index, scopes, control flow

    def _axis_index(self, eqn: Any, ins: list[Any]) -> list[Any]:
        del ins  # only the core axes run here (why_interpreted)
        return [self.coords[eqn.params["axis_name"]]]

    def _program_id(self, eqn: Any, ins: list[Any]) -> list[Any]:
        del ins  # a named grid's points are its cores
        return [list(self.coords.values())[eqn.params["axis"]]]

    def _num_programs(self, eqn: Any, ins: list[Any]) -> list[Any]:
        del ins
        return [jnp.int32(list(self.sizes.values())[eqn.params["axis"]])]

    def _run_scoped(self, eqn: Any, ins: list[Any]) -> list[Any]:
        inner = eqn.params["jaxpr"]
        scoped = [self.state.allocate(v.aval, self.dma(v), v) for v in inner.invars]
        outs = self.eval(inner, ins, scoped)
        self.state.release(scoped)
        return outs

    def _closed(self, closed: Any, ins: Sequence[Any]) -> list[Any]:
        return self.eval(closed.jaxpr, closed.consts, ins)

    def _pjit(self, eqn: Any, ins: list[Any]) -> list[Any]:
        return self._closed(eqn.params["jaxpr"], ins)

    def _closed_call(self, eqn: Any, ins: list[Any]) -> list[Any]:
        return self._closed(eqn.params["call_jaxpr"], ins)

    def _scan(self, eqn: Any, ins: list[Any]) -> list[Any]:
        p = eqn.params
        consts, init, xs = _scan_parts(p, ins)
        ncarry = len(init)
        st = self.state

        def body(carry: Any, x: Any) -> Any:
            state_carry, values = carry
            st.load(state_carry)
            outs = self._closed(p["jaxpr"], [*consts, *values, *x])
            return (st.carry(), outs[:ncarry]), outs[ncarry:]

        (final, values), ys = lax.scan(
            body,
            (st.carry(), list(init)),
            list(xs),
            length=p["length"],
            reverse=p["reverse"],
            unroll=p["unroll"],
        )
        st.load(final)
        return [*values, *ys]

    def _while(self, eqn: Any, ins: list[Any]) -> list[Any]:
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, init = ins[:cn], ins[cn : cn + bn], ins[cn + bn :]
        st = self.state

        def cond(carry: Any) -> Any:
            (out,) = self._closed(p["cond_jaxpr"], [*cconsts, *carry[1]])
            return out

        def body(carry: Any) -> Any:
            st.load(carry[0])
            values = self._closed(p["body_jaxpr"], [*bconsts, *carry[1]])
            return st.carry(), values

        final, values = lax.while_loop(cond, body, (st.carry(), list(init)))
        st.load(final)
        return list(values)

    def _cond(self, eqn: Any, ins: list[Any]) -> list[Any]:
        index, *ops = ins
        st = self.state
        start = st.carry()

        def branch(closed: Any) -> Callable[..., Any]:
            def run(carry: Any) -> Any:
                st.load(carry)
                outs = self._closed(closed, ops)
                return st.carry(), outs

            return run

        final, outs = lax.switch(index, [branch(b) for b in eqn.params["branches"]], start)
        st.load(final)
        return list(outs)


_RULES: dict[str, Callable[..., list[Any]]] = {
    "get": _Evaluator._get,
    "swap": _Evaluator._swap,
    "addupdate": _Evaluator._addupdate,
    "dma_start": _Evaluator._dma_start,
    "dma_wait": _Evaluator._dma_wait,
    "axis_index": _Evaluator._axis_index,
    "program_id": _Evaluator._program_id,
    "num_programs": _Evaluator._num_programs,
    "run_scoped": _Evaluator._run_scoped,
    "pjit": _Evaluator._pjit,
    "jit": _Evaluator._pjit,
    "closed_call": _Evaluator._closed_call,
    "scan": _Evaluator._scan,
    "while": _Evaluator._while,
    "cond": _Evaluator._cond,
}
#: The containers, bound as they are when neither a ref nor the core's index reaches them.
_CONTAINERS = ("pjit", "jit", "closed_call", "scan", "while", "cond")


def _needs_rule(eqn: Any) -> bool:
    if eqn.primitive.name not in _CONTAINERS:
        return True
    if any(_is_ref(v) for v in eqn.invars):
        return True
    inside = all_eqns(types.SimpleNamespace(eqns=[eqn]))
    return any(e.primitive.name == "axis_index" for e in inside)


# ------------------------------------------------------------------ the call


def run(
    *args: Any,
    kw: dict[str, Any],
    fill: Callable[..., Any],
    taint: bool,
    interpreted: Callable[..., list[Any]],
    note: Callable[[Any], None],
) -> list[Any]:
    """The outputs of the mesh kernel of ``kw`` on ``args``, compiled; the interpreter's
    (``interpreted(*args)``, in the same program) when the compiled run cannot vouch for them;
    ``note(flag)`` records which path the call took."""
    args = plain(args)
    jaxpr, gm = kw["jaxpr"], kw["grid_mapping"]
    n_out = gm.num_outputs
    n_in = len(gm.block_mappings) - n_out
    invars = jaxpr.invars
    st = _State(ref_rank(jaxpr), fill, taint)
    touched = dma_refs(jaxpr)
    aliases = {o: i for i, o in kw.get("input_output_aliases") or ()}
    inputs = []
    for i, (v, x) in enumerate(zip(invars[:n_in], args, strict=True)):
        dma = dma_of(touched, v)
        for o in (o for o, to in aliases.items() if to == i):  # the output it also is
            dma = dma_union(dma, dma_of(touched, invars[n_in + o]))
        inputs.append(st.bind(v.aval, x, dma))
    outputs = []
    for k, v in enumerate(invars[n_in : n_in + n_out]):
        if k in aliases:
            outputs.append(inputs[aliases[k]])
        else:
            outputs.append(st.allocate(v.aval, dma_of(touched, v)))
    sizes = dict(core_axes(kw))
    cores = int(np.prod(list(sizes.values())))

    def one_core(core: Any, carry: Any) -> Any:
        st.load(carry)
        coords, rest = {}, core
        for name, size in reversed(sizes.items()):  # row-major, as the interpreter's grid
            coords[name], rest = rest % size, rest // size
        coords = {name: coords[name] for name in sizes}
        scratch = [st.allocate(v.aval, dma_of(touched, v), v) for v in invars[n_in + n_out :]]
        _Evaluator(st, coords, sizes, touched).eval(jaxpr, (), [*inputs, *outputs, *scratch])
        st.release(scratch)
        return st.carry()

    st.load(lax.fori_loop(0, cores, one_core, st.carry()))
    results = [st.refs[o.key] for o in outputs]
    return vouched(st, results, args, interpreted, note)


def plain(args: Sequence[Any]) -> tuple[Any, ...]:
    """Operands typed with a memory space (HBM outputs of other kernels) as plain arrays."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    return tuple(ipc.remove_memory_space_p.bind(a) for a in args)


def ref_rank(jaxpr: Any) -> int:
    """The largest rank of the kernel's refs, its scoped ones too (the regions' width)."""
    return max(
        [len(v.aval.shape) for v in jaxpr.invars if _is_ref(v)]
        + [
            len(v.aval.shape)
            for e in all_eqns(jaxpr)
            if e.primitive.name == "run_scoped"
            for v in e.params["jaxpr"].invars
        ]
        + [1]
    )


def vouched(
    st: _State,
    results: list[Any],
    args: Sequence[Any],
    interpreted: Callable[..., list[Any]],
    note: Callable[[Any], None],
) -> list[Any]:
    """``results``, if the flag of ``st`` (with a result holding unwritten memory) stays
    down on every device; else the interpreter's (``interpreted(*args)``), in the same
    program, whose call ``note(flag)`` records."""
    from jax._src import core as jax_core

    if st.taint:
        for value in results:
            layout = shadow.taint_layout(np.dtype(value.dtype))
            if layout is not None:
                bits = lax.bitcast_convert_type(value, layout[0])
                st.raise_flag(jnp.any(shadow.tagged(bits, layout)), _TAINT)
    flag = st.flag
    axes = tuple(a for a in jax_core.get_axis_env().axis_sizes if a is not None)
    if axes:  # every device takes the same path: the interpreter's devices meet in barriers
        flag = functools.reduce(
            jnp.bitwise_or, [lax.pmax(flag & bit, axes) for bit in FLAG_REASONS]
        )

    def slow(operands: Any) -> Any:
        jax.debug.callback(note, flag)
        return list(interpreted(*operands))

    def fast(operands: Any) -> Any:
        del operands  # the compiled results stand
        return results

    return list(lax.cond(flag != 0, slow, fast, list(args)))


def reasons(flag: Any) -> str:
    """The flag's bits as words."""
    value = int(np.asarray(flag))
    return "; ".join(text for bit, text in FLAG_REASONS.items() if value & bit) or "none"
