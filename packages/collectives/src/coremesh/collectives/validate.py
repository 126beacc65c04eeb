"""Checks on array-function inputs, raised before anything is traced.

Every error says what was wrong, the rule, the chip and the fix: an axis the mesh lacks, a
permutation that is not one, a shape that does not split over the participants, a dtype the
chip lacks, a collective id already taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coremesh.collectives.axes import Axis
from coremesh.core import (
    LayoutError,
    UnsupportedOnChipError,
    check_operand_dtype,
    default_allocator,
)

#: Data a Pallas TPU kernel takes as an operand and its DMA engines move
#: (``check_operand_dtype`` has already refused float16 and bool).
_MOVABLE = frozenset({"float32", "bfloat16", "int32", "uint32", "int16", "uint16", "int8", "uint8"})
#: 8-bit floats: held by v5e and later (jax's MXU table), not by v4.
_FLOAT8 = frozenset({"float8_e5m2", "float8_e4m3fn", "float8_e4m3b11fnuz"})
#: What the vector units add, compare and convert (reductions compute in 32 bits).
_REDUCIBLE = frozenset(
    {"float32", "bfloat16", "int32", "uint32", "int16", "uint16", "int8", "uint8"}
)


def check_dtype(dtype: Any, axis: Axis, *, reduces: bool) -> str:
    """The dtype's name, or the error for a dtype the chip cannot hold or reduce."""
    chip = axis.chip
    assert chip is not None
    name = check_operand_dtype(dtype, chip)  # no 64-bit, float16 or bool operands
    allowed = _REDUCIBLE if reduces else _MOVABLE | (_FLOAT8 if chip.generation >= 5 else set())
    if name not in allowed:
        what = "reduce" if reduces else "move"
        raise UnsupportedOnChipError(
            f"collectives on {chip.name} cannot {what} {name} data",
            rule=f"{chip.name} {'reductions' if reduces else 'collectives'} take "
            f"{', '.join(sorted(allowed))}",
            chip=chip.name,
            fix="cast to bfloat16 or float32 (int32 for integers) before the collective, and back "
            "after it",
        )
    return name


def check_divisible(what: str, size: int, by: int, axis: Axis, *, fix: str) -> None:
    if by < 1 or size % by:
        raise LayoutError(
            f"{what} is {size}, which does not split over the {by} participants of the "
            f"{axis.describe()}",
            rule=f"{what} must be a multiple of {by}",
            chip=axis.chip.name if axis.chip else None,
            fix=fix,
        )


def check_axis_index(name: str, value: int, ndim: int, axis: Axis) -> int:
    """A dimension index of an operand of rank ``ndim`` (negative counts from the end)."""
    if not -ndim <= value < ndim:
        raise LayoutError(
            f"{name}={value} for an operand of rank {ndim}",
            rule=f"{name} names a dimension in -{ndim}..{ndim - 1}",
            chip=axis.chip.name if axis.chip else None,
            fix=f"pass {name} between 0 and {ndim - 1}",
        )
    return value % ndim


def collective_id(owner: str, requested: int | None) -> int:
    """The id for kernel ``owner``: the allocator's (stable across retraces), or ``requested``.

    A requested id is claimed for ``owner`` (a retrace asking again gets it back); an id owned
    by anything else is refused.
    """
    alloc = default_allocator()
    if requested is None:
        return alloc.id_for(owner)
    claimant = f"{owner} (collective_id={requested})"
    if alloc.owner(requested) == claimant:
        return requested
    return alloc.claim(requested, claimant)


def check_shape(x: Any, axis: Axis) -> tuple[int, ...]:
    shape = tuple(int(d) for d in getattr(x, "shape", ()))
    if any(d == 0 for d in shape):
        raise LayoutError(
            f"operand of shape {shape} is empty",
            rule="collectives move at least one element per participant",
            chip=axis.chip.name if axis.chip else None,
            fix="skip the collective for empty arrays",
        )
    return shape


def cores_split(shape: Sequence[int], axis: Axis, op: str) -> None:
    """Over cores each core's operand is its share of the device's leading dim."""
    if axis.spans_cores and axis.cores > 1:
        lead = shape[0] if shape else 1
        if not shape or lead % axis.cores:
            raise LayoutError(
                f"{op} over the {axis.describe()}: the per-device operand has shape {tuple(shape)}",
                rule=f"over cores, core c's operand is slice c of {axis.cores} equal slices of "
                "the per-device operand's first dim",
                chip=axis.chip.name if axis.chip else None,
                fix=f"give the per-device operand a first dim divisible by {axis.cores}",
            )
