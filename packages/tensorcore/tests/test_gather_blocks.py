"""gather_blocks on the simulator: DMA window rounds and tail, uneven core shares, clamping."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.tensorcore as tc
from coremesh.testing.plugin import SliceFactory


@pytest.fixture(params=[("v5p", 1), ("v6e", 2)], ids=["v5px1", "v6ex2"])
def target(request: pytest.FixtureRequest, slice_target: SliceFactory) -> Iterator[Any]:
    chip, devices = request.param
    with slice_target(chip, devices, deadline=20.0) as sim:
        yield sim


def take(x: np.ndarray, idx: np.ndarray, br: int = 8) -> np.ndarray:
    """``jnp.take(..., mode="clip")`` on blocks of ``br`` rows: the reference."""
    blocks = x.reshape(-1, br, x.shape[1])
    out: np.ndarray = blocks[np.clip(idx, 0, len(blocks) - 1)].reshape(-1, x.shape[1])
    return out


def test_window_rounds_tail_and_uneven_core_shares(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window of 3: 11 or 12 blocks per core run 3 up front, 2 full rounds and a tail of 2
    # or 3, and an odd count per device leaves one core an extra block on v5p.
    # The module, not the function of the same name that coremesh.tensorcore.ops exports.
    gather_module = importlib.import_module("coremesh.tensorcore.ops.gather_blocks")
    monkeypatch.setattr(gather_module, "IN_FLIGHT", 3)
    x = np.random.default_rng(1).standard_normal((80, 256)).astype(np.float32)
    n = 23 * target.num_devices
    idx = np.random.default_rng(2).integers(0, 10, n).astype(np.int32)
    out = tc.gather_blocks(jnp.asarray(x), jnp.asarray(idx))
    np.testing.assert_array_equal(np.asarray(out), take(x, idx))


def test_fewer_blocks_than_cores(target: Any) -> None:
    x = np.random.default_rng(3).standard_normal((32, 128)).astype(np.float32)
    idx = np.array([2, 1], np.int32)[: target.num_devices]
    out = tc.gather_blocks(jnp.asarray(x), jnp.asarray(idx))
    np.testing.assert_array_equal(np.asarray(out), take(x, idx))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int16])
def test_traced_indices_clamped_both_ways(target: Any, dtype: Any) -> None:
    x = np.random.default_rng(4).standard_normal((64, 128)).astype(np.float32)
    idx = np.array([-5, 3, 100, 7], np.int64)
    out = jax.jit(tc.gather_blocks)(jnp.asarray(x), jnp.asarray(idx, dtype))
    np.testing.assert_array_equal(np.asarray(out), take(x, idx))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_f_runs_on_each_gathered_block_in_vmem(target: Any, dtype: Any) -> None:
    # The guide's pattern: the pipeline's input index map reads the SMEM indices; 2 cores split
    # the steps on v5p. Quarter-integers keep x * 2 + 1 exact in bfloat16.
    br = 16 if dtype == jnp.bfloat16 else 8
    x = (np.random.default_rng(5).integers(-64, 64, (br * 12, 384)) / 4).astype(np.float32)
    idx = np.array([11, 0, 5, 5, 3, 9, 1, 7], np.int32)
    xs = jnp.asarray(x, dtype)
    names = str(jax.make_jaxpr(lambda a: tc.gather_blocks(a, jnp.asarray(idx), f=lambda b: b))(xs))
    assert "coremesh_gather_map_blocks" in names
    out = jax.jit(lambda a, i: tc.gather_blocks(a, i, block_rows=br, f=lambda b: b * 2 + 1))(
        xs, jnp.asarray(idx)
    )
    assert out.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(out, np.float32), take(x, idx, br) * 2 + 1)


def test_f_clamps_traced_indices_like_take(target: Any) -> None:
    x = np.random.default_rng(6).standard_normal((64, 128)).astype(np.float32)
    idx = jnp.array([-3, 100] * target.num_devices, jnp.int32)
    out = jax.jit(lambda a, i: tc.gather_blocks(a, i, f=jnp.negative))(jnp.asarray(x), idx)
    np.testing.assert_array_equal(np.asarray(out), -take(x, np.asarray(idx)))
