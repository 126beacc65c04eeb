"""Input checks shared by the SparseCore ops: shapes, dtypes, index ranges, modes."""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.core import Chip, LayoutError
from coremesh.sparsecore.registers import register_width

GATHER_MODES = ("check", "clip", "fill")
SCATTER_MODES = ("check", "clip", "drop")


def is_traced(x: Any) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


def check_mode(mode: str, allowed: tuple[str, ...], chip: Chip) -> None:
    if mode not in allowed:
        raise LayoutError(
            f"mode={mode!r}",
            rule=f"out-of-range indices are handled by one of {', '.join(map(repr, allowed))}",
            chip=chip.name,
            fix=f"pass mode={allowed[0]!r} (raise on a bad index) or one of the others",
        )


def check_table(what: str, x: Any, chip: Chip, *, empty_rows: bool = False) -> tuple[int, int]:
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 2 or shape[1] == 0 or (shape[0] == 0 and not empty_rows):
        raise LayoutError(
            f"{what} has shape {list(shape)}",
            rule=f"{what} is a 2-D array (rows, features) with "
            + ("features" if empty_rows else "rows and features"),
            chip=chip.name,
            fix=f"reshape {what} to (rows, features)",
        )
    width = register_width(x.dtype, chip)
    if shape[1] % width:
        raise LayoutError(
            f"{what} has {shape[1]} features per row",
            rule=f"a row is loaded, added and stored in {chip.name} SparseCore registers of "
            f"{width} {x.dtype} elements",
            chip=chip.name,
            fix=f"pad the feature dimension to a multiple of {width}",
        )
    return int(shape[0]), int(shape[1])


def check_indices(what: str, idx: Any, chip: Chip) -> int:
    import jax.numpy as jnp

    shape = tuple(getattr(idx, "shape", ()))
    dtype = getattr(idx, "dtype", None)
    if len(shape) != 1 or dtype is None or not jnp.issubdtype(dtype, jnp.integer):
        raise LayoutError(
            f"{what} must be a 1-D integer vector, got {dtype}{list(shape)}",
            rule="one row index per entry",
            chip=chip.name,
            fix=f"pass {what} as a 1-D int32 array",
        )
    if np.dtype(dtype).itemsize > 4:
        raise LayoutError(
            f"{what} has dtype {dtype}",
            rule="SparseCore index vectors are 32-bit",
            chip=chip.name,
            fix=f"pass {what} as int32",
        )
    return int(shape[0])


def check_range(what: str, idx: Any, size: int, mode: str, chip: Chip, modes: str) -> None:
    """``mode='check'``: concrete indices must lie in ``[0, size)``; traced ones cannot be
    checked, so the caller must say what an out-of-range index means."""
    if mode != "check":
        return
    if is_traced(idx):
        raise LayoutError(
            f"{what} are traced, so mode='check' cannot check them",
            rule="an out-of-range index never silently reads or writes another row: with traced "
            f"indices the caller chooses what it means ({modes})",
            chip=chip.name,
            fix=f"pass concrete {what}, or mode={modes}",
        )
    host = np.asarray(idx)
    bad = np.flatnonzero((host < 0) | (host >= size))
    if bad.size:
        raise LayoutError(
            f"{what}[{bad[0]}] = {host[bad[0]]} is outside 0..{size - 1}",
            rule=f"the table has {size} rows",
            chip=chip.name,
            fix=f"fix the {what}, or pass mode={modes} to say what an out-of-range index means",
        )
