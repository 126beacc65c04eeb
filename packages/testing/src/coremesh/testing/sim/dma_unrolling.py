"""How many strided levels a DMA's window has in the chip's tiled memory: Mosaic unrolls a
transfer of :data:`UNROLLED_FROM` or more into several DMAs, and refuses that when the DMA
signals a REGULAR semaphore ("Not implemented: Non-DMA semaphores in transfers that require
unrolling": the unrolled DMAs would each signal it).

Memory holds a ref's two minor dimensions as tiles (8 x 128 32-bit words; 16 or 32 rows for
16- and 8-bit types), each tile contiguous. Going from the innermost contiguous unit outward
(whole tiles, or the rows of a tile a window takes), a dimension whose window is one element
only breaks contiguity; one that can follow the unit inside it (that unit spans its dimension
whole) merges with it; any other starts a level. Measured with libtpu 0.0.52 (jax 0.12.0.1,
v5p, v6e; ``tests/sim/test_regular_dma.py`` compares libtpu's verdict with this count): float32
windows of 2 of 3 along 4 leading dimensions of ``(3, 3, 3, 3, 8, 128)`` (3 levels) compile, of
``(3, 3, 3, 3, 3, 8, 128)`` (4) do not; so do not 2 of 3 rows of a tile under 4 strided
dimensions (JAX's ``test_unrolled_dma_with_regular_semaphore_raises``), or one lane tile of two
under a full dimension and 4 strided ones. Windows the count cannot follow (a gather, a reshape
or bitcast view, a slice of a slice with a stride) count as fewer levels, never more: what the
compiler might take is not refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

#: A transfer with this many strided levels or more is unrolled into several DMAs.
UNROLLED_FROM = 4

_LANES = 128


@dataclasses.dataclass(frozen=True)
class _Dim:
    """One dimension of a window: its extent, the ref's, and whether the window starts at 0
    (unknown starts count as aligned)."""

    window: int
    full: int
    start: int | None = 0
    stride: int = 1


def _window(ref: Any) -> tuple[list[_Dim], Any] | None:
    """The window a DMA side reads or writes, per dimension of the ref under it, and the ref's
    dtype; None when it is not a box of static size."""
    from jax._src.state import indexing, types

    transforms: tuple[Any, ...] = ()
    if isinstance(ref, types.TransformedRef):
        ref, transforms = ref.ref, tuple(ref.transforms)
    aval = getattr(ref, "aval", None)
    inner = getattr(aval, "inner_aval", aval)
    shape = getattr(inner, "shape", None)
    if shape is None:
        return None
    dims = [_Dim(int(n), int(n)) for n in shape]
    view = list(range(len(dims)))  # the ref dimension each dimension of the view is
    for t in transforms:
        if not isinstance(t, indexing.NDIndexer) or t.int_indexer_shape:
            return None
        kept = []
        for axis, index in zip(view, t.indices, strict=False):
            if isinstance(index, indexing.Slice):
                size, stride = index.size, index.stride
                if not isinstance(size, int | np.integer) or not isinstance(stride, int):
                    return None
                start = index.start if isinstance(index.start, int | np.integer) else None
                old = dims[axis]
                if old.window != old.full and (stride != 1 or old.stride != 1):
                    return None
                base = None if start is None or old.start is None else old.start + start
                dims[axis] = _Dim(int(size), old.full, base, old.stride * stride)
                kept.append(axis)
            else:  # a scalar index: one element of this dimension
                old = dims[axis]
                dims[axis] = _Dim(1, old.full, None, old.stride)
        view = kept + view[len(t.indices) :]
    return dims, getattr(inner, "dtype", None)


def _tile_rows(dtype: Any) -> int:
    itemsize = np.dtype(dtype).itemsize if dtype is not None else 4
    return 8 * max(1, 4 // itemsize)


def levels(dims: list[_Dim], dtype: Any) -> int:
    """The strided levels of a window over a tiled ref (see the module's docstring)."""
    if len(dims) < 2:
        return 0
    *leading, rows, lanes = dims
    tile_rows = _tile_rows(dtype)
    inner_partial = False
    tiled = []
    for dim, tile in ((rows, tile_rows), (lanes, _LANES)):
        tiles = -(-dim.full // tile)
        if dim.window == dim.full and dim.stride == 1:
            tiled.append(_Dim(tiles, tiles))
        elif dim.stride == 1 and dim.window % tile == 0 and (dim.start or 0) % tile == 0:
            tiled.append(_Dim(dim.window // tile, tiles))
        else:  # part of each tile: the tile's rows (or lanes) the window takes are the unit
            inner_partial = True
            tiled.append(_Dim(1, tiles))
    count = 0
    mergeable = not inner_partial
    for dim in reversed([*leading, *tiled]):
        if dim.window == 1:
            mergeable = mergeable and dim.full == 1
            continue
        if not mergeable:
            count += 1
        mergeable = dim.window == dim.full and dim.stride == 1
    return count


def needs_unrolling(eqn: Any) -> bool:
    """Does Mosaic unroll the transfer of this ``dma_start`` equation (either side's window)?"""
    src, dst, *_ = eqn.params["tree"].unflatten(eqn.invars)
    for side in (src, dst):
        window = _window(side)
        if window is not None and levels(*window) >= UNROLLED_FROM:
            return True
    return False
