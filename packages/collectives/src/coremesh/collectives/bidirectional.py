"""Routes: which part of each chunk travels around the ring in which direction.

A unidirectional ring sends whole chunks one way and leaves the links of the other direction
idle. The bidirectional ring cuts every chunk in two and sends one half each way, both rings in
flight together: every link direction carries ``(n - 1) / n`` of *half* the data, so the ring
finishes in about half the time for the same bytes. A route is ``(direction, part)``; the
gather and scatter engines below run one ring per route.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from coremesh.collectives import layout
from coremesh.collectives.axes import Axis
from coremesh.collectives.layout import Part
from coremesh.collectives.ring import AllGatherRing, ReduceScatterRing, drive
from coremesh.collectives.scratch import Scratch, ScratchSpec
from coremesh.collectives.sync import Sync
from coremesh.core import Chip, LayoutError

RingAlgorithm = Literal["ring", "bidirectional"]
Route = tuple[int, Part]


def routes(
    algorithm: RingAlgorithm,
    chunk: Sequence[int],
    dtype: Any,
    chip: Chip | None,
    *,
    within: Part | None = None,
    strict: bool = True,
) -> list[Route]:
    """Routes for ``algorithm`` over ``within`` (default: the whole chunk's first dim).

    A bidirectional ring needs the chunk (part) cut in two; when it cannot be (too few rows for
    the cut unit) ``strict`` raises and otherwise one direction carries it all.
    """
    whole = within if within is not None else Part(0, chunk[0] if chunk else 1)
    if algorithm == "ring":
        return [(1, whole)]
    shape = (whole.size, *chunk[1:])
    halves = layout.split(shape, 2, dtype, chip)
    if len(halves) < 2:
        if strict:
            unit = layout.cut_unit(chunk, dtype, chip)
            raise LayoutError(
                f"a chunk of shape {tuple(chunk)} cannot be cut in two for a bidirectional ring",
                rule=f"its first dim is cut in multiples of {unit} (the tile unit of a rank-"
                f"{len(chunk)} chunk of {layout_name(dtype)}), and it has fewer than {2 * unit}",
                chip=chip.name if chip else None,
                fix=f"use algorithm='ring', or give each chunk at least {2 * unit} rows "
                "(a rank-3 chunk can be cut anywhere)",
            )
        return [(1, whole)]
    return [(1, Part(whole.start + h.start, h.size)) for h in halves[:1]] + [
        (-1, Part(whole.start + h.start, h.size)) for h in halves[1:]
    ]


def layout_name(dtype: Any) -> str:
    from coremesh.core.dtypes import dtype_name

    return dtype_name(dtype)


def gather_scratch(n: int, route_list: Sequence[Route], sync: Sync) -> ScratchSpec:
    spec = ScratchSpec()
    for i, _ in enumerate(route_list):
        spec = spec + AllGatherRing.scratch_spec(n, sync).prefixed(f"r{i}.")
    return spec


def gather(
    axis: Axis,
    route_list: Sequence[Route],
    dst: Callable[[Any], Any],
    sync: Sync,
    scratch: Scratch,
) -> None:
    """All-gather in place: ``dst(k)`` is chunk ``k`` of the output, own chunk already there."""
    rings = [
        AllGatherRing(axis, d, sync, scratch.sub(f"r{i}."), dst=_part_view(dst, part))
        for i, (d, part) in enumerate(route_list)
    ]
    drive(rings, axis.size - 1)


def scatter_scratch(
    n: int,
    route_list: Sequence[Route],
    chunk: Sequence[int],
    dtype: Any,
    sync: Sync,
    *,
    src_in_vmem: bool,
) -> ScratchSpec:
    spec = ScratchSpec()
    for i, (_, part) in enumerate(route_list):
        spec = spec + ReduceScatterRing.scratch_spec(
            n, part.shape(chunk), dtype, sync, src_in_vmem=src_in_vmem
        ).prefixed(f"r{i}.")
    return spec


def scatter(
    axis: Axis,
    route_list: Sequence[Route],
    src: Callable[[Any], Any],
    out: Any,
    op: str,
    sync: Sync,
    scratch: Scratch,
) -> None:
    """Reduce-scatter: ``out`` gets the ``op``-reduction over participants of chunk ``rank``."""
    rings = [
        ReduceScatterRing(
            axis,
            d,
            sync,
            scratch.sub(f"r{i}."),
            src=_part_view(src, part),
            out=part.of(out),
            op=op,
        )
        for i, (d, part) in enumerate(route_list)
    ]
    drive(rings, axis.size - 1)


def _part_view(view: Callable[[Any], Any], part: Part) -> Callable[[Any], Any]:
    return lambda k: part.of(view(k))
