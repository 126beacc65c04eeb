"""SparseCore kernels the compiler takes and the simulator refused: a gather from a 1-D table
(single elements, no rows; ``coremesh.core.dma``) and float16 operands (``sim.operands``). Each
runs on the simulator against numpy, and compiles with libtpu for v5p and TPU7x; a 2-D table
with rows of 8 elements is refused by both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc
from jax.sharding import PartitionSpec as P

from coremesh.core import LayoutError
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.sim import simulate

N = 16  # indices gathered


def subcore_mesh() -> Any:
    return plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)


def gather(out_shape: tuple[int, ...], dtype: Any) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """``table[idx]`` by one indexed DMA on subcore 0."""

    def body(x_hbm: Any, i_hbm: Any, o_hbm: Any) -> None:
        @pl.when(jax.lax.axis_index("subcore") == 0)
        def _() -> None:
            def inner(iv: Any, ov: Any) -> None:
                pltpu.sync_copy(i_hbm, iv)
                pltpu.sync_copy(x_hbm.at[iv], ov)
                pltpu.sync_copy(ov, o_hbm)

            pl.run_scoped(inner, pltpu.VMEM((N,), jnp.int32), pltpu.VMEM(out_shape, dtype))

    def f(x: jax.Array, idx: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct(out_shape, dtype)
        return pl.kernel(body, out_type=out, mesh=subcore_mesh())(x, idx)

    return f


def copy(x: jax.Array) -> jax.Array:
    """``x`` through a subcore's VMEM."""

    def body(x_hbm: Any, o_hbm: Any) -> None:
        @pl.when(jax.lax.axis_index("subcore") == 0)
        def _() -> None:
            def inner(v: Any) -> None:
                pltpu.sync_copy(x_hbm, v)
                pltpu.sync_copy(v, o_hbm)

            pl.run_scoped(inner, pltpu.VMEM(x.shape, x.dtype))

    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return pl.kernel(body, out_type=out, mesh=subcore_mesh())(x)


TABLE_1D = np.arange(64, dtype=np.int32) * 3
INDICES = np.random.default_rng(0).permutation(64)[:N].astype(np.int32)
HALF = (np.arange(8 * 128).reshape(8, 128) / 7).astype(np.float16)


@pytest.mark.sim
def test_a_gather_from_a_1d_table_runs() -> None:
    with simulate("v5p", 1) as sim:
        got = sim.run(jax.jit(gather((N,), jnp.int32)), TABLE_1D, INDICES)
    np.testing.assert_array_equal(np.asarray(got), TABLE_1D[INDICES])


@pytest.mark.sim
def test_rows_of_8_elements_are_still_refused() -> None:
    table = np.zeros((64, 8), np.int32)
    with simulate("v5p", 1), pytest.raises(LayoutError, match="rows of 8 elements"):
        jax.jit(gather((N, 8), jnp.int32))(table, INDICES)


@pytest.mark.sim
def test_float16_operands_of_a_sparsecore_kernel_run() -> None:
    with simulate("v5p", 1) as sim:
        got = sim.run(jax.jit(copy), HALF)
    assert got.dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(got), HALF)


def compile_for(target: CompileTarget, fn: Any, *args: np.ndarray) -> None:
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=target.sharding(P())) for a in args]
    spec = tuple(P() for _ in args)
    with target.activate():
        mapped = jax.shard_map(fn, mesh=target.mesh, in_specs=spec, out_specs=P(), check_vma=False)
        jax.jit(mapped).trace(*structs).lower().compile()


@pytest.mark.aot(chips=("v5p", "TPU7x"), devices=2)
def test_the_compiler_takes_both_and_refuses_rows_of_8(aot_target: CompileTarget) -> None:
    compile_for(aot_target, gather((N,), jnp.int32), TABLE_1D, INDICES)
    compile_for(aot_target, copy, HALF)
    with pytest.raises(Exception, match=r"expected slice size \(8\)"):
        compile_for(aot_target, gather((N, 8), jnp.int32), np.zeros((64, 8), np.int32), INDICES)
