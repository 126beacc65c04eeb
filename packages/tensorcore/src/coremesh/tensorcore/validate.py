"""Checks every TensorCore op runs on its operands before anything is traced."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from coremesh.core import Chip, LayoutError, MeshError, check_operand_dtype, tile_shape


def check_2d(name: str, x: Any, chip: Chip) -> tuple[int, int]:
    """``x`` is a 2-D array of a dtype the chip holds."""
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 2:
        raise LayoutError(
            f"{name} has shape {shape}; this op takes 2-D arrays",
            rule="TensorCore ops tile the last two dims as (sublanes, lanes)",
            chip=chip.name,
            fix=f"reshape {name} to 2-D first, e.g. x.reshape(-1, x.shape[-1])",
        )
    if 0 in shape:
        raise LayoutError(
            f"{name} is empty: shape {shape}",
            rule="a TensorCore op streams its operands in (sublanes, lanes) tiles, at least one",
            chip=chip.name,
            fix=f"skip the call when {name}.size == 0 (shapes are static, so a Python `if` "
            "does it) and build the empty result directly",
        )
    check_operand_dtype(x.dtype, chip)
    return shape[0], shape[1]


def check_tiled(
    name: str, shape: Sequence[int], dtype: Any, chip: Chip, *, rows_over: int = 1
) -> None:
    """Rows fill whole sublane tiles on each of ``rows_over`` shards; columns whole lanes."""
    sub, lane = tile_shape(dtype, chip)
    rows, cols = shape[-2], shape[-1]
    unit = sub * rows_over
    if rows % unit or cols % lane:
        pad_r, pad_c = math.ceil(rows / unit) * unit, math.ceil(cols / lane) * lane
        where = f" over {rows_over} devices" if rows_over > 1 else ""
        raise LayoutError(
            f"{name} of shape {tuple(shape)} does not tile into ({sub}, {lane}) blocks{where}",
            rule=f"rows must be a multiple of {unit} and columns of {lane} for {dtype}",
            chip=chip.name,
            fix=f"pad {name} to ({pad_r}, {pad_c}) and slice the result",
        )


def check_same(names: Sequence[str], arrays: Sequence[Any], chip: Chip) -> None:
    """All operands share shape and dtype."""
    first = arrays[0]
    for n, a in zip(names[1:], arrays[1:], strict=True):
        if tuple(a.shape) != tuple(first.shape) or a.dtype != first.dtype:
            raise LayoutError(
                f"{n} is {a.dtype}{list(a.shape)} but {names[0]} is "
                f"{first.dtype}{list(first.shape)}",
                rule="operands of a blockwise map share shape and dtype",
                chip=chip.name,
                fix="broadcast / cast the operands to one shape and dtype first",
            )


def check_core_axis(axis_name: str, mesh_axes: Sequence[str], chip: Chip) -> None:
    if axis_name not in mesh_axes:
        have = ", ".join(repr(a) for a in mesh_axes)
        raise MeshError(
            f"core axis {axis_name!r} is not an axis of the TensorCore mesh",
            rule=f"the mesh's axes are {have}",
            chip=chip.name,
            fix=f"use {have}",
        )
