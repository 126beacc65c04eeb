"""``jax.empty_ref`` scratch in a kernel body (patch ``scoped_refs``), on every jax line.

Stock interpret mode leaves the allocation in the core's traced program as a JAX mutable array,
which fails to compile inside a host callback: the caller gets a raw ``JaxRuntimeError``
(``CpuCallback error ... No state discharge rule implemented for primitive: io_callback``), on its
own or after other kernels. The simulator allocates it as Mosaic does, for the rest of the region.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import simulate

pytestmark = pytest.mark.sim

ROWS, LANES = 16, 128


def _copy_through_scratch(x_ref: Any, o_ref: Any) -> None:
    """Each core copies its 128 columns through a VMEM scratch made with jax.empty_ref."""
    core = jax.lax.axis_index("core")
    cols = pl.ds(LANES * core, LANES)
    scratch = jax.empty_ref(jax.ShapeDtypeStruct((ROWS, LANES), jnp.float32), pltpu.VMEM)
    pltpu.sync_copy(x_ref.at[:, cols], scratch)
    scratch[...] = scratch[...] + core.astype(jnp.float32)
    pltpu.sync_copy(scratch, o_ref.at[:, cols])


def _pipeline_with_inner_scratch(x_ref: Any, o_ref: Any) -> None:
    """An emit_pipeline whose body allocates its own scratch, and one made before it."""
    bias = jax.empty_ref(jax.ShapeDtypeStruct((ROWS, LANES), jnp.float32), pltpu.VMEM)
    bias[...] = jnp.full((ROWS, LANES), 3.0, jnp.float32)

    def body(x: Any, o: Any) -> None:
        tmp = jax.empty_ref(jax.ShapeDtypeStruct((ROWS, LANES), jnp.float32), pltpu.VMEM)
        tmp[...] = x[...] * 2
        o[...] = tmp[...] + bias[...]

    core = jax.lax.axis_index("core")
    cols = pl.ds(LANES * core, LANES)
    pltpu.emit_pipeline(
        body,
        grid=(1,),
        in_specs=[pl.BlockSpec((ROWS, LANES), lambda i: (0, i))],
        out_specs=[pl.BlockSpec((ROWS, LANES), lambda i: (0, i))],
    )(x_ref.at[:, cols], o_ref.at[:, cols])


def _kernel(body: Any, cores: int) -> Any:
    out = jax.ShapeDtypeStruct((ROWS, LANES * cores), jnp.float32)
    return jax.jit(pl.kernel(body, out_type=out, mesh=jax_compat.tensorcore_mesh("core")))


def _input(cores: int) -> jax.Array:
    return jnp.arange(ROWS * LANES * cores, dtype=jnp.float32).reshape(ROWS, LANES * cores)


@pytest.mark.parametrize("cores", [2, 1])
def test_empty_ref_scratch_runs_in_a_sequence_of_kernels(cores: int) -> None:
    with simulate(chip="v5p", devices=1, cores_per_device=cores):
        x = _input(cores)
        core_of_column = np.repeat(np.arange(cores, dtype=np.float32), LANES)
        first = np.asarray(_kernel(_copy_through_scratch, cores)(x))
        np.testing.assert_array_equal(first, np.asarray(x) + core_of_column)
        second = np.asarray(_kernel(_pipeline_with_inner_scratch, cores)(x))
        np.testing.assert_array_equal(second, np.asarray(x) * 2 + 3)
        again = np.asarray(_kernel(_copy_through_scratch, cores)(x + 1))
        np.testing.assert_array_equal(again, np.asarray(x) + 1 + core_of_column)


def test_stock_interpreter_loses_empty_ref_scratch() -> None:
    """Without the patch: the per-core program fails to compile in a callback, raw."""
    with (
        simulate(chip="v5p", devices=1, disable_patches=["scoped_refs"]),
        pytest.raises(jax.errors.JaxRuntimeError, match="No state discharge rule"),
    ):
        jax.block_until_ready(_kernel(_copy_through_scratch, 2)(_input(2)))
