"""The ops' XLA references against numpy: the tests and the benchmark measure the kernels against
these, so each is held to an independent computation once here."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.core.targets import HardwareTarget


def data(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def test_map_blocks_reference_is_f_of_the_whole_arrays() -> None:
    x, y = data((16, 128), np.float32, 1), data((16, 128), np.float32, 2)
    out = tc.map_blocks_reference(lambda u, v: u * 3 - v, jnp.asarray(x), jnp.asarray(y))
    np.testing.assert_array_equal(np.asarray(out), x * 3 - y)


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_reference_accumulates_in_float32(out_dtype: Any) -> None:
    a, b = data((32, 256), jnp.bfloat16, 3), data((256, 128), jnp.bfloat16, 4)
    out = tc.matmul_reference(jnp.asarray(a), jnp.asarray(b), out_dtype=out_dtype)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert out.dtype == jnp.dtype(out_dtype)
    # bf16 inputs, exact products; float32 accumulation, and for a bf16 output its rounding.
    tol = 1e-2 if out_dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32])
def test_reduce_reference_accumulates_wide_and_returns_the_input_dtype(
    op: str, axis: int, dtype: Any
) -> None:
    x = data((48, 256), dtype, 5)
    out = tc.reduce_reference(jnp.asarray(x), axis, op)  # type: ignore[arg-type]
    assert out.dtype == jnp.dtype(dtype) and out.shape == (x.shape[1 - axis],)
    wide = getattr(x.astype(np.float64), op)(axis)
    if jnp.issubdtype(dtype, jnp.integer) or op != "sum":
        np.testing.assert_array_equal(np.asarray(out, np.float64), wide)
    else:
        # One rounding to the output dtype of a float32 sum of 48 terms.
        tol = 1e-2 if dtype == jnp.bfloat16 else 1e-5
        np.testing.assert_allclose(np.asarray(out, np.float64), wide, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_reduce_reference_max_and_min_propagate_nan(op: str, axis: int, dtype: Any) -> None:
    # (16, 256) is past the size where XLA:CPU's jnp.max starts dropping NaN.
    x = data((16, 256), np.float32, 7)
    x[3, 5] = x[9, 200] = np.nan
    x = x.astype(dtype)
    out = tc.reduce_reference(jnp.asarray(x), axis, op)  # type: ignore[arg-type]
    want = getattr(x.astype(np.float64), op)(axis)
    assert np.isnan(want).sum() == 2
    np.testing.assert_array_equal(np.asarray(out, np.float64), want)


def test_gather_blocks_reference_clips_both_ways_and_applies_f() -> None:
    x = data((64, 128), np.float32, 6)
    idx = np.array([3, -2, 7, 100, 0], np.int32)
    blocks = x.reshape(4, 16, 128)[np.clip(idx, 0, 3)].reshape(-1, 128)
    xs, ids = jnp.asarray(x), jnp.asarray(idx)
    out = tc.gather_blocks_reference(xs, ids, block_rows=16)
    np.testing.assert_array_equal(np.asarray(out), blocks)
    out = tc.gather_blocks_reference(xs, ids, block_rows=16, f=jnp.negative)
    np.testing.assert_array_equal(np.asarray(out), -blocks)


@pytest.mark.parametrize(("dtype", "rows"), [(np.float32, 8), (jnp.bfloat16, 16)])
def test_gather_blocks_reference_defaults_to_the_sublane_tile(dtype: Any, rows: int) -> None:
    """As gather_blocks does: blocks of the dtype's sublane tile on the active chip."""
    x = data((64, 128), dtype, 7)
    idx = np.array([1, 0], np.int32)
    with cc.using_target(HardwareTarget(cc.get_chip("v5p"), 1, 2)):
        out = tc.gather_blocks_reference(jnp.asarray(x), jnp.asarray(idx))
    want = x.reshape(-1, rows, 128)[idx].reshape(-1, 128)
    np.testing.assert_array_equal(np.asarray(out, np.float32), want.astype(np.float32))
