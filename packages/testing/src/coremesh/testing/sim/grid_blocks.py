"""Which blocks of a grid kernel the compiled paths (:mod:`.fast_path`, :mod:`.compiled_grid_dma`)
can run, and why not where they cannot: both ask the same questions of the same blocks."""

from __future__ import annotations

from typing import Any

import numpy as np

from coremesh.testing.sim import shadow
from coremesh.testing.sim.jaxprs import memory_space

#: Memory spaces a compiled block may live in: the core's own (VMEM, SMEM, or left default).
MEMORY_SPACES = ("none", "default", "vmem", "smem")


def carries_taint(dtype: Any) -> bool:
    """Can an element of ``dtype`` carry the uninitialized-read taint in a compiled program
    (:func:`.shadow.taint_layout`)?"""
    try:
        return shadow.taint_layout(np.dtype(dtype)) is not None
    except TypeError:
        return False


def blocks_refusal(gm: Any, checked: bool, *, hbm: bool = False) -> str | None:
    """Why the kernel's blocks need the interpreter (None: they do not); ``checked``: the
    uninitialized-read check is on; ``hbm``: operands in HBM are whole refs the kernel reaches
    by DMA (:mod:`.compiled_grid_dma`)."""
    from jax._src.pallas import core as pallas_core

    n_in = len(gm.block_mappings) - gm.num_outputs
    for k, bm in enumerate(gm.block_mappings):
        what = f"operand {k}" if k < n_in else f"output {k - n_in}"
        space = memory_space(bm.block_aval)
        if hbm and space in ("any", "hbm"):
            continue
        if space not in MEMORY_SPACES:
            return f"{what} in {space} memory (reached by DMA)"
        for bd in bm.block_shape:
            if bd is not None and type(bd).__name__ not in ("Blocked", "Squeezed"):
                return f"{what}'s block dimension {type(bd).__name__} (only blocked and squeezed)"
        if checked and k < n_in and not carries_taint(bm.array_aval.dtype):
            shape = pallas_core._get_block_shape(bm.block_shape)
            if any(d % b for d, b in zip(bm.array_aval.shape, shape, strict=True)):
                return (
                    f"{what}: a partial {bm.array_aval.dtype} block with the uninitialized-read "
                    "check on (its padding carries no taint)"
                )
    return None
