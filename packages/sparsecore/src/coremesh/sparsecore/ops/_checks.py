"""Input checks shared by the SparseCore ops: shapes, dtypes, index ranges, modes."""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.core import Chip, LayoutError
from coremesh.core.indices import check_in_range, check_index_vector, is_traced
from coremesh.sparsecore.registers import register_width

GATHER_MODES = ("check", "clip", "fill")
SCATTER_MODES = ("check", "clip", "drop")


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
    n = check_index_vector(what, idx, chip, rule="one row index per entry")
    dtype = idx.dtype
    if np.dtype(dtype).itemsize > 4:
        raise LayoutError(
            f"{what} has dtype {dtype}",
            rule="SparseCore index vectors are 32-bit",
            chip=chip.name,
            fix=f"pass {what} as int32",
        )
    return n


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
    check_in_range(
        what,
        idx,
        size,
        chip,
        rule=f"the table has {size} rows",
        fix=f"fix the {what}, or pass mode={modes} to say what an out-of-range index means",
    )
