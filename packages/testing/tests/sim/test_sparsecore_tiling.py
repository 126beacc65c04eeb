"""An indexed DMA's limits follow the kernel's tiling, as Mosaic's do.

Under the TensorCore tiling a SparseCore kernel gets by default, Mosaic moves 32-bit elements in
rows of whole 128-word tiles only (``coremesh.core.dma``). With the SparseCore's own tiling
(``use_tc_tiling_on_sc=False``) libtpu 0.0.52 compiled 32-element float32 and bfloat16 rows for
v5p and TPU7x, so the simulator runs them (JAX's ``test_gather_add`` is such a kernel), and
refuses the same kernel under the default tiling, as the compiler does."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import coremesh.core as cc
from coremesh.testing.sim import simulate

WIDTH = 32  # not a multiple of 128 words


def gather_add(tc_tiling: bool | None, dtype: Any, add: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each subcore gathers rows ``indices`` of its slab of ``x`` into VMEM holding the slab's
    first rows (added to them with ``add``), then writes them out: JAX's ``test_gather_add``."""
    with simulate("TPU7x", 1) as sim:
        subcores = pltpu.get_tpu_info().sparse_core.num_subcores
        lanes = pltpu.get_tpu_info().sparse_core.num_lanes
        shape = (subcores, 64, WIDTH)
        x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape).astype(dtype)
        indices = jnp.arange(lanes, dtype=jnp.int32) * (64 // lanes)

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((subcores, lanes, WIDTH), dtype),
            mesh=plsc.VectorSubcoreMesh(
                core_axis_name="core", subcore_axis_name="subcore", num_cores=1
            ),
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32), pltpu.VMEM((lanes, WIDTH), dtype)],
            compiler_params=pltpu.CompilerParams(use_tc_tiling_on_sc=tc_tiling),
        )
        def kernel(x_ref: Any, i_ref: Any, o_ref: Any, i_vmem: Any, rows: Any) -> None:
            s = lax.axis_index("subcore")
            pltpu.sync_copy(i_ref, i_vmem)
            pltpu.sync_copy(x_ref.at[s, pl.ds(0, lanes)], rows)
            pltpu.sync_copy(x_ref.at[s].at[i_vmem], rows, add=add)
            pltpu.sync_copy(rows, o_ref.at[s])

        got = np.asarray(sim.run(jax.jit(kernel), x, indices))
    xs, idx = np.asarray(x), np.asarray(indices)
    want = xs[:, idx] + xs[:, :lanes] if add else xs[:, idx]
    return got, want


@pytest.mark.parametrize(("dtype", "add"), [(jnp.float32, False), (jnp.float32, True)])
def test_the_sparsecore_tiling_gathers_rows_of_any_width(dtype: Any, add: bool) -> None:
    got, want = gather_add(False, dtype, add)
    np.testing.assert_array_equal(got, want)


def test_the_sparsecore_tiling_gathers_bfloat16_rows() -> None:
    got, want = gather_add(False, jnp.bfloat16, False)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("tc_tiling", [None, True])
def test_the_tensorcore_tiling_refuses_them_as_mosaic_does(tc_tiling: bool | None) -> None:
    with pytest.raises(cc.LayoutError, match=f"rows of {WIDTH} elements"):
        gather_add(tc_tiling, jnp.float32, False)
