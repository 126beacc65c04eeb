"""What an indexed DMA (``table.at[idx_ref]``, a SparseCore gather or scatter) can move.

Mosaic lowers one to the SparseCore's indirect stream and, in libtpu 0.0.52, takes only 32-bit
elements ("only 32-bit elements are supported") in rows that span whole 128-word tiles of the
table ("expected slice size (64) to be aligned with source (gather operand) tiling (128)"), on
v5p, v6e and TPU7x alike. A 1-D table has no rows: its indexed DMA gathers single 32-bit
elements, which compiles on v5p, v6e and TPU7x (``row_elems=None``). The ops choose their plan
by it, the simulator refuses what breaks it, and the compile diagnoses explain the compiler's
own refusal with the same words.

Those are the rules of the TensorCore tiling a SparseCore kernel gets by default
(``use_tc_tiling_on_sc`` None or True: Mosaic's COMPACT tiling). With the SparseCore's own tiling
(``pltpu.CompilerParams(use_tc_tiling_on_sc=False)``) libtpu 0.0.52 with jax 0.12.0.1 compiles
what they refuse: float32 rows of 1 to 136 elements, bfloat16, int8 and int32 rows of 32 and
128, on v5p and TPU7x alike (``sparse_core_tiling=True`` checks nothing).
"""

from __future__ import annotations

from typing import Any

from coremesh.core.chips import Chip
from coremesh.core.dtypes import dtype_name, itemsize
from coremesh.core.errors import LayoutError, UnsupportedOnChipError

#: An indexed DMA's rows are a multiple of this many 32-bit words.
INDEXED_ROW_WORDS = 128

DTYPE_RULE = "an indexed DMA (table.at[idx_ref]) moves 32-bit elements only"
ROW_RULE = (
    f"an indexed DMA's rows span whole {INDEXED_ROW_WORDS}-word tiles of the table: a multiple "
    f"of {INDEXED_ROW_WORDS} 32-bit elements ({INDEXED_ROW_WORDS * 4} bytes)"
)
FIX = (
    "view a 16-bit table as 32-bit words (pairs of elements) and pad rows to a multiple of "
    f"{INDEXED_ROW_WORDS} words, or copy row by row (table.at[pl.ds(idx_ref[i], 1)])"
)


def indexed_dma_fits(
    dtype: Any, row_elems: int | None, *, sparse_core_tiling: bool = False
) -> bool:
    """Whether rows of ``row_elems`` elements of ``dtype`` (None: elements of a 1-D table) can go
    by one indexed DMA of a kernel with the TensorCore tiling (or the SparseCore's own)."""
    if sparse_core_tiling:
        return True
    return itemsize(dtype) == 4 and (row_elems is None or row_elems % INDEXED_ROW_WORDS == 0)


def check_indexed_dma(
    what: str,
    dtype: Any,
    row_elems: int | None,
    chip: Chip | None,
    *,
    sparse_core_tiling: bool = False,
) -> None:
    """Raise the coremesh error for an indexed DMA Mosaic refuses, naming ``what`` it moves
    (``row_elems``: elements per row of the table, None for a 1-D table); a kernel with the
    SparseCore's own tiling has none of these limits."""
    if sparse_core_tiling:
        return
    name = chip.name if chip is not None else None
    if itemsize(dtype) != 4:
        raise UnsupportedOnChipError(
            f"{what} has {dtype_name(dtype)} elements", rule=DTYPE_RULE, chip=name, fix=FIX
        )
    if row_elems is not None and row_elems % INDEXED_ROW_WORDS:
        raise LayoutError(
            f"{what} has rows of {row_elems} elements", rule=ROW_RULE, chip=name, fix=FIX
        )
