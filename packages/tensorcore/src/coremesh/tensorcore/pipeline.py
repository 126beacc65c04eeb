"""Pipelines over HBM refs inside a TensorCore kernel, with the work split across cores.

``Parallel`` marks one grid axis PARALLEL and lets ``emit_pipeline`` divide it among the cores of
the core axis. ``Manual`` gives each core a contiguous share of that axis itself: shares differ
by at most one step when the axis does not divide evenly (the grid is then dynamic per core), and
the user's index maps see global indices either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import LayoutError, Manual, Parallel
from coremesh.core.partition import core_share
from coremesh.core.pipeline import Split


def sub_blocks(spec: pl.BlockSpec, streams: int) -> list[pl.BlockSpec]:
    """``spec`` cut along its first dim into ``streams`` specs, one per sub-block.

    Passed as ``streams`` operands (the same HBM ref each time), a block arrives as ``streams``
    DMAs in flight at once instead of one; the body gets the sub-blocks' refs in order.
    """
    rows, *rest = spec.block_shape
    index_map = spec.index_map
    assert index_map is not None and rows is not None and rows % streams == 0

    def part(s: int) -> Callable[..., Any]:
        def shifted(*idx: Any) -> Any:
            first, *others = index_map(*idx)
            return (streams * first + s, *others)

        return shifted

    return [pl.BlockSpec((rows // streams, *rest), part(s)) for s in range(streams)]


def pipeline(
    body: Callable[..., None],
    *,
    grid: Sequence[int],
    in_specs: Sequence[pl.BlockSpec],
    out_specs: Sequence[pl.BlockSpec],
    split: Split = Parallel(),
) -> Callable[..., None]:
    """An ``emit_pipeline`` over ``grid`` whose work is split across cores as ``split`` says.

    Call the result on HBM refs inside a kernel body. Index maps see global grid indices in every
    split mode; ``pl.program_id`` inside ``body`` counts this core's own steps under ``Manual``.
    """
    grid = tuple(int(g) for g in grid)
    if not grid or min(grid) < 1:
        raise LayoutError(
            f"pipeline grid {grid} is empty",
            rule="every grid dim is at least 1",
            fix="derive the grid from array shape // block shape",
        )
    if split is not None and not 0 <= split.grid_axis < len(grid):
        raise LayoutError(
            f"split along grid axis {split.grid_axis} of a {len(grid)}-d grid",
            rule="the split axis is one of the grid's axes",
            fix=f"use grid_axis in 0..{len(grid) - 1}",
        )
    emitted: Callable[..., None]
    if split is None:
        emitted = pltpu.emit_pipeline(body, grid=grid, in_specs=in_specs, out_specs=out_specs)
        return emitted
    if isinstance(split, Parallel):
        sem = tuple(
            pltpu.PARALLEL if i == split.grid_axis else pltpu.ARBITRARY for i in range(len(grid))
        )
        emitted = pltpu.emit_pipeline(
            body,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            core_axis_name=split.core_axis,
            dimension_semantics=sem,
        )
        return emitted
    return _manual(body, grid, in_specs, out_specs, split)


def _manual(
    body: Callable[..., None],
    grid: tuple[int, ...],
    in_specs: Sequence[pl.BlockSpec],
    out_specs: Sequence[pl.BlockSpec],
    split: Manual,
) -> Callable[..., None]:
    axis = split.grid_axis

    def run(*refs: Any) -> None:
        core = jax.lax.axis_index(split.core_axis)
        cores = jax.lax.axis_size(split.core_axis)
        start, size = core_share(grid[axis], cores, core)

        def shift(spec: pl.BlockSpec) -> pl.BlockSpec:
            index_map = spec.index_map
            assert index_map is not None

            def shifted(*idx: Any) -> Any:
                idx = tuple(i + start if d == axis else i for d, i in enumerate(idx))
                return index_map(*idx)

            return pl.BlockSpec(spec.block_shape, shifted)

        local_grid = tuple(size if d == axis else g for d, g in enumerate(grid))
        pltpu.emit_pipeline(
            body,
            grid=local_grid,
            in_specs=[shift(s) for s in in_specs],
            out_specs=[shift(s) for s in out_specs],
        )(*refs)

    return run
