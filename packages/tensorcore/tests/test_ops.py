"""TensorCore ops on the simulator, each against its XLA reference (``<op>_reference``, itself
checked against numpy in test_references.py) or numpy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import coremesh.tensorcore as tc
from coremesh.testing.plugin import SliceFactory

# (chip, devices): v5p has 2 TensorCores per device (megacore), v6e one.
TARGETS = [("v5p", 1), ("v5p", 2), ("v6e", 2)]


@pytest.fixture(params=TARGETS, ids=[f"{c}x{d}" for c, d in TARGETS])
def target(request: pytest.FixtureRequest, slice_target: SliceFactory) -> Iterator[Any]:
    chip, devices = request.param
    with slice_target(chip, devices, deadline=20.0) as sim:
        yield sim


def data(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def exact(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Quarter-integers below 16: elementwise results are exact even in bfloat16."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-64, 64, shape) / 4).astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_map_blocks(target: Any, dtype: Any) -> None:
    x, y = exact((96, 384), dtype, 1), exact((96, 384), dtype, 2)
    out = jax.jit(lambda a, b: tc.map_blocks(lambda u, v: u * 3 - v, a, b))(x, y)
    ref = tc.map_blocks_reference(lambda u, v: u * 3 - v, jnp.asarray(x), jnp.asarray(y))
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))


def test_map_blocks_changes_dtype_blockwise(target: Any) -> None:
    x = data((64, 256), jnp.float32)
    out = tc.map_blocks(lambda u: (u > 0).astype(jnp.int32), jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out), (x > 0).astype(np.int32))


def test_map_blocks_on_square_blocks(slice_target: SliceFactory) -> None:
    """Square blocks take a blockwise f, including one written for the block's own shape (it
    cannot be traced on the wider probe that catches transposes)."""
    x = exact((256, 128), jnp.float32, 11)

    def lower(u: jax.Array) -> jax.Array:  # keeps the block's lower triangle: (128, 128) only
        row = jax.lax.broadcasted_iota(jnp.int32, (128, 128), 0)
        col = jax.lax.broadcasted_iota(jnp.int32, (128, 128), 1)
        return jnp.where(row >= col, u, 0)

    with slice_target("v5p", 1, deadline=20.0):
        out = tc.map_blocks(lambda u: u * 2 - 1, jnp.asarray(x), block=(128, 128))
        masked = tc.map_blocks(lower, jnp.asarray(x), block=(128, 128))
    np.testing.assert_array_equal(np.asarray(out), x * 2 - 1)
    np.testing.assert_array_equal(np.asarray(masked), x * np.tile(np.tri(128), (2, 1)))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32])
def test_reduce(target: Any, op: str, axis: int, dtype: Any) -> None:
    x = data((96, 640), dtype, 3)  # not powers of two: 3 row tiles of 32, 5 lane tiles
    out = jax.jit(lambda a: tc.reduce(a, axis, op))(x)  # type: ignore[arg-type]
    ref = tc.reduce_reference(jnp.asarray(x), axis, op)  # type: ignore[arg-type]
    assert out.shape == ref.shape and out.dtype == ref.dtype == jnp.dtype(dtype)
    if op == "sum" and dtype != jnp.int32:
        tol = 2e-2 if dtype == jnp.bfloat16 else 1e-4
        np.testing.assert_allclose(
            np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=tol, atol=tol
        )
    else:
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))


def with_nans(shape: tuple[int, int], dtype: Any) -> np.ndarray:
    """Normal data with NaN in a few rows and columns (not all: most results stay finite)."""
    x = data(shape, np.float32, 10)
    for r, c in [(5, 7), (20, 100), (shape[0] - 1, shape[1] - 1), (20, 200)]:
        x[r, c] = np.nan
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_reduce_max_and_min_propagate_nan_like_numpy(
    slice_target: SliceFactory, dtype: Any
) -> None:
    """numpy's (and jnp's documented) semantics: a max or min over a NaN is NaN. XLA:CPU's own
    reductions drop it, so numpy is the reference here, not jnp.max on this host. Two v5p
    devices: NaN crosses the cores' exchange (axis 0) and the devices' combine."""
    x = with_nans((64, 256), dtype)
    for axis in (0, 1):
        for op in ("max", "min"):
            with slice_target("v5p", 2, deadline=20.0):
                out = jax.jit(lambda a, axis=axis, op=op: tc.reduce(a, axis, op))(jnp.asarray(x))
            want = getattr(np, op)(x.astype(np.float32), axis)
            assert 0 < np.isnan(want).sum() < want.size
            np.testing.assert_array_equal(np.asarray(out, np.float32), want, err_msg=f"{op}{axis}")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul(target: Any, dtype: Any) -> None:
    a, b = jnp.asarray(data((96, 384), dtype, 4)), jnp.asarray(data((384, 256), dtype, 5))
    out = jax.jit(tc.matmul)(a, b)
    ref = tc.matmul_reference(a, b)
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-3)


def test_matmul_small_blocks_accumulate_over_k(target: Any) -> None:
    a, b = jnp.asarray(data((32, 512), jnp.float32, 6)), jnp.asarray(data((512, 128), jnp.float32))
    out = tc.matmul(a, b, blocks=(8, 128, 128), out_dtype=jnp.bfloat16)
    ref = tc.matmul_reference(a, b, out_dtype=jnp.bfloat16)
    assert out.dtype == ref.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=1e-2, atol=1e-1
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gather_blocks(target: Any, dtype: Any) -> None:
    x = data((160, 384), dtype, 7)
    br = 16 if dtype == jnp.bfloat16 else 8
    idx = np.array([9, 0, 3, 3, 7, 1], np.int32)[: 6 - (6 % target.num_devices)]
    out = tc.gather_blocks(jnp.asarray(x), jnp.asarray(idx), block_rows=br)
    ref = x.reshape(-1, br, 384)[idx].reshape(-1, 384)
    np.testing.assert_array_equal(np.asarray(out, np.float32), ref.astype(np.float32))


def test_gather_blocks_clips_traced_indices_like_take(target: Any) -> None:
    x = data((64, 128), jnp.float32, 8)
    idx = jnp.array([0, 100], jnp.int32)  # 100 is past the last of 8 blocks
    out = jax.jit(tc.gather_blocks)(jnp.asarray(x), idx)
    ref = tc.gather_blocks_reference(jnp.asarray(x), idx)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_ops_inside_a_users_shard_map(target: Any) -> None:
    """Called inside shard_map, ops work on the local shard and do not wrap themselves again."""
    n = target.num_devices
    x = data((32 * n, 256), jnp.float32, 9)

    def local(xs: jax.Array) -> jax.Array:
        assert tc.inside_shard_map("device")
        return tc.map_blocks(jnp.negative, xs)

    f = jax.jit(
        jax.shard_map(
            local,
            mesh=target.device_mesh(),
            in_specs=P("device", None),
            out_specs=P("device", None),
            check_vma=False,
        )
    )
    np.testing.assert_array_equal(np.asarray(f(x)), -x)


def test_ops_on_one_core_of_a_megacore_device(slice_target: SliceFactory) -> None:
    """A caller may keep an op on one TensorCore (e.g. to leave the other to another kernel)."""
    with slice_target("v5p", 1, deadline=20.0) as sim:
        one = tc.TensorCoreMesh(sim.chip, 1)
        x = exact((64, 256), jnp.float32, 10)
        np.testing.assert_array_equal(
            np.asarray(tc.map_blocks(jnp.negative, jnp.asarray(x), mesh=one)), -x
        )
        np.testing.assert_array_equal(
            np.asarray(tc.reduce(jnp.asarray(x), 0, "max", mesh=one)), x.max(0)
        )


def test_ops_on_a_core_axis_with_another_name(slice_target: SliceFactory) -> None:
    """The ops split and exchange over the mesh's own core axis name, not a fixed "core"."""
    with slice_target("v5p", 1, deadline=30.0):
        tcm = tc.mesh(axis_name="tc")
        assert dict(tcm.axes) == {"tc": 2}
        x = exact((64, 256), jnp.float32, 11)
        a, b = exact((32, 128), jnp.float32, 12), exact((128, 128), jnp.float32, 13)
        xs = jnp.asarray(x)
        np.testing.assert_array_equal(np.asarray(tc.map_blocks(jnp.negative, xs, mesh=tcm)), -x)
        for axis in (0, 1):
            np.testing.assert_array_equal(
                np.asarray(tc.reduce(xs, axis, "sum", mesh=tcm)), x.sum(axis)
            )
        for blocks in (None, (16, 128, 128)):
            out = tc.matmul(jnp.asarray(a), jnp.asarray(b), mesh=tcm, blocks=blocks)
            np.testing.assert_array_equal(np.asarray(out), a @ b)
        idx = jnp.array([7, 0, 3, 3], jnp.int32)
        for f in (None, jnp.negative):
            out = tc.gather_blocks(xs, idx, mesh=tcm, f=f)
            ref = x.reshape(8, 8, 256)[np.asarray(idx)].reshape(-1, 256)
            np.testing.assert_array_equal(np.asarray(out), ref if f is None else -ref)
