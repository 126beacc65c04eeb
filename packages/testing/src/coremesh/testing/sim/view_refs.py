"""Loads, stores and DMAs through ``ref.reshape(...)`` and transposed refs.

The interpreter reads every transform of a ref as an index (utils.py ``to_range``), so an access
through a reshaped ref fails inside its callback with "'ReshapeTransform' object has no attribute
'indices'"; JAX's ``ragged_paged_attention`` loads its KV pages that way. A reshape renumbers a
row-major buffer's elements and a transpose permutes its axes; an index after either picks a set
of them. When that set is a strided box of the buffer (``ragged_paged_attention`` loads every
second row of a ``(pages * tokens * heads, dim)`` view: one head of the ``(pages, tokens, heads,
dim)`` buffer), the access runs as that box, with its elements put in the order the view gives
them, so bounds, race and unwritten-memory checks see exactly the elements touched. Any other set
is refused by name ("not simulated"), never read or written in part.
"""

from __future__ import annotations

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
    return name


def _has_view(transforms: Any) -> bool:
    return isinstance(transforms, tuple | list) and any(
        _kind(t) in ("reshape", "transpose") for t in transforms
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


def _plan(
    transforms: Any, buffer_shape: Callable[[], tuple[int, ...]]
) -> tuple[Any, np.ndarray, tuple[int, ...]]:
    """The plain indexer of the box a view access touches, the picked elements' positions in
    it, and the view's shape."""
    import jax
    from jax._src.pallas.mosaic.interpret import utils
    from jax._src.state import indexing

    transforms = jax.tree.map(int, tuple(transforms))  # the callback's 0-d arrays

    first = next(i for i, t in enumerate(transforms) if _kind(t) in ("reshape", "transpose"))
    pre, view = tuple(transforms[:first]), _describe(transforms[first:])
    if any(_kind(t) != "index" for t in pre):
        raise NotImplementedError("not simulated: a bitcast before ref.reshape / transpose")
    shape = tuple(pre[0].shape) if pre else buffer_shape()
    axes = _full(shape, utils.to_range(pre))
    kept = [a for a in axes if not isinstance(a, int)]
    region = tuple(len(range(a.start, a.stop, a.step or 1)) for a in kept)
    box, pos, view_shape = _box(region, view)
    boxed = iter(box)
    indices = []
    for a in axes:
        if isinstance(a, int):
            indices.append(indexing.Slice(a, 1, 1))
        else:
            start, count, step = next(boxed)
            stride = a.step or 1
            indices.append(indexing.Slice(a.start + start * stride, count, step * stride))
    return (indexing.NDIndexer(tuple(indices), shape, ()),), pos, view_shape


def _picked(box: np.ndarray, pos: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    picked: np.ndarray = np.asarray(box).reshape(-1)[pos]
    return picked.reshape(shape)


def _boxed(value: Any, pos: np.ndarray, box_shape: tuple[int, ...]) -> np.ndarray:
    value = np.asarray(value)
    out = np.empty(math.prod(box_shape), value.dtype)
    out[pos] = value.reshape(-1)
    return out.reshape(box_shape)


def _box_shape(indexer: tuple[Any, ...]) -> tuple[int, ...]:
    return tuple(int(s.size) for s in indexer[0].indices)


def targets() -> list[tuple[Any, str, Any]]:
    """The interpreter's load, store and swap callbacks (DMAs call the first two too)."""
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    def shape_of(
        device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any
    ) -> Callable[[], tuple[int, ...]]:
        def lookup() -> tuple[int, ...]:
            space = ipc.TPU_MEMORY_SPACE_NAMES[int(memory_space)]
            core = ipc._local_core_id_or_zero_if_hbm(int(local_core_id), space)
            buf = ipc._get_shared_memory().mem[(space, int(buffer_id), int(device_id), core)]
            return tuple(np.shape(getattr(buf, "content", buf)))

        return lookup

    raw_get, raw_store, raw_swap = ipc.get.__wrapped__, ipc.store.__wrapped__, ipc.swap.__wrapped__

    def get(
        token: Any,
        device_id: Any,
        local_core_id: Any,
        memory_space: Any,
        buffer_id: Any,
        transforms: Any,
        *a: Any,
        **kw: Any,
    ) -> Any:
        if not _has_view(transforms):
            return raw_get(
                token, device_id, local_core_id, memory_space, buffer_id, transforms, *a, **kw
            )
        indexer, pos, shape = _plan(
            transforms, shape_of(device_id, local_core_id, memory_space, buffer_id)
        )
        token, box = raw_get(
            token, device_id, local_core_id, memory_space, buffer_id, indexer, *a, **kw
        )
        return token, _picked(box, pos, shape)

    def store(
        token: Any,
        device_id: Any,
        local_core_id: Any,
        memory_space: Any,
        buffer_id: Any,
        transforms: Any,
        val: Any,
        *a: Any,
        **kw: Any,
    ) -> Any:
        if not _has_view(transforms):
            return raw_store(
                token, device_id, local_core_id, memory_space, buffer_id, transforms, val, *a, **kw
            )
        indexer, pos, _ = _plan(
            transforms, shape_of(device_id, local_core_id, memory_space, buffer_id)
        )
        val = _boxed(val, pos, _box_shape(indexer))
        return raw_store(
            token, device_id, local_core_id, memory_space, buffer_id, indexer, val, *a, **kw
        )

    def swap(
        token: Any,
        device_id: Any,
        local_core_id: Any,
        memory_space: Any,
        buffer_id: Any,
        transforms: Any,
        val: Any,
        mask: Any,
        *a: Any,
        **kw: Any,
    ) -> Any:
        if not _has_view(transforms):
            return raw_swap(
                token,
                device_id,
                local_core_id,
                memory_space,
                buffer_id,
                transforms,
                val,
                mask,
                *a,
                **kw,
            )
        indexer, pos, shape = _plan(
            transforms, shape_of(device_id, local_core_id, memory_space, buffer_id)
        )
        box_shape = _box_shape(indexer)
        val = _boxed(val, pos, box_shape)
        mask = None if mask is None else _boxed(mask, pos, box_shape)
        token, old = raw_swap(
            token, device_id, local_core_id, memory_space, buffer_id, indexer, val, mask, *a, **kw
        )
        return token, _picked(old, pos, shape)

    return [
        (ipc, "get", ipc.fail_on_exception(get)),
        (ipc, "store", ipc.fail_on_exception(store)),
        (ipc, "swap", ipc.fail_on_exception(swap)),
    ]
