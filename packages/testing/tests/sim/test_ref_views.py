"""Patches ``view_refs`` and ``masked_swap`` on every supported jax line: accesses through
``ref.reshape`` / ``ref.transpose`` and masked stores into refs with a short later axis, against
numpy; without the patch, the interpreter's own failure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.testing.sim import SimulationFault, simulate

pytestmark = pytest.mark.sim

#: (pages, tokens, heads, dim): the layout of ragged_paged_attention's KV buffers.
X = np.arange(2 * 8 * 2 * 128, dtype=np.float32).reshape(2, 8, 2, 128)


def run(
    body: Callable[..., None], shape: tuple[int, ...], *, fast_path: bool = False, stock: str = ""
) -> np.ndarray:
    call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32))
    disabled = [stock] if stock else []
    with simulate("v5e", 1, fast_path=fast_path, disable_patches=disabled) as sim:
        return np.asarray(sim.run(call, X))


def one_head(x_ref: Any, o_ref: Any) -> None:
    rows = x_ref.at[1].reshape(16, 128)  # (tokens * heads, dim)
    o_ref[...] = rows[1::2, :]  # every second row: head 1


def store_one_head(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...]
    o_ref.at[0].reshape(16, 128)[0::2, :] = -x_ref[1, :, 0, :]


def transposed(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref.at[0, :, 0].transpose((1, 0))[...]


def across_pages(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref.at[0].reshape(16, 128)[3:11, :]  # tokens 1.5 to 5.5: no box


@pytest.mark.parametrize("fast_path", [False, True])
def test_a_strided_load_through_a_reshape_reads_one_head(fast_path: bool) -> None:
    np.testing.assert_array_equal(run(one_head, (8, 128), fast_path=fast_path), X[1, :, 1, :])


def test_a_store_through_a_reshape_writes_one_head() -> None:
    want = X.copy()
    want[0, :, 0, :] = -X[1, :, 0, :]
    np.testing.assert_array_equal(run(store_one_head, X.shape), want)


def test_a_load_through_a_transpose() -> None:
    np.testing.assert_array_equal(run(transposed, (128, 8)), X[0, :, 0, :].T)


def test_a_view_access_that_is_no_box_of_the_buffer_is_refused_by_name() -> None:
    with pytest.raises(SimulationFault, match=r"not simulated: an access through ref\.reshape"):
        run(across_pages, (8, 128))


def test_view_refs_stock() -> None:
    with pytest.raises(SimulationFault, match="'ReshapeTransform' object has no attribute"):
        run(one_head, (8, 128), stock="view_refs")


def masked_negate(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
    pltpu.store(o_ref, -x_ref[0], mask=rows >= 4)  # rows 4..7 of an (8, 2, 128) ref


@pytest.mark.parametrize("fast_path", [False, True])
def test_a_masked_store_past_a_shorter_later_axis(fast_path: bool) -> None:
    rows = np.arange(8)[:, None, None]
    want = np.where(rows >= 4, -X[0], X[0])
    np.testing.assert_array_equal(run(masked_negate, (8, 2, 128), fast_path=fast_path), want)


def test_masked_swap_stock() -> None:
    with pytest.raises(SimulationFault, match="Out-of-bounds masked swap"):
        run(masked_negate, (8, 2, 128), stock="masked_swap")


# ref.bitcast ------------------------------------------------------------------------------


def bitcast_load(dtype: Any) -> Callable[..., None]:
    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref.bitcast(dtype)[...]

    return body


def words(rows: np.ndarray, width: int) -> np.ndarray:
    """numpy: ``len(rows) * width / 32`` rows of 32-bit words; row ``k`` of each group of
    ``32 / width`` in bits ``[k * width, (k + 1) * width)``."""
    per = 32 // width
    bits = rows.astype(np.int64) & ((1 << width) - 1)
    groups = bits.reshape(-1, per, rows.shape[-1])
    packed = np.zeros(groups[:, 0, :].shape, np.int64)
    for k in range(per):
        packed |= groups[:, k, :] << (k * width)
    return packed.astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("dtype", [jnp.int16, jnp.int8, jnp.int4])
def test_a_load_through_a_bitcast_packs_rows_into_words(dtype: Any) -> None:
    width = jnp.iinfo(dtype).bits
    count = (32 // width) * 256  # every value of the type, negatives included
    x = (np.arange(count) * 37 % (1 << width) - (1 << (width - 1))).reshape(32 // width, 256)
    call = pl.pallas_call(
        bitcast_load(jnp.int32), out_shape=jax.ShapeDtypeStruct((1, 256), jnp.int32)
    )
    with simulate("v5e", 1) as sim:
        got = np.asarray(sim.run(call, jnp.asarray(x, dtype)))
    np.testing.assert_array_equal(got, words(x, width))


def test_a_store_through_a_bitcast_splits_words_into_rows() -> None:
    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref.bitcast(jnp.int32)[...] = x_ref[...]

    w = np.arange(2 * 128, dtype=np.int32).reshape(2, 128) * 65599 - 7
    call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((4, 128), jnp.int16))
    with simulate("v5e", 1) as sim:
        got = np.asarray(sim.run(call, w))
    np.testing.assert_array_equal(words(got, 16), w)


def test_view_refs_stock_bitcast() -> None:
    call = pl.pallas_call(
        bitcast_load(jnp.int32), out_shape=jax.ShapeDtypeStruct((1, 256), jnp.int32)
    )
    with (
        pytest.raises(SimulationFault, match="'BitcastTransform' object has no attribute"),
        simulate("v5e", 1, disable_patches=["view_refs"]) as sim,
    ):
        sim.run(call, jnp.zeros((2, 256), jnp.int16))


def test_a_strided_load_through_a_reshape_and_a_bitcast() -> None:
    """ragged_paged_attention's strided_load_kv for bfloat16: K and V rows interleaved, read as
    32-bit words through a reshaped view (the row of K in the low half of each word)."""
    x = (np.arange(4 * 16 * 128) % 251 - 125).astype(np.int16).reshape(4, 16, 128)

    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref.reshape(64, 128).bitcast(jnp.int32)[1::4, :]

    call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.int32))
    with simulate("v5e", 1) as sim:
        got = np.asarray(sim.run(call, jnp.asarray(x)))
    np.testing.assert_array_equal(got, words(x.reshape(64, 128), 16)[1::4])


def test_a_store_through_a_reshape_and_a_bitcast_is_refused_by_name() -> None:
    def body(x_ref: Any, o_ref: Any) -> None:
        o_ref.reshape(8, 128).bitcast(jnp.int32)[...] = x_ref[...]

    call = pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((2, 4, 128), jnp.int16))
    with (
        pytest.raises(SimulationFault, match=r"not simulated: a store through ref\.reshape"),
        simulate("v5e", 1) as sim,
    ):
        sim.run(call, jnp.zeros((4, 128), jnp.int32))


def test_a_view_of_a_bitcast_view_is_refused_before_the_kernel_runs() -> None:
    """JAX's test_multiple_ref_transforms chains bitcast, reshape and bitcast again: refused by
    name as the kernel is traced (it failed inside the kernel before, as a SimulationFault); one
    bitcast and then indices runs."""
    from coremesh.testing.sim import NotSimulatedError

    x = np.arange(32 * 256, dtype=np.int32).reshape(32, 256)
    out_shape = jax.ShapeDtypeStruct((16, 256), jnp.int16)

    def chained(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref.at[:8].bitcast(jnp.int16).reshape(2, 8, 256)[1]

    def indexed(x_ref: Any, o_ref: Any) -> None:
        o_ref[...] = x_ref.at[:8].bitcast(jnp.int16)[:]

    with simulate("v5e", 1) as sim:
        half = pl.pallas_call(chained, out_shape=jax.ShapeDtypeStruct((8, 256), jnp.int16))
        with pytest.raises(NotSimulatedError, match=r"get at .*through ref\.reshape") as err:
            sim.run(half, jnp.asarray(x))
        assert not isinstance(err.value, SimulationFault)  # refused, not failed in the kernel
        got = np.asarray(sim.run(pl.pallas_call(indexed, out_shape=out_shape), jnp.asarray(x)))
    # each int32 word becomes two int16 rows, the low half first (ref.bitcast's layout)
    low, high = (x[:8] & 0xFFFF).astype(np.uint16), (x[:8] >> 16).astype(np.uint16)
    expected = np.stack([low, high], axis=1).reshape(16, 256).view(np.int16)
    np.testing.assert_array_equal(got, expected)
