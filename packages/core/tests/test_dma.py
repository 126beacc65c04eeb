"""The indexed-DMA rule every layer shares: 32-bit elements in rows of whole 128-word tiles,
under the TensorCore tiling only (the SparseCore's own tiling compiles the rest)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest

import coremesh.core as cc
from coremesh.core.dma import check_indexed_dma, indexed_dma_fits


@pytest.mark.parametrize(
    ("dtype", "row", "fits"),
    [
        (jnp.float32, 128, True),
        (jnp.int32, 1024, True),
        (jnp.float32, 64, False),
        (jnp.float32, 192, False),
        (jnp.bfloat16, 256, False),
        (jnp.int8, 512, False),
        (jnp.int32, None, True),  # a 1-D table: element gathers compile (v5p, v6e, TPU7x)
        (jnp.bfloat16, None, False),
    ],
)
def test_indexed_dma_fits(dtype: Any, row: int | None, fits: bool) -> None:
    assert indexed_dma_fits(dtype, row) is fits


def test_check_names_what_the_rule_and_the_chip() -> None:
    v6e = cc.get_chip("v6e")
    check_indexed_dma("the table", jnp.float32, 256, v6e)  # fits: no error
    with pytest.raises(cc.UnsupportedOnChipError, match="the table has bfloat16 elements") as e:
        check_indexed_dma("the table", jnp.bfloat16, 256, v6e)
    assert e.value.chip == "v6e" and "32-bit words" in str(e.value.fix)
    with pytest.raises(cc.LayoutError, match="rows of 96 elements") as e2:
        check_indexed_dma("the table", jnp.int32, 96, v6e)
    assert "multiple of 128" in str(e2.value.rule)


@pytest.mark.parametrize(
    ("dtype", "row"), [(jnp.float32, 32), (jnp.float32, 1), (jnp.bfloat16, 128), (jnp.int8, 32)]
)
def test_the_sparsecore_tiling_takes_what_the_tensorcore_tiling_refuses(
    dtype: Any, row: int
) -> None:
    """libtpu 0.0.52 compiled each of these for v5p and TPU7x with use_tc_tiling_on_sc=False and
    refused the 32-element float32 rows with the default tiling."""
    v5p = cc.get_chip("v5p")
    assert indexed_dma_fits(dtype, row, sparse_core_tiling=True)
    check_indexed_dma("the table", dtype, row, v5p, sparse_core_tiling=True)
    assert not indexed_dma_fits(dtype, row)
    with pytest.raises((cc.LayoutError, cc.UnsupportedOnChipError)):
        check_indexed_dma("the table", dtype, row, v5p)
