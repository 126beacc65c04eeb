"""Loads, stores and DMAs through ``ref.reshape(...)``, ``ref.transpose(...)`` and
``ref.bitcast(...)``.

The interpreter reads every transform of a ref as an index (utils.py ``to_range``), so an access
through a reshaped ref fails inside its callback with "'ReshapeTransform' object has no attribute
'indices'"; JAX's ``ragged_paged_attention`` loads its KV pages that way. A reshape renumbers a
row-major buffer's elements and a transpose permutes its axes; an index after either picks a set
of them. When that set is a strided box of the buffer (``ragged_paged_attention`` loads every
second row of a ``(pages * tokens * heads, dim)`` view: one head of the ``(pages, tokens, heads,
dim)`` buffer), the access runs as that box, with its elements put in the order the view gives
them, so bounds, race and unwritten-memory checks see exactly the elements touched. Any other set
is refused by name ("not simulated"), never read or written in part.

``ref.bitcast(dtype)`` reinterprets the bits along the second-minor axis, as Mosaic lays packed
types out and as jax discharges it (``jax._src.state.utils.bitcast``: ``k`` consecutive narrow
rows make one wide row, the first in the lowest bits). An access through it runs on the buffer
elements under it (an index on that axis picks whole buffer rows: any index when the width
is kept, whole groups of packed rows when it changes; another is refused), and a load converts
them, a store converts back; sub-byte types included (int4 is held one per byte).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

#: Box of one region axis: (start, count, step) in the region's own coordinates.
_Box = tuple[tuple[int, int, int], ...]


def _kind(transform: Any) -> str:
    name = type(transform).__name__
    if name == "NDIndexer":
        return "index"
    if name == "ReshapeTransform":
        return "reshape"
    if name == "TransposeTransform":
        return "transpose"
    if name == "BitcastTransform":
        return "bitcast"
    return name


def _has_view(transforms: Any) -> bool:
    return isinstance(transforms, tuple | list) and any(
        _kind(t) in ("reshape", "transpose", "bitcast") for t in transforms
    )


def _index(indexer: Any) -> tuple[int | tuple[int, int, int], ...]:
    """An NDIndexer with concrete values as ints and (start, size, stride) triples."""
    out: list[int | tuple[int, int, int]] = []
    for i in indexer.indices:
        if hasattr(i, "stride"):
            out.append((int(i.start), int(i.size), int(i.stride)))
        elif np.ndim(i) == 0:
            out.append(int(i))
        else:
            raise NotImplementedError(
                "not simulated: an array index after ref.reshape / transpose (gather-style "
                "indexing of a view)"
            )
    return tuple(out)


def _describe(transforms: Any) -> tuple[Any, ...]:
    """The view's transforms after its first reshape or transpose, as a hashable key."""
    out: list[Any] = []
    for t in transforms:
        kind = _kind(t)
        if kind == "index":
            out.append(("index", _index(t)))
        elif kind == "reshape":
            out.append(("reshape", tuple(int(d) for d in t.shape)))
        elif kind == "transpose":
            out.append(("transpose", tuple(int(p) for p in t.permutation)))
        else:
            raise NotImplementedError(
                f"not simulated: a {kind} after ref.reshape / transpose in one access"
            )
    return tuple(out)


