"""Pipelines and how their work is split across the cores of a mesh.

A pipeline walks a grid of blocks, moving each between HBM and VMEM while the previous one is
computed. Across cores the grid is split either by Mosaic (``Parallel``: one grid axis marked
PARALLEL is divided among the cores of ``core_axis``) or by the kernel itself (``Manual``: each
core offsets its index maps by its core index over a row span from ``split_rows``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from coremesh.core.errors import LayoutError


class Semantics(enum.Enum):
    PARALLEL = "parallel"
    ARBITRARY = "arbitrary"


@dataclasses.dataclass(frozen=True)
class Parallel:
    """Let the pipeline split grid axis ``grid_axis`` over the cores of ``core_axis``."""

    core_axis: str = "core"
    grid_axis: int = 0


@dataclasses.dataclass(frozen=True)
class Manual:
    """Each core takes its own share of ``grid_axis``, offsetting index maps by core index."""

    core_axis: str = "core"
    grid_axis: int = 0


Split = Parallel | Manual | None


@dataclasses.dataclass(frozen=True)
class Block:
    """A block of an operand: shape and the map from grid indices to block indices."""

    shape: tuple[int, ...]
    index_map: Callable[..., tuple[Any, ...]]


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """Grid, blocks and split of a pipeline, independent of the backend that emits it."""

    body: Callable[..., None]
    grid: tuple[int, ...]
    in_blocks: Sequence[Block]
    out_blocks: Sequence[Block]
    split: Split = None

    def __post_init__(self) -> None:
        if not self.grid or any(g < 1 for g in self.grid):
            raise LayoutError(
                f"pipeline grid {self.grid} is empty",
                rule="every grid dim is at least 1",
                fix="derive the grid from array shape // block shape and check the array is "
                "at least one block",
            )
        if self.split is not None and not 0 <= self.split.grid_axis < len(self.grid):
            raise LayoutError(
                f"split along grid axis {self.split.grid_axis} of a {len(self.grid)}-d grid",
                rule="the split axis is one of the grid's axes",
                fix=f"use a grid_axis in 0..{len(self.grid) - 1}",
            )

    @property
    def semantics(self) -> tuple[Semantics, ...]:
        axis = self.split.grid_axis if isinstance(self.split, Parallel) else -1
        return tuple(
            Semantics.PARALLEL if i == axis else Semantics.ARBITRARY for i in range(len(self.grid))
        )


@runtime_checkable
class Pipeline(Protocol):
    """A pipeline a backend emitted from a spec; call it on HBM refs inside a kernel body."""

    @property
    def spec(self) -> PipelineSpec: ...

    def __call__(self, *refs: Any) -> None: ...
