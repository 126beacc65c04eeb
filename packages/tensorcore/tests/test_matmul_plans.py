"""matmul's two plans: which one a shape gets per chip, and each one's results on the simulator."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import coremesh.core as cc
import coremesh.tensorcore as tc
from coremesh.tensorcore.block_sizes import ResidentPlan, choose_resident_plan
from coremesh.testing.plugin import SliceFactory


def _ints(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Small integers: float32 products and sums of them are exact, whatever the order."""
    return np.random.default_rng(seed).integers(-8, 8, shape).astype(np.float32)


@pytest.mark.parametrize("chip", ["v5e", "v5p", "v6e", "TPU7x"])
def test_benchmark_shape_keeps_b_resident(chip: str) -> None:
    c = cc.get_chip(chip)
    cores = c.default_cores_per_device
    plan = choose_resident_plan(2048, 2048, 2048, jnp.bfloat16, jnp.float32, chip=c, cores=cores)
    assert plan is not None
    # 512-row steps in 128-row streams; b in 8 chunks of 256 rows.
    assert (plan.rows, plan.streams, plan.rhs_chunks) == (512, 4, 8)
    b = 2048 * 2048 * 2
    assert plan.vmem_bytes == b + 2 * 512 * (2048 * 2 + 2048 * 4) + 128 * 2048 * 4
    assert plan.vmem_bytes <= c.vmem_bytes_per_core // 2


def test_b_too_large_for_vmem_gets_no_resident_plan() -> None:
    # 8192 x 8192 bf16 is 128 MiB: more than half of any core's VMEM.
    for chip in ("v5e", "v5p", "v6e", "TPU7x"):
        assert choose_resident_plan(1024, 8192, 8192, jnp.bfloat16, jnp.float32, chip=chip) is None


def test_rows_that_do_not_split_over_cores_get_no_resident_plan() -> None:
    assert choose_resident_plan(12, 256, 256, jnp.float32, jnp.float32, chip="v5p", cores=2) is None


def test_bfloat16_output_rows_come_in_its_sublane_tile() -> None:
    plan = choose_resident_plan(96, 256, 256, jnp.float32, jnp.bfloat16, chip="v6e")
    assert plan is not None
    assert plan == ResidentPlan(rows=96, streams=1, rhs_chunks=8, vmem_bytes=plan.vmem_bytes)
    assert (plan.rows // plan.streams) % 16 == 0


def _kernel_names(fn: Callable[..., jax.Array], *args: jax.Array) -> str:
    return str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize(
    ("chip", "m"),
    [
        ("v5p", 2048),  # 2 cores x 2 steps of 512 rows in 4 streams: b waited on each core
        ("v6e", 1536),  # 3 steps
    ],
)
def test_resident_plan_matches_numpy(chip: str, m: int, slice_target: SliceFactory) -> None:
    a, b = _ints((m, 256), 1), _ints((256, 256), 2)
    with slice_target(chip, 1, deadline=120.0):
        names = _kernel_names(tc.matmul, jnp.asarray(a), jnp.asarray(b))
        out = jax.jit(tc.matmul)(jnp.asarray(a), jnp.asarray(b))
    assert "coremesh_matmul_resident" in names
    np.testing.assert_array_equal(np.asarray(out), a @ b)


def test_explicit_blocks_take_the_blocked_plan(slice_target: SliceFactory) -> None:
    a, b = _ints((64, 512), 3), _ints((512, 256), 4)
    with slice_target("v5p", 1, deadline=60.0):
        fn = lambda x, y: tc.matmul(x, y, blocks=(16, 128, 128))  # noqa: E731
        names = _kernel_names(fn, jnp.asarray(a), jnp.asarray(b))
        out = jax.jit(fn)(jnp.asarray(a), jnp.asarray(b))
    assert "coremesh_matmul_resident" not in names and "coremesh_matmul" in names
    np.testing.assert_array_equal(np.asarray(out), a @ b)