@functools.lru_cache(maxsize=512)
def _box(
    region: tuple[int, ...], view: tuple[Any, ...]
) -> tuple[_Box, np.ndarray, tuple[int, ...]]:
    """Which elements of a region of ``region``'s shape the view picks: the strided box they
    form, each picked element's position in the box (row-major), and the view's shape."""
    idx = np.arange(math.prod(region), dtype=np.int64).reshape(region)
    for kind, arg in view:
        if kind == "reshape":
            idx = idx.reshape(arg)
        elif kind == "transpose":
            idx = idx.transpose(arg)
        else:
            idx = idx[
                tuple(
                    a if isinstance(a, int) else slice(a[0], a[0] + a[1] * a[2], a[2]) for a in arg
                )
            ]
    shape = tuple(idx.shape)
    picked = idx.reshape(-1)
    coords = np.unravel_index(picked, region)
    box: list[tuple[int, int, int]] = []
    for axis in coords:
        values = np.unique(axis)
        step = int(values[1] - values[0]) if values.size > 1 else 1
        if values.size > 1 and not (np.diff(values) == step).all():
            raise _not_a_box(region, view)
        box.append((int(values[0]), int(values.size), step))
    if math.prod(c for _, c, _ in box) != picked.size or np.unique(picked).size != picked.size:
        raise _not_a_box(region, view)
    strides = np.cumprod([1, *(c for _, c, _ in box[:0:-1])])[::-1]
    pos = sum(
        ((axis - start) // step) * int(stride)
        for axis, (start, _, step), stride in zip(coords, box, strides, strict=True)
    )
    return tuple(box), np.asarray(pos, np.int64).reshape(-1), shape


def _not_a_box(region: tuple[int, ...], view: tuple[Any, ...]) -> NotImplementedError:
    return NotImplementedError(
        f"not simulated: an access through ref.reshape / transpose whose elements are not a "
        f"strided box of the buffer region {region} ({view})"
    )


def _full(shape: tuple[int, ...], rng: tuple[Any, ...]) -> list[Any]:
    """``rng`` (ints and slices, possibly short) over every axis of ``shape``."""
    return [*rng, *(slice(0, d, 1) for d in shape[len(rng) :])]


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A view access as a plain one: the indexer of the buffer box it touches, and how a box's
    values become the view's (a load) and back (a store)."""

    indexer: tuple[Any, ...]
    to_view: Callable[[np.ndarray], np.ndarray]
    to_box: Callable[[np.ndarray], np.ndarray]
    #: A mask over the view's elements as one over the box's; None across a width change.
    mask_to_box: Callable[[np.ndarray], np.ndarray] | None


def _plan(transforms: Any, buffer: Callable[[], tuple[tuple[int, ...], Any]]) -> _Plan:
    """The plain access a view access is; ``buffer`` gives the buffer's shape and dtype."""
    import jax
    from jax._src.pallas.mosaic.interpret import utils

    transforms = jax.tree.map(int, tuple(transforms))  # the callback's 0-d arrays
    first = next(i for i, t in enumerate(transforms) if _kind(t) != "index")
    pre = tuple(transforms[:first])
    shape = tuple(pre[0].shape) if pre else buffer()[0]
    axes = _full(shape, utils.to_range(pre))
    if _kind(transforms[first]) == "bitcast":
        return _bitcast_plan(shape, axes, transforms[first], transforms[first + 1 :], buffer)
    j = next((j for j in range(first + 1, len(transforms)) if _kind(transforms[j]) == "bitcast"), 0)
    if j:
        return _view_bitcast_plan(
            shape, axes, transforms[first:j], transforms[j], transforms[j + 1 :], buffer
        )
    box, pos, view_shape = _box(_region(axes), _describe(transforms[first:]))
    indexer = _indexer(shape, axes, iter(box))
    full_box = tuple(int(s.size) for s in indexer[0].indices)

    def to_box(v: np.ndarray) -> np.ndarray:
        return _boxed(v, pos, full_box)

    return _Plan(indexer, lambda b: _picked(b, pos, view_shape), to_box, to_box)


def _region(axes: list[Any]) -> tuple[int, ...]:
    """The shape of the buffer region ``axes`` (ints and slices) select, ints dropped."""
    return tuple(len(range(a.start, a.stop, a.step or 1)) for a in axes if not isinstance(a, int))


#: Why an access through a view of a bitcast view is refused (as the kernel is traced, and here).
AFTER_BITCAST = "ref.reshape / transpose / a second bitcast after ref.bitcast"


def _views_after_bitcast(post: Any) -> bool:
    """Do the transforms after a ``ref.bitcast`` (``post``) hold anything but indices?"""
    return any(_kind(t) != "index" for t in post)


def _only_indices_after_bitcast(post: tuple[Any, ...]) -> None:
    if _views_after_bitcast(post):
        raise NotImplementedError(f"not simulated: {AFTER_BITCAST}")


def unsimulated_chain(transforms: Any) -> bool:
    """Is a ref access through ``transforms`` one this module refuses whatever the indices:
    a reshape, transpose or bitcast of a bitcast view? (The check the access itself makes,
    ``_only_indices_after_bitcast``, on the transforms after the first bitcast.)"""
    kinds = [_kind(t) for t in transforms]
    if "bitcast" not in kinds:
        return False
    return _views_after_bitcast(transforms[kinds.index("bitcast") + 1 :])


def view_chains(eqn: Any) -> list[tuple[Any, ...]]:
    """The transform sequences of ``eqn``'s ref operands (a load, a store, a DMA's two refs),
    from its ``tree`` parameter; none for an equation without one."""
    import jax

    tree = eqn.params.get("tree")
    n = getattr(tree, "num_leaves", None)
    if n is None or n > len(eqn.invars):
        return []
    try:
        args = jax.tree.unflatten(tree, list(eqn.invars[len(eqn.invars) - n :]))
    except Exception:
        return []
    out: list[tuple[Any, ...]] = []
    stack = [args]
    while stack:
        item = stack.pop()
        if hasattr(item, "transforms") and not isinstance(item, tuple | list):
            out.append(tuple(item.transforms))
        elif isinstance(item, tuple | list):
            if item and all(_kind(t) in ("index", "reshape", "transpose", "bitcast") for t in item):
                out.append(tuple(item))
            else:
                stack += list(item)
    return out


def _bitcast_shape(
    shape: tuple[int, ...], src: np.dtype[Any], dst: np.dtype[Any]
) -> tuple[int, ...]:
    """The shape of a ``shape`` view of ``src`` elements bitcast to ``dst``: the second-minor
    axis scaled by the width ratio (a width change of a 1-D view is not simulated)."""
    if len(shape) < 2:
        if _width(src) != _width(dst):
            raise NotImplementedError(
                "not simulated: a bitcast of a 1-D ref that changes the width"
            )
        return shape
    return (*shape[:-2], shape[-2] * _width(src) // _width(dst), shape[-1])


def _indexer(shape: tuple[int, ...], axes: list[Any], box: Any) -> tuple[Any, ...]:
    """An NDIndexer of ``shape``: each int axis as a 1-wide slice, each slice axis narrowed to
    the next (start, count, step) of ``box`` in its own coordinates."""
    from jax._src.state import indexing

    indices = []
    for a in axes:
        if isinstance(a, int):
            indices.append(indexing.Slice(a, 1, 1))
        else:
            start, count, step = next(box)
            stride = a.step or 1
            indices.append(indexing.Slice(a.start + start * stride, count, step * stride))
    return (indexing.NDIndexer(tuple(indices), shape, ()),)


def _bitcast_plan(
    shape: tuple[int, ...],
    axes: list[Any],
    bitcast: Any,
    post: tuple[Any, ...],
    buffer: Callable[[], tuple[tuple[int, ...], Any]],
) -> _Plan:
    from jax._src.pallas.mosaic.interpret import utils

    _only_indices_after_bitcast(post)
    src, dst = np.dtype(buffer()[1]), np.dtype(bitcast.dtype)
    view = _bitcast_shape(_region(axes), src, dst)
    index = _full(view, utils.to_range(post))
    box: list[tuple[int, int, int]] = []
    squeeze: list[int] = []
    for j, sel in enumerate(index):
        if j == len(view) - 2 and _width(src) != _width(dst):
            rows = _bitcast_rows(sel, _width(src), _width(dst))
            if rows is None:
                raise NotImplementedError(
                    "not simulated: an index on the second-minor axis after a ref.bitcast that "
                    "changes the width, other than whole groups of packed rows"
                )
            box.append(rows)
            if isinstance(sel, int):
                squeeze.append(j)
        elif isinstance(sel, int):
            box.append((sel, 1, 1))
            squeeze.append(j)
        else:
            box.append((sel.start, len(range(sel.start, sel.stop, sel.step or 1)), sel.step or 1))
    indexer = _indexer(shape, axes, iter(box))
    full_box = tuple(int(s.size) for s in indexer[0].indices)
    kept_box = tuple(c for _, c, _ in box)

    def to_view(b: np.ndarray) -> np.ndarray:
        out = _np_bitcast(np.asarray(b).reshape(kept_box), dst)
        return out.squeeze(tuple(squeeze)) if squeeze else out

    def unsqueezed(v: np.ndarray) -> np.ndarray:
        return np.expand_dims(v, tuple(squeeze)) if squeeze else v

    def to_box(v: np.ndarray) -> np.ndarray:
        return _np_bitcast(unsqueezed(np.asarray(v, dst)), src).reshape(full_box)

    def mask_to_box(m: np.ndarray) -> np.ndarray:
        return unsqueezed(np.asarray(m)).reshape(full_box)

    same_width = _width(src) == _width(dst)
    return _Plan(indexer, to_view, to_box, mask_to_box if same_width else None)


def _view_bitcast_plan(
    shape: tuple[int, ...],
    axes: list[Any],
    view: tuple[Any, ...],
    bitcast: Any,
    post: tuple[Any, ...],
    buffer: Callable[[], tuple[tuple[int, ...], Any]],
) -> _Plan:
    """A load through ref.reshape / transpose, then ref.bitcast, then indices (JAX's ragged
    paged attention's strided K/V loads): the view's box is read whole, bitcast as the view,
    and indexed. A store this way is refused (a narrow store into packed words would be a
    read-modify-write the view does not say)."""
    from jax._src.pallas.mosaic.interpret import utils

    _only_indices_after_bitcast(post)
    src, dst = np.dtype(buffer()[1]), np.dtype(bitcast.dtype)
    box, pos, view_shape = _box(_region(axes), _describe(view))
    picks = tuple(_full(_bitcast_shape(view_shape, src, dst), utils.to_range(post)))
    indexer = _indexer(shape, axes, iter(box))

    def to_view(b: np.ndarray) -> np.ndarray:
        return np.asarray(_np_bitcast(_picked(b, pos, view_shape), dst)[picks])

    def to_box(v: np.ndarray) -> np.ndarray:
        raise NotImplementedError(
            "not simulated: a store through ref.reshape / transpose and then ref.bitcast"
        )

    return _Plan(indexer, to_view, to_box, None)


def _bitcast_rows(sel: Any, src_bits: int, dst_bits: int) -> tuple[int, int, int] | None:
    """The buffer rows (start, count, step) under the rows ``sel`` (an int or a slice) picks on
    the second-minor axis of a bitcast view that changes the width; None when they are not
    whole buffer rows (part of a wide row) or not contiguous."""
    step = 1 if isinstance(sel, int) else (sel.step or 1)
    if isinstance(sel, int):
        start, n = sel, 1
    else:
        start, n = sel.start, len(range(sel.start, sel.stop, step))
    if step != 1:
        return None
    if src_bits < dst_bits:  # k narrow buffer rows make one view row
        k = dst_bits // src_bits
        return (start * k, n * k, 1)
    q = src_bits // dst_bits  # one wide buffer row makes q view rows
    if isinstance(sel, int) or start % q or n % q:
        return None
    return (start // q, n // q, 1)


def _width(dtype: Any) -> int:
    from jax._src import dtypes

    return int(dtypes.itemsize_bits(dtype))


def _bits(x: np.ndarray) -> np.ndarray:
    """Each element's bits, as uint64 (sub-byte integers: their two's complement low bits)."""
    w = _width(x.dtype)
    if w >= 8:
        return np.ascontiguousarray(x).view(f"uint{w}").astype(np.uint64)
    return (x.astype(np.int8).view(np.uint8) & ((1 << w) - 1)).astype(np.uint64)


def _from_bits(b: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    w = _width(dtype)
    if w >= 8:
        return b.astype(f"uint{w}").view(dtype)
    v = b.astype(np.int16)
    if np.issubdtype(dtype, np.signedinteger):
        v = np.where(v >= 1 << (w - 1), v - (1 << w), v)
    return v.astype(dtype)


def _np_bitcast(x: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``jax._src.state.utils.bitcast`` in numpy: narrow rows packed into wide ones along the
    second-minor axis (the first in the lowest bits), or a wide row split into narrow ones."""
    sb, db = _width(x.dtype), _width(dtype)
    b = _bits(x)
    if sb < db:
        r = db // sb
        *lead, rows, cols = b.shape
        parts = b.reshape(*lead, rows // r, r, cols)
        b = sum((parts[..., k, :] << np.uint64(sb * k) for k in range(r)), np.zeros((), np.uint64))
    elif sb > db:
        q = sb // db
        mask = np.uint64((1 << db) - 1)
        parts = np.stack([(b >> np.uint64(db * k)) & mask for k in range(q)], axis=-2)
        *lead, rows, _, cols = parts.shape
        b = parts.reshape(*lead, rows * q, cols)
    return _from_bits(np.asarray(b), dtype)


def _picked(box: np.ndarray, pos: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    picked: np.ndarray = np.asarray(box).reshape(-1)[pos]
    return picked.reshape(shape)


def _boxed(value: Any, pos: np.ndarray, box_shape: tuple[int, ...]) -> np.ndarray:
    value = np.asarray(value)
    out = np.empty(math.prod(box_shape), value.dtype)
    out[pos] = value.reshape(-1)
    return out.reshape(box_shape)


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's load, store and swap callbacks (DMAs call the first two too)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    def buffer_of(
        device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any
    ) -> Callable[[], tuple[tuple[int, ...], Any]]:
        def lookup() -> tuple[tuple[int, ...], Any]:
            space = ipc.TPU_MEMORY_SPACE_NAMES[int(memory_space)]
            core = ipc._local_core_id_or_zero_if_hbm(int(local_core_id), space)
            buf = ipc._get_shared_memory().mem[(space, int(buffer_id), int(device_id), core)]
            content = getattr(buf, "content", buf)
            # the ref's own shape: the content may run on into its last tiles' padding
            shape = getattr(buf, "logical_shape", np.shape(content))
            return tuple(shape), content.dtype

        return lookup

    raw_get, raw_store, raw_swap = ipc.get.__wrapped__, ipc.store.__wrapped__, ipc.swap.__wrapped__

    def get(
        token: Any, dev: Any, core: Any, space: Any, buf: Any, transforms: Any, *a: Any, **kw: Any
    ) -> Any:
        if not _has_view(transforms):
            return raw_get(token, dev, core, space, buf, transforms, *a, **kw)
        plan = _plan(transforms, buffer_of(dev, core, space, buf))
        token, box = raw_get(token, dev, core, space, buf, plan.indexer, *a, **kw)
        return token, plan.to_view(box)

    def store(
        token: Any,
        dev: Any,
        core: Any,
        space: Any,
        buf: Any,
        transforms: Any,
        val: Any,
        *a: Any,
        **kw: Any,
    ) -> Any:
        if not _has_view(transforms):
            return raw_store(token, dev, core, space, buf, transforms, val, *a, **kw)
        plan = _plan(transforms, buffer_of(dev, core, space, buf))
        return raw_store(token, dev, core, space, buf, plan.indexer, plan.to_box(val), *a, **kw)

    def swap(
        token: Any,
        dev: Any,
        core: Any,
        space: Any,
        buf: Any,
        transforms: Any,
        val: Any,
        mask: Any,
        *a: Any,
        **kw: Any,
    ) -> Any:
        if not _has_view(transforms):
            return raw_swap(token, dev, core, space, buf, transforms, val, mask, *a, **kw)
        plan = _plan(transforms, buffer_of(dev, core, space, buf))
        box_mask = None
        if mask is not None:
            if plan.mask_to_box is None:
                raise NotImplementedError(
                    "not simulated: a masked store through a ref.bitcast that changes the width"
                )
            box_mask = plan.mask_to_box(np.asarray(mask))
        token, old = raw_swap(
            token, dev, core, space, buf, plan.indexer, plan.to_box(val), box_mask, *a, **kw
        )
        return token, plan.to_view(old)

    return [
        (ipc, "get", ipc.fail_on_exception(get)),
        (ipc, "store", ipc.fail_on_exception(store)),
        (ipc, "swap", ipc.fail_on_exception(swap)),
    ]
