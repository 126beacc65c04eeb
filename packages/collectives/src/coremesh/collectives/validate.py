"""Every check collectives make, raised before anything is traced or moved.

Every error says what was wrong, the rule, the chip and the fix: an axis the mesh lacks, a
permutation that is not one, a shape that does not split over the participants, refs that are
not a collective's layout, a receiver other cores cannot reach, a dtype the chip lacks, an
unknown algorithm, sync mode or reduction, a collective id already taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from coremesh.collectives import sync
from coremesh.collectives.axes import Axis
from coremesh.collectives.layout import in_vmem, memory_space, split
from coremesh.core import (
    CoremeshError,
    LayoutError,
    MeshError,
    UnsupportedOnChipError,
    check_operand_dtype,
    default_allocator,
)

Algorithm = Literal["auto", "ring", "bidirectional", "hierarchical", "direct"]
Op = Literal["sum", "max", "min"]
Collective = Literal[
    "barrier", "ppermute", "all_gather", "reduce_scatter", "all_reduce", "all_to_all"
]
RING_OPS: frozenset[str] = frozenset({"all_gather", "reduce_scatter", "all_reduce"})
OPS: tuple[Op, ...] = ("sum", "max", "min")


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
            chip=chip_name(axis),
            fix=fix,
        )


def check_axis_index(name: str, value: int, ndim: int, axis: Axis) -> int:
    """A dimension index of an operand of rank ``ndim`` (negative counts from the end)."""
    if not -ndim <= value < ndim:
        raise LayoutError(
            f"{name}={value} for an operand of rank {ndim}",
            rule=f"{name} names a dimension in -{ndim}..{ndim - 1}",
            chip=chip_name(axis),
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
            chip=chip_name(axis),
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
                chip=chip_name(axis),
                fix=f"give the per-device operand a first dim divisible by {axis.cores}",
            )


def chip_name(axis: Axis) -> str | None:
    """The name of the chip the axis is on, for an error (None if the axis knows none)."""
    return axis.chip.name if axis.chip else None


def resolve_algorithm(
    collective: str, axis: Axis, algorithm: str, chunk: Sequence[int], dtype: Any
) -> str:
    """The algorithm a collective runs: ``algorithm`` checked, or the best one for ``"auto"``."""
    if collective not in RING_OPS:
        if algorithm in ("auto", "direct"):
            return "direct"
        raise CoremeshError(
            f"{collective} has no {algorithm!r} algorithm",
            rule=f"{collective} sends straight to its peers (algorithm='direct')",
            chip=chip_name(axis),
            fix="pass algorithm='direct' or 'auto'",
        )
    if algorithm not in ("auto", "ring", "bidirectional", "hierarchical"):
        raise CoremeshError(
            f"unknown algorithm {algorithm!r} for {collective}",
            rule="ring collectives run 'ring', 'bidirectional' or, over (device, core), "
            "'hierarchical'",
            chip=chip_name(axis),
            fix="pass one of those, or 'auto'",
        )
    if algorithm == "hierarchical" and axis.kind != "hierarchical":
        raise MeshError(
            f"algorithm 'hierarchical' over the {axis.describe()}",
            rule="the two-stage schedule runs over the (device axis, core axis) tuple",
            chip=chip_name(axis),
            fix="collect over (device, core), or use 'ring' / 'bidirectional'",
        )
    if algorithm != "auto":
        return algorithm
    if axis.kind == "hierarchical" and axis.cores > 1 and axis.num_devices > 1:
        return "hierarchical"
    if axis.size > 2 and len(split(chunk, 2, dtype, axis.chip)) == 2:
        return "bidirectional"
    return "ring"


def check_sync(mode: str, axis: Axis) -> sync.Sync:
    """``mode`` if it is a sync mode rings know."""
    if mode not in sync.SYNC_MODES:
        raise CoremeshError(
            f"unknown sync mode {mode!r}",
            rule="rings use a semaphore per step ('per_step') or two reused with a credit "
            "handshake ('credit')",
            chip=chip_name(axis),
            fix="pass sync='per_step' or sync='credit'",
        )
    return mode


def check_permutation(perm: Sequence[tuple[int, int]], axis: Axis) -> list[tuple[int, int]]:
    """``perm`` as a list of (source, destination) pairs of a (partial) permutation."""
    chip = chip_name(axis)
    try:
        pairs = [(int(s), int(d)) for s, d in perm]
    except (TypeError, ValueError) as e:
        raise LayoutError(
            f"perm {perm!r} is not a list of (source, destination) pairs",
            rule="ppermute takes pairs of participant indices, as jax.lax.ppermute",
            chip=chip,
            fix="pass e.g. perm=[(0, 1), (1, 0)]",
        ) from e
    srcs, dsts = [s for s, _ in pairs], [d for _, d in pairs]
    bad = sorted({i for i in srcs + dsts if not 0 <= i < axis.size})
    if bad:
        raise LayoutError(
            f"perm names participant(s) {bad} on the {axis.describe()}",
            rule=f"participants are numbered 0..{axis.size - 1}",
            chip=chip,
            fix="index participants within the axis size",
        )
    for name, seq in (("source", srcs), ("destination", dsts)):
        dup = sorted({i for i in seq if seq.count(i) > 1})
        if dup:
            raise LayoutError(
                f"perm {pairs} is not a permutation: {name}(s) {dup} appear more than once",
                rule="each participant sends at most once and receives at most once",
                chip=chip,
                fix="give every participant at most one destination and one source",
            )
    return pairs


def check_op(op: str, axis: Axis) -> None:
    """Refuse a reduction collectives do not have."""
    if op not in OPS:
        raise CoremeshError(
            f"unknown reduction {op!r}",
            rule="collectives reduce with 'sum', 'max' or 'min'",
            chip=chip_name(axis),
            fix="pass op='sum', 'max' or 'min'",
        )


def check_layout(
    collective: str,
    ax: Axis,
    src: Any,
    dst: Any,
    want_src: tuple[int, ...],
    want_dst: tuple[int, ...],
) -> None:
    """Refuse refs whose shapes or dtypes are not the collective's layout (``_LAYOUT_RULES``)."""
    if tuple(src.shape) != want_src or tuple(dst.shape) != want_dst or src.dtype != dst.dtype:
        raise LayoutError(
            f"{collective} over the {ax.describe()}: src is {src.dtype}{list(src.shape)}, dst "
            f"is {dst.dtype}{list(dst.shape)}",
            rule=_LAYOUT_RULES[collective].format(n=ax.size),
            chip=chip_name(ax),
            fix=f"make src {src.dtype}{list(want_src)} and dst {src.dtype}{list(want_dst)}",
        )


def check_receiver(collective: str, ax: Axis, ref: Any) -> None:
    """Over the core axes a ref other cores write into must be VMEM (they share HBM)."""
    if ax.spans_cores and ax.size > 1 and not in_vmem(ref):
        raise LayoutError(
            f"{collective} over the {ax.describe()} writes into a ref in "
            f"{memory_space(ref) or 'HBM'}",
            rule="the cores of a device share HBM, so a ref written by other cores' DMAs must "
            "be per-core memory (VMEM) to be the same buffer on every participant",
            chip=chip_name(ax),
            fix="stage the data in a VMEM scratch ref and copy it to HBM after the collective",
        )


_LAYOUT_RULES = {
    "all_gather": "all_gather takes src (*c) and dst (n, *c) with n = {n} participants",
    "reduce_scatter": "reduce_scatter takes src (n, *c) and dst (*c) with n = {n}",
    "all_reduce": "all_reduce takes src and dst of the same shape (n, *c) with n = {n}",
    "all_to_all": "all_to_all takes src and dst of the same shape (n, *c) with n = {n}",
    "ppermute": "ppermute takes src and dst of one shape and dtype",
}
