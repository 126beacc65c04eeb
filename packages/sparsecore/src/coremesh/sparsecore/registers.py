"""Register shapes and work splits for SparseCore vector subcores, sized from the chip.

A vector subcore operates on registers of ``lanes`` 32-bit words (8 on v5p/v6e, 16 on TPU7x);
packed dtypes hold more elements per register. The compiler does NOT reject a register op of the
wrong shape, so kernels take their shapes from here and :func:`check_register_shape` refuses a
shape that does not match the chip.
"""

from __future__ import annotations

from typing import Any

from coremesh.core import Chip, LayoutError, UnsupportedOnChipError, get_chip
from coremesh.core.dtypes import dtype_name, itemsize
from coremesh.sparsecore.mesh import sparsecore_of

#: dtypes a SparseCore vector subcore loads, stores and moves, per kernel kind.
MOVE_DTYPES = ("int32", "float32", "bfloat16")
ACCUMULATE_DTYPES = ("int32", "float32")


def register_shape(dtype: Any, chip: str | Chip) -> tuple[int, int]:
    """``(rows, elements per row)`` of one vector register for ``dtype`` on ``chip``."""
    c = get_chip(chip)
    return sparsecore_of(c).register_shape(itemsize(dtype))


def register_width(dtype: Any, chip: str | Chip) -> int:
    """Elements of ``dtype`` in one register row: the unit of every vector load and store."""
    return register_shape(dtype, chip)[1]


def check_dtype(what: str, dtype: Any, chip: str | Chip, allowed: tuple[str, ...]) -> str:
    """Refuse a dtype the SparseCore kernel cannot hold (64-bit, complex, ...) before tracing."""
    c = get_chip(chip)
    name = dtype_name(dtype)
    if name not in allowed:
        raise UnsupportedOnChipError(
            f"{what} has dtype {name}",
            rule=f"this SparseCore kernel handles {', '.join(allowed)}",
            chip=c.name,
            fix=f"cast {what} to one of {', '.join(allowed)}",
        )
    return name


def check_register_shape(shape: tuple[int, ...], dtype: Any, chip: str | Chip) -> None:
    """Refuse a register-loop shape whose rows do not match the chip's lane count.

    ``shape[-1]`` must be the register width for ``dtype`` (lanes x 32 bits), and the leading
    dimension at most the register's rows.
    """
    c = get_chip(chip)
    rows, width = register_shape(dtype, c)
    if len(shape) not in (1, 2) or shape[-1] != width or (len(shape) == 2 and shape[0] > rows):
        lanes = sparsecore_of(c).lanes
        raise LayoutError(
            f"register shape {tuple(shape)} for {dtype_name(dtype)} does not match {c.name}",
            rule=f"{c.name} SparseCore registers have {lanes} lanes of 32 bits: "
            f"({rows}, {width}) {dtype_name(dtype)} (the compiler does not reject a wrong shape)",
            chip=c.name,
            fix=f"use coremesh.sparsecore.register_shape({dtype_name(dtype)!s}, chip) = "
            f"({rows}, {width}) instead of hard-coding it",
        )
