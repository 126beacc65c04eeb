"""Memory is tiled on the chip: a DMA may move the padding of a ref's last tiles, which holds
unwritten memory. ``emit_pipeline`` relies on it for edge blocks (pipeline.py
``_create_blocked_slice`` rounds the last block up to a whole tile), so a matmul over a
``(128, 129)`` operand in 128-wide blocks reads columns ``128:256``. References are numpy."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.testing.sim import SimulationFault, UninitializedReadError, simulate

pytestmark = pytest.mark.sim

ROWS, COLS = 8, 129  # float32 tiles are (8, 128): the ref's last tile has 127 columns of padding
XS = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


def window_call(body: Any, width: int) -> Any:
    """``body(x_hbm, o_vmem, window_vmem, sem)`` over ``XS`` in HBM, into an ``(8, width)``
    result."""
    return pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((ROWS, width), jnp.float32),
        grid=(1,),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((ROWS, width), jnp.float32), pltpu.SemaphoreType.DMA],
    )


def copy_columns(start: int, width: int, x_hbm: Any, window: Any, sem: Any) -> None:
    # A dynamic start, as emit_pipeline's: a static window past the ref fails when traced.
    dynamic = pl.program_id(0) + start
    pltpu.async_copy(x_hbm.at[:, pl.ds(dynamic, width)], window, sem).wait()


def doubled_masked(x_hbm: Any, o_ref: Any, window: Any, sem: Any) -> None:
    copy_columns(128, 128, x_hbm, window, sem)  # one real column, 127 of padding
    column = 128 + jax.lax.broadcasted_iota(jnp.int32, window.shape, 1)
    o_ref[...] = jnp.where(column < COLS, window[...] * 2.0, 0.0)


def doubled_unmasked(x_hbm: Any, o_ref: Any, window: Any, sem: Any) -> None:
    copy_columns(128, 128, x_hbm, window, sem)
    o_ref[...] = window[...] * 2.0


def past_the_padding(x_hbm: Any, o_ref: Any, window: Any, sem: Any) -> None:
    copy_columns(256, 128, x_hbm, window, sem)  # the tile after the ref's last one
    o_ref[...] = window[...]


def test_a_dma_into_the_last_tiles_padding_brings_the_ref_and_the_kernel_masks_the_rest() -> None:
    with simulate(devices=1):
        out = np.asarray(window_call(doubled_masked, 128)(XS))
    expected = np.zeros((ROWS, 128), np.float32)
    expected[:, 0] = XS[:, 128] * 2
    np.testing.assert_array_equal(out, expected)


def test_using_the_padding_a_dma_brought_is_a_read_of_unwritten_memory() -> None:
    with simulate(devices=1), pytest.raises(UninitializedReadError) as info:
        window_call(doubled_unmasked, 128)(XS)
    # The window's 127 columns of padding in each of 8 rows, first read by the load.
    assert "computed from unwritten memory: 1016 of 1024 element(s)" in str(info.value)
    assert info.value.location is not None and "doubled_unmasked" in info.value.location


def test_a_dma_past_the_last_tile_is_a_fault() -> None:
    with simulate(devices=1), pytest.raises(SimulationFault, match="out of bounds"):
        window_call(past_the_padding, 128)(XS)


def test_a_calls_own_logical_bounds_refuse_the_padding() -> None:
    # InterpretParams(buffer_bounds="logical"), stock's default, is the call's own choice (made
    # inside the simulator, which notes the fields a call passes).
    with simulate(devices=1), pytest.raises(SimulationFault, match="out of bounds"):
        pl.pallas_call(
            doubled_masked,
            out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
            grid=(1,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.float32), pltpu.SemaphoreType.DMA],
            interpret=pltpu.InterpretParams(buffer_bounds="logical"),
        )(XS)


def matmul_kernel(x_ref: Any, y_ref: Any, o_ref: Any, acc: Any, *, k: int) -> None:
    """JAX's padded-pipeline matmul body: the last K block's padding is masked off."""
    step, bk = pl.program_id(2), x_ref.shape[1]

    @pl.when(step == 0)
    def _() -> None:
        acc[...] = jnp.zeros_like(acc)

    x_cols = step * bk + jax.lax.broadcasted_iota(jnp.int32, x_ref.shape, 1)
    y_rows = step * bk + jax.lax.broadcasted_iota(jnp.int32, y_ref.shape, 0)
    x = jnp.where(x_cols < k, x_ref[...], 0.0)
    y = jnp.where(y_rows < k, y_ref[...], 0.0)
    acc[...] += jnp.dot(x, y, preferred_element_type=jnp.float32)

    @pl.when(step == pl.num_programs(2) - 1)
    def _() -> None:
        o_ref[...] = acc[...]


def pipelined_matmul(x: Any, y: Any, block: int) -> Any:
    (m, k), n = x.shape, y.shape[1]

    def kernel(x_hbm: Any, y_hbm: Any, o_hbm: Any) -> None:
        def run(acc: Any) -> None:
            pltpu.emit_pipeline(
                functools.partial(matmul_kernel, acc=acc, k=k),
                grid=(pl.cdiv(m, block), pl.cdiv(n, block), pl.cdiv(k, block)),
                in_specs=[
                    pl.BlockSpec((block, block), lambda i, j, s: (i, s)),
                    pl.BlockSpec((block, block), lambda i, j, s: (s, j)),
                ],
                out_specs=pl.BlockSpec((block, block), lambda i, j, s: (i, j)),
            )(x_hbm, y_hbm, o_hbm)

        pl.run_scoped(run, pltpu.VMEM((block, block), jnp.float32))

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
    )(x, y)


@pytest.mark.parametrize(("m", "k", "n"), [(128, 128, 129), (136, 200, 257)])
def test_emit_pipeline_edge_blocks_over_shapes_that_are_not_whole_blocks(
    m: int, k: int, n: int
) -> None:
    rng = np.random.default_rng(0)
    # Small integers: every product and sum is exact in the chip's bfloat16 passes.
    x = rng.integers(-4, 5, (m, k)).astype(np.float32)
    y = rng.integers(-4, 5, (k, n)).astype(np.float32)
    with simulate(devices=1):
        out = np.asarray(pipelined_matmul(x, y, 128))
    np.testing.assert_array_equal(out, x @ y)


def test_a_store_through_a_bitcast_view_of_a_buffer_with_padding() -> None:
    # The (1, 8) int32 output is allocated as its whole (1, 128) tile; the view is of the ref's
    # own 8 lanes.
    def kernel(o_ref: Any) -> None:
        halves = o_ref.bitcast(jnp.int16)
        halves[...] = jnp.ones(halves.shape, jnp.int16)

    with simulate(devices=1):
        out = np.asarray(
            pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1, 8), jnp.int32))()
        )
    np.testing.assert_array_equal(out, np.full((1, 8), 0x00010001, np.int32))
