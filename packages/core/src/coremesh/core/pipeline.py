"""How a pipeline's work is split across the cores of a mesh (the backend emits the pipeline).

A pipeline walks a grid of blocks, moving each between HBM and VMEM while the previous one is
computed. Across cores the grid is split either by Mosaic (``Parallel``: one grid axis marked
PARALLEL is divided among the cores of ``core_axis``) or by the kernel itself (``Manual``: each
core offsets its index maps by its core index over a row span from ``split_rows``).
"""

from __future__ import annotations

import dataclasses


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
