"""Splitting work across cores: tile-aligned, remainder-aware, and loud when it cannot be done.

A TensorCore moves data in (sublane, lane) tiles: (8, 128) for 32-bit types, (16, 128) for 16-bit,
(32, 128) for 8-bit. A core's share of rows must start and end on a tile boundary or its DMAs
straddle tiles, which Mosaic rejects ("Offsets along tiled dimensions must be aligned to tiles").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

from coremesh.core.chips import Chip, get_chip
from coremesh.core.dtypes import check_array_dtype, itemsize
from coremesh.core.errors import LayoutError

Remainder = Literal["spread", "refuse"]


@dataclasses.dataclass(frozen=True)
class Span:
    """A contiguous share ``[start, start + size)`` of one axis, owned by one part."""

    part: int
    start: int
    size: int

    @property
    def stop(self) -> int:
        return self.start + self.size


def tile_shape(dtype: Any, chip: str | Chip = "v5p") -> tuple[int, int]:
    """(sublanes, lanes) tile for ``dtype`` on ``chip``: rows scale up for packed dtypes."""
    c = get_chip(chip)
    check_array_dtype(dtype, c)
    return c.tile(itemsize(dtype))


def split_rows(
    n_rows: int,
    parts: int,
    *,
    dtype: Any = "float32",
    chip: str | Chip = "v5p",
    align: int | None = None,
    remainder: Remainder = "spread",
) -> tuple[Span, ...]:
    """Split ``n_rows`` over ``parts`` cores in whole tiles of ``align`` rows.

    ``align`` defaults to the dtype's sublane tile on ``chip``. With ``remainder="spread"`` the
    leftover tiles go one each to the first parts (shares differ by at most one tile); with
    ``"refuse"`` an uneven split raises. Parts may get zero rows when there are fewer tiles than
    parts; callers that cannot handle an empty share should ask for ``"refuse"``.
    """
    c = get_chip(chip)
    if parts < 1:
        raise LayoutError(
            f"cannot split over {parts} parts",
            rule="the number of cores to split over is at least 1",
            chip=c.name,
            fix="pass the core count of the mesh (e.g. mesh.num_cores)",
        )
    if n_rows < 0:
        raise LayoutError(f"cannot split {n_rows} rows", rule="row counts are >= 0", chip=c.name)
    unit = align if align is not None else tile_shape(dtype, c)[0]
    if unit < 1:
        raise LayoutError(f"alignment {unit} is not positive", rule="align >= 1", chip=c.name)
    if n_rows % unit:
        lo, hi = (n_rows // unit) * unit, math.ceil(n_rows / unit) * unit
        raise LayoutError(
            f"{n_rows} rows do not fill whole tiles of {unit} rows",
            rule=f"each core's rows must be a multiple of the {unit}-row tile "
            f"({itemsize(dtype) * 8}-bit {_name(dtype)})",
            chip=c.name,
            fix=f"pad the rows to {hi} (or trim to {lo}), or pass a smaller align if the kernel "
            "handles partial tiles itself",
        )
    tiles = n_rows // unit
    base, extra = divmod(tiles, parts)
    if extra and remainder == "refuse":
        raise LayoutError(
            f"{tiles} tiles of {unit} rows do not split evenly over {parts} cores",
            rule="remainder='refuse' asks for equal shares",
            chip=c.name,
            fix=f"use a row count that is a multiple of {unit * parts}, or remainder='spread'",
        )
    spans, start = [], 0
    for p in range(parts):
        size = (base + (1 if p < extra else 0)) * unit
        spans.append(Span(p, start, size))
        start += size
    return tuple(spans)


def core_share(n: int, parts: int, part: Any) -> tuple[Any, Any]:
    """``(start, size)`` of part ``part``'s contiguous share of ``n`` items over ``parts``.

    The traced twin of ``split_rows`` for kernel bodies: ``part`` may be a core or subcore index
    (``jax.lax.axis_index``). The first ``n % parts`` parts take one item more, so shares differ
    by at most one and cover ``0..n`` in order.
    """
    import jax.numpy as jnp

    base, extra = divmod(n, parts)
    p = jnp.asarray(part, jnp.int32)
    return p * base + jnp.minimum(p, extra), base + (p < extra).astype(jnp.int32)


def check_block_shape(
    block_shape: Sequence[int],
    array_shape: Sequence[int],
    dtype: Any,
    chip: str | Chip,
) -> None:
    """Refuse a block whose last two dims are neither tile multiples nor the full array dims.

    That is Mosaic's rule for TensorCore blocks; checking it here turns a compiler error (or a
    silently padded interpreter run) into a message that names the dims and the tile.
    """
    c = get_chip(chip)
    if len(block_shape) != len(array_shape):
        raise LayoutError(
            f"block {tuple(block_shape)} has rank {len(block_shape)} but the array "
            f"{tuple(array_shape)} has rank {len(array_shape)}",
            rule="a block spec gives one size per array dimension",
            chip=c.name,
            fix="give the block the array's rank (use 1 or None for squeezed dims)",
        )
    for b, a in zip(block_shape, array_shape, strict=True):
        if b <= 0 or b > a:
            raise LayoutError(
                f"block {tuple(block_shape)} does not fit array {tuple(array_shape)}",
                rule="each block dim is between 1 and the array dim",
                chip=c.name,
                fix="shrink the block or pad the array",
            )
    sub, lane = tile_shape(dtype, c)
    tiled = list(
        zip(block_shape[-2:], array_shape[-2:], (sub, lane)[-len(block_shape[-2:]) :], strict=True)
    )
    for b, a, t in tiled:
        if b % t and b != a:
            raise LayoutError(
                f"block {tuple(block_shape)} of {_name(dtype)} breaks the ({sub}, {lane}) tile: "
                f"{b} is not a multiple of {t}",
                rule=f"the last two block dims must be multiples of ({sub}, {lane}) or equal the "
                "array's dims",
                chip=c.name,
                fix=f"use a block dim of {_nearest_tiles(b, t)} instead of {b}",
            )
    for b, a in zip(block_shape, array_shape, strict=True):
        if a % b:
            raise LayoutError(
                f"block {tuple(block_shape)} does not divide array {tuple(array_shape)}",
                rule="every array dim must be a whole number of blocks",
                chip=c.name,
                fix="pad the array to a multiple of the block, or pick a block that divides it",
            )


def _nearest_tiles(b: int, t: int) -> str:
    up = math.ceil(b / t) * t
    return f"{up}" if b < t else f"{(b // t) * t} or {up}"


def _name(dtype: Any) -> str:
    from coremesh.core.dtypes import dtype_name

    return dtype_name(dtype)
