"""A copy by a load and a store (``o_ref[...] = s_ref[...]``, through a cast, reshape, transpose
or slice) hands on what it loads, as a DMA does: unwritten rows stay unwritten (no error when the
caller ignores them), while values computed from unwritten memory still raise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.testing.sim import UninitializedReadError, simulate

pytestmark = pytest.mark.sim

XS = np.random.default_rng(3).standard_normal((16, 128)).astype(np.float32)


def run(body: Any, out: Any, scratch: list[Any], *, fast: bool) -> tuple[np.ndarray, str]:
    f = pl.pallas_call(body, out_shape=out, scratch_shapes=scratch)
    with simulate("v5p", 1, fast_path=fast) as sim:
        result = np.asarray(sim.run(f, XS))
    paths = set(sim.paths.values())
    assert len(paths) == 1, sim.paths
    return result, paths.pop()


F32 = jax.ShapeDtypeStruct((16, 128), jnp.float32)
VMEM = pltpu.VMEM((16, 128), jnp.float32)


def copy_rows(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:8, :] = x_ref[0:8, :] * 2.0 + 1.0  # rows 8:16 never written
    o_ref[...] = s_ref[...]


@pytest.mark.parametrize("fast", [False, True])
def test_a_copy_of_partly_unwritten_scratch_is_no_error_and_the_written_rows_are_right(
    fast: bool,
) -> None:
    # JAX's ragged_paged_attention ends with o_ref[...] = acc_ref[...] and its caller reads only
    # the rows it wrote. On the fast path the result holds the tagged NaN: the interpreter
    # re-runs the kernel and finds only a copy, so the call returns.
    out, path = run(copy_rows, F32, [VMEM], fast=fast)
    np.testing.assert_allclose(out[:8], XS[:8] * 2.0 + 1.0, rtol=1e-6)
    assert np.isnan(out[8:]).all()
    assert path == ("compiled" if fast else "interpreted: simulate(fast_path=False)")


def cast_rows(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:8, :] = x_ref[0:8, :] * 2.0
    o_ref[...] = s_ref[...].astype(o_ref.dtype)


def reshaped(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:4, :] = x_ref[0:8, :].reshape(4, 256)  # rows 4:8 never written
    o_ref[...] = s_ref[...].reshape(16, 128)


def transposed(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[:, 0:8] = x_ref[0:8, :].T  # columns 8:16 never written
    o_ref[...] = s_ref[...].T


def sliced(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:8, :] = x_ref[0:8, :]
    o_ref[...] = s_ref[...][0:16, :]  # a slice of the loaded value: rows 8:16 unwritten


def broadcast_row(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
    s_ref[0:1, :] = x_ref[0:1, :]
    o_ref[0:8, :] = jnp.broadcast_to(s_ref[0:1, :], (8, 128))  # written row 0, 8 times
    o_ref[8:16, :] = jnp.broadcast_to(s_ref[1:2, :], (8, 128))  # unwritten row 1, 8 times


COPIES: dict[str, tuple[Callable[..., None], Any, Any, Callable[[np.ndarray], np.ndarray]]] = {
    "cast to bfloat16": (
        cast_rows,
        jnp.bfloat16,
        VMEM,
        lambda x: np.asarray(jnp.asarray(x[:8] * 2.0, jnp.bfloat16)),
    ),
    "cast to int32": (cast_rows, jnp.int32, VMEM, lambda x: (x[:8] * 2.0).astype(np.int32)),
    "reshape": (reshaped, jnp.float32, pltpu.VMEM((8, 256), jnp.float32), lambda x: x[:8]),
    "transpose": (transposed, jnp.float32, pltpu.VMEM((128, 16), jnp.float32), lambda x: x[:8]),
    "slice": (sliced, jnp.float32, pltpu.VMEM((32, 128), jnp.float32), lambda x: x[:8]),
    "broadcast": (broadcast_row, jnp.float32, VMEM, lambda x: np.repeat(x[0:1], 8, axis=0)),
}


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("name", list(COPIES))
def test_a_copy_through_a_cast_reshape_or_slice_hands_on_unwritten_rows(
    name: str, fast: bool
) -> None:
    body, dtype, scratch, want = COPIES[name]
    out, _ = run(body, jax.ShapeDtypeStruct((16, 128), dtype), [scratch], fast=fast)
    np.testing.assert_array_equal(out[:8], want(XS))
    if jnp.issubdtype(dtype, jnp.floating):
        assert np.isnan(np.asarray(out[8:], np.float32)).all()


def test_an_integer_copy_of_unwritten_scratch_raises_nothing() -> None:
    # An integer load raises at once when it is a use (an index, a flag); one that is only
    # copied is not, as a DMA's copy is not.
    def body(x_ref: Any, o_ref: Any, s_ref: Any) -> None:
        s_ref[0:8, :] = x_ref[0:8, :] + 7
        o_ref[...] = s_ref[...]

    xs = np.arange(16 * 128, dtype=np.int32).reshape(16, 128)
    f = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.int32),
        scratch_shapes=[pltpu.VMEM((16, 128), jnp.int32)],
    )
    with simulate("v5p", 1):
        out = np.asarray(f(xs))
    np.testing.assert_array_equal(out[:8], xs[:8] + 7)


def arithmetic(x_ref: Any, o_ref: Any, s_ref: Any, *_: Any) -> None:
    o_ref[...] = s_ref[...] * 2.0 + x_ref[...]


def negation(x_ref: Any, o_ref: Any, s_ref: Any, *_: Any) -> None:
    o_ref[...] = -s_ref[...]  # keeps the tagged NaN, as a copy would: still a use


def reduction(x_ref: Any, o_ref: Any, s_ref: Any, *_: Any) -> None:
    s_ref[0:8, :] = x_ref[0:8, :]
    o_ref[...] = jnp.broadcast_to(s_ref[...].sum(axis=0, keepdims=True), (16, 128))


def maximum(x_ref: Any, o_ref: Any, s_ref: Any, *_: Any) -> None:
    o_ref[...] = jnp.maximum(s_ref[...], x_ref[...])


def mixed_select(x_ref: Any, o_ref: Any, s_ref: Any, *_: Any) -> None:
    s_ref[0:8, :] = x_ref[0:8, :]
    left = jax.lax.broadcasted_iota(jnp.int32, (16, 128), 1) < 64
    o_ref[...] = jnp.where(left, x_ref[...], s_ref[...])  # right half of rows 8:16 unwritten


def copy_of_a_computed_value(x_ref: Any, o_ref: Any, s_ref: Any, t_ref: Any) -> None:
    t_ref[...] = x_ref[...] + s_ref[...]  # computed from unwritten memory
    o_ref[...] = t_ref[...]  # a copy hands that on


def use_of_copied_unwritten_rows(x_ref: Any, o_ref: Any, s_ref: Any, t_ref: Any) -> None:
    t_ref[...] = s_ref[...]  # unwritten rows stay unwritten in the copy
    o_ref[...] = t_ref[...] + 1.0


USES: dict[str, tuple[Callable[..., None], int]] = {
    "arithmetic": (arithmetic, 2048),
    "negation": (negation, 2048),
    "reduction": (reduction, 2048),
    "maximum": (maximum, 2048),
    "select mixing written and unwritten": (mixed_select, 512),
    "copy of a computed value": (copy_of_a_computed_value, 2048),
    "use of copied unwritten rows": (use_of_copied_unwritten_rows, 2048),
}


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("name", list(USES))
def test_a_computation_on_unwritten_memory_still_raises(name: str, fast: bool) -> None:
    body, derived = USES[name]
    f = pl.pallas_call(body, out_shape=F32, scratch_shapes=[VMEM, VMEM])
    with simulate("v5p", 1, fast_path=fast), pytest.raises(UninitializedReadError) as info:
        f(XS)
    assert f"computed from unwritten memory: {derived} of 2048 element(s)" in str(info.value)


def test_a_copy_through_bfloat16_keeps_unwritten_rows_unwritten_for_a_later_use() -> None:
    # XLA:CPU's float32 -> bfloat16 conversion drops the tagged NaN; the copy's unwritten rows
    # get it back, so a computation on them is still caught (interpreted: the compiled path
    # follows the NaN only).
    def body(x_ref: Any, o_ref: Any, s_ref: Any, t_ref: Any) -> None:
        s_ref[0:8, :] = x_ref[0:8, :]
        t_ref[...] = s_ref[...].astype(jnp.bfloat16)
        o_ref[...] = t_ref[...].astype(jnp.float32) * 2.0

    f = pl.pallas_call(
        body, out_shape=F32, scratch_shapes=[VMEM, pltpu.VMEM((16, 128), jnp.bfloat16)]
    )
    with simulate("v5p", 1, fast_path=False), pytest.raises(UninitializedReadError) as info:
        f(XS)
    assert "1024 of 2048 element(s)" in str(info.value)
    assert "the first at (8, 0)" in str(info.value)


def rows_below(n: int) -> jax.Array:
    return jax.lax.broadcasted_iota(jnp.int32, (16, 128), 0) < n


def merge_first_rows(x_ref: Any, o_ref: Any) -> None:
    # JAX's megablox gmm: select(mask, acc, out[...]) into an output block nobody wrote.
    o_ref[...] = jnp.where(rows_below(8), x_ref[...] * 2.0, o_ref[...])


def merge_last_rows(x_ref: Any, prev_ref: Any, o_ref: Any) -> None:
    o_ref[...] = prev_ref[...]  # gmm's existing_out: an output block is not read in
    o_ref[...] = jnp.where(rows_below(8), o_ref[...], x_ref[...] * 3.0)


@pytest.mark.parametrize("fast", [False, True])
def test_a_merge_into_the_place_it_loaded_leaves_the_other_rows_unwritten(fast: bool) -> None:
    # gmm's group shards: the first leaves the rows of other groups as they were (stale on the
    # chip), the next, given that result as its output, fills them. No row is computed from
    # unwritten memory, so neither call raises, and the rows match numpy.
    first = pl.pallas_call(merge_first_rows, out_shape=F32)
    second = pl.pallas_call(merge_last_rows, out_shape=F32, input_output_aliases={1: 0})
    with simulate("v5p", 1, fast_path=fast) as sim:
        partial = np.asarray(sim.run(first, XS))
        whole = np.asarray(sim.run(second, XS, jnp.asarray(partial)))
    np.testing.assert_allclose(partial[:8], XS[:8] * 2.0, rtol=1e-6)
    assert np.isnan(partial[8:]).all()
    np.testing.assert_allclose(whole, np.concatenate([XS[:8] * 2.0, XS[8:] * 3.0]), rtol=1e-6)


def merge_computed_rows(x_ref: Any, o_ref: Any, s_ref: Any, *_: Any) -> None:
    o_ref[...] = x_ref[...]
    o_ref[...] = jnp.where(rows_below(8), s_ref[...] + 1.0, o_ref[...])


@pytest.mark.parametrize("fast", [False, True])
def test_a_merge_of_values_computed_from_unwritten_memory_still_raises(fast: bool) -> None:
    # The rows the select takes from the computation replace written values: a use, named.
    f = pl.pallas_call(merge_computed_rows, out_shape=F32, scratch_shapes=[VMEM])
    with simulate("v5p", 1, fast_path=fast), pytest.raises(UninitializedReadError) as info:
        f(XS)
    assert "computed from unwritten memory: 1024 of 2048 element(s)" in str(info.value)
    assert "the first at (0, 0)" in str(info.value)
