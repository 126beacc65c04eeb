"""reduce's enlarged blocks: what they grow to per chip, and results with them on the simulator."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.tensorcore.block_sizes import choose_block
from coremesh.tensorcore.ops.reduce import _grow_rows
from coremesh.testing.plugin import SliceFactory


@pytest.mark.parametrize(
    ("chip", "axis", "rows"),
    [
        ("v5e", 0, 1024),
        ("v5e", 1, 1024),
        ("v5p", 0, 1024),  # 2 cores: two 4 MiB blocks each
        ("v5p", 1, 1024),
        ("v6e", 0, 2048),
        ("TPU7x", 0, 2048),  # 8 MiB, a quarter of its 32 MiB scoped VMEM
        ("TPU7x", 1, 2048),
    ],
)
def test_blocks_grow_to_a_share_of_scoped_vmem(chip: str, axis: int, rows: int) -> None:
    c = cc.get_chip(chip)
    cores = c.default_cores_per_device
    br, bc = choose_block(
        4096, 1024, jnp.float32, chip=c, operands=2, cores=cores, row_align=128 if axis else 1
    )
    grown = _grow_rows(br, bc, 4096, 4, cores, c)
    assert grown == rows
    assert (4096 // cores) % grown == 0 and grown % br == 0
    assert grown * bc * 4 <= c.scoped_vmem_default_bytes // 4 < 2 * grown * bc * 4


def test_blocks_keep_rows_that_do_not_split() -> None:
    assert _grow_rows(96, 640, 96, 4, 2, cc.get_chip("v5p")) == 96


@pytest.mark.parametrize(("op", "axis"), [("sum", 0), ("max", 1), ("min", 0)])
def test_reduce_with_grown_blocks_and_the_core_exchange(
    op: str, axis: int, slice_target: SliceFactory
) -> None:
    # 8 MiB on one v5p device: each core folds one grown 4 MiB block, then they exchange.
    x = (np.random.default_rng(4).integers(-64, 64, (2048, 1024)) / 4).astype(np.float32)
    with slice_target("v5p", 1, deadline=60.0):
        out = jax.jit(lambda a: tc.reduce(a, axis, op))(jnp.asarray(x))  # type: ignore[arg-type]
    np.testing.assert_array_equal(np.asarray(out), getattr(x, op)(axis))


@pytest.mark.parametrize(
    ("br", "bc", "dtype", "lanes", "streams"),
    [
        (1024, 1024, jnp.float32, False, 4),  # 4 MiB: four 1 MiB DMAs
        (512, 1024, jnp.float32, True, 4),  # 2 MiB: four of 128 rows (output lanes)
        (2048, 1024, jnp.float32, True, 8),  # 8 MiB along columns: eight of 256 rows
        (384, 1024, jnp.float32, True, 3),  # 1.5 MiB: three of 128 rows
        (4096, 1024, jnp.float32, False, 4),  # 16 MiB: still at most 4 along rows
        (128, 1024, jnp.float32, False, 2),  # 512 KiB: two of 256 KiB
        (128, 1024, jnp.float32, True, 1),  # rows that become lanes stay whole at 128
        (64, 1024, jnp.float32, False, 1),  # 256 KiB: one DMA
        (96, 2048, jnp.float32, False, 3),  # 768 KiB: three sub-blocks of 32 rows
    ],
)
def test_streams_per_block(br: int, bc: int, dtype: object, lanes: bool, streams: int) -> None:
    from coremesh.tensorcore.ops.reduce import _streams

    assert _streams(br, bc, dtype, lanes=lanes) == streams


@pytest.mark.parametrize(("op", "axis"), [("max", 0), ("min", 1)])
def test_bfloat16_blocks_fetched_as_several_dmas(
    op: str, axis: int, slice_target: SliceFactory
) -> None:
    # 8 MiB of bfloat16 on one v5p device: grown blocks, each fetched as several sub-blocks
    # (16-row bf16 tiles inside 32-row streams), then the core exchange along rows.
    from coremesh.tensorcore.ops.reduce import _streams

    c = cc.get_chip("v5p")
    br, bc = choose_block(
        4096, 1024, jnp.bfloat16, chip=c, operands=2, cores=2, row_align=128 if axis else 1
    )
    grown = _grow_rows(br, bc, 4096, 2, 2, c)
    assert _streams(grown, bc, jnp.bfloat16, lanes=bool(axis)) > 1
    x = (np.random.default_rng(5).integers(-64, 64, (4096, 1024)) / 4).astype(jnp.bfloat16)
    with slice_target("v5p", 1, deadline=60.0):
        out = jax.jit(lambda a: tc.reduce(a, axis, op))(jnp.asarray(x))  # type: ignore[arg-type]
    assert out.dtype == jnp.bfloat16
    want = getattr(np.asarray(x, np.float32), op)(axis)
    np.testing.assert_array_equal(np.asarray(out, np.float32), want)


def test_columns_fetched_as_eight_dmas(slice_target: SliceFactory) -> None:
    # 16 MiB on one v6e device: 8 MiB blocks (a quarter of its 32 MiB scoped VMEM), each
    # arriving as 8 sub-blocks of 256 rows, every one folded into its own 256 output lanes.
    from coremesh.tensorcore.ops.reduce import _streams

    c = cc.get_chip("v6e")
    br, bc = choose_block(4096, 1024, jnp.float32, chip=c, operands=2, row_align=128)
    grown = _grow_rows(br, bc, 4096, 4, 1, c)
    assert (grown, _streams(grown, bc, jnp.float32, lanes=True)) == (2048, 8)
    x = np.random.default_rng(6).standard_normal((4096, 1024)).astype(np.float32)
    with slice_target("v6e", 1, deadline=120.0):
        out = jax.jit(lambda a: tc.reduce(a, 1, "max"))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), x.max(1))
