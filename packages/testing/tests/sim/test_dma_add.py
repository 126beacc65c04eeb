"""Patch ``dma_add`` on every supported jax line: a DMA with ``add=True`` adds to its destination
(a SparseCore gather-add and scatter-add against numpy, repeated indices accumulating, subcores
scatter-adding into one VMEM_SHARED buffer at once); what Mosaic refuses is refused with its
words. Stock, the interpreter overwrites the destination."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_versions
from coremesh.core.errors import UnsupportedOnChipError
from coremesh.testing.sim import NotSimulatedError, Simulator, UninitializedReadError, simulate

pytestmark = pytest.mark.sim

#: Repeated and out-of-order indices: a scatter-add accumulates the repeats.
IDX = np.asarray([5, 0, 7, 5, 3, 5, 0, 12, 1, 9, 9, 2, 15, 5, 4, 0], np.int32)
SCATTER_ADD_TO_SHARED_ONLY = jax_versions.at_least("0.12.0")

Body = Callable[[Any, Any, Any, Any, Any], None]


def run_one_subcore(sim: Simulator, body: Body, table: Any, rows: Any, shape: Any) -> np.ndarray:
    """``body(t_hbm, r_hbm, i_vmem, o_hbm, scratch)`` on one vector subcore, the indices in
    VMEM; ``scratch`` is (VMEM rows, VMEM_SHARED table-sized)."""

    def kernel(t: Any, r: Any, i_hbm: Any, o: Any, i: Any, v: Any, shared: Any) -> None:
        pltpu.sync_copy(i_hbm, i)
        body(t, r, i, o, (v, shared))

    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
    )
    f = jax.jit(
        pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct(shape, table.dtype),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((len(IDX),), jnp.int32),
                pltpu.VMEM(rows.shape, rows.dtype),
                pltpu.VMEM_SHARED(table.shape, table.dtype),
            ],
        )
    )
    return np.asarray(sim.run(f, table, rows, jnp.asarray(IDX)))


def operands(dtype: Any, row: tuple[int, ...]) -> tuple[Any, Any]:
    """A 16-row table and 16 rows to add, of ``row``-shaped rows (``()``: a 1-D table)."""
    table = jnp.arange(16 * int(np.prod(row)), dtype=dtype).reshape(16, *row) * 3 - 7
    rows = jnp.arange(len(IDX) * int(np.prod(row)), dtype=dtype).reshape(len(IDX), *row) + 1
    return table, rows


def gather_add(t: Any, r: Any, i: Any, o: Any, scratch: Any) -> None:
    v, _ = scratch
    pltpu.sync_copy(r, v)
    pltpu.sync_copy(t.at[i], v, add=True)
    pltpu.sync_copy(v, o)


def scatter_add(t: Any, r: Any, i: Any, o: Any, scratch: Any) -> None:
    v, shared = scratch
    pltpu.sync_copy(t, shared)
    pltpu.sync_copy(r, v)
    pltpu.sync_copy(v, shared.at[i], add=True)
    pltpu.sync_copy(shared, o)


DTYPES_AND_ROWS = [
    (jnp.int32, ()),
    (jnp.float32, ()),
    (jnp.int32, (128,)),
    (jnp.float32, (128,)),
]


@pytest.mark.parametrize(("dtype", "row"), DTYPES_AND_ROWS)
def test_gather_add_adds_the_gathered_rows(dtype: Any, row: tuple[int, ...]) -> None:
    table, rows = operands(dtype, row)
    with simulate("v5p", devices=1) as sim:
        got = run_one_subcore(sim, gather_add, table, rows, rows.shape)
    np.testing.assert_array_equal(got, np.asarray(rows) + np.asarray(table)[IDX])


@pytest.mark.parametrize(("dtype", "row"), DTYPES_AND_ROWS)
def test_scatter_add_accumulates_repeated_indices(dtype: Any, row: tuple[int, ...]) -> None:
    table, rows = operands(dtype, row)
    with simulate("v5p", devices=1) as sim:
        got = run_one_subcore(sim, scatter_add, table, rows, table.shape)
    want = np.asarray(table).copy()
    np.add.at(want, IDX, np.asarray(rows))
    np.testing.assert_array_equal(got, want)


def concurrent_scatter_add(sim: Simulator, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """JAX's test_scatter_add, with repeated indices: subcore 0 fills VMEM_SHARED, every subcore
    scatter-adds its rows into it at once between barriers, subcore 0 copies it out."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)
    subcores, n = mesh.num_subcores, len(IDX)
    x = jnp.arange(subcores * n * 128, dtype=dtype).reshape(subcores, n, 128) % 1000

    @pl.kernel(
        out_type=jax.ShapeDtypeStruct((n, 128), dtype),
        mesh=mesh,
        scratch_types=[
            pltpu.VMEM((n,), jnp.int32),
            pltpu.VMEM((n, 128), dtype),
            pltpu.VMEM_SHARED((n, 128), dtype),
        ],
    )
    def kernel(x_hbm: Any, i_hbm: Any, o_hbm: Any, i: Any, v: Any, shared: Any) -> None:
        s = lax.axis_index("subcore")
        pltpu.sync_copy(i_hbm, i)
        pltpu.sync_copy(x_hbm.at[s], v)

        @pl.when(s == 0)
        def _() -> None:
            pltpu.sync_copy(v, shared)

        plsc.subcore_barrier()
        pltpu.sync_copy(v, shared.at[i], add=True)
        plsc.subcore_barrier()

        @pl.when(s == 0)
        def _() -> None:
            pltpu.sync_copy(shared, o_hbm)

    got = np.asarray(sim.run(jax.jit(kernel), x, jnp.asarray(IDX)))
    xs = np.asarray(x)
    want = xs[0].copy()
    for k in range(subcores):
        np.add.at(want, IDX, xs[k])
    return got, want


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float32])
def test_subcores_scatter_add_into_one_shared_buffer_at_once(dtype: Any) -> None:
    with simulate("v5p", devices=1) as sim:
        got, want = concurrent_scatter_add(sim, dtype)
    np.testing.assert_array_equal(got, want)


def test_an_add_into_memory_nothing_wrote_is_named() -> None:
    """An add reads its destination: fresh VMEM holds stale bytes on the chip."""
    table, rows = operands(jnp.float32, (128,))

    def into_fresh(t: Any, r: Any, i: Any, o: Any, scratch: Any) -> None:
        v, _ = scratch
        pltpu.sync_copy(t.at[i], v, add=True)
        pltpu.sync_copy(v, o)

    with (
        simulate("v5p", devices=1) as sim,
        pytest.raises(UninitializedReadError, match="add=True into unwritten memory") as err,
    ):
        run_one_subcore(sim, into_fresh, table, rows, rows.shape)
    assert "test_dma_add.py" in str(err.value)  # the user's line


def test_scatter_add_into_hbm_is_refused_from_jax_0_12() -> None:
    """jax 0.12's Mosaic scatter-adds into VMEM_SHARED only (ValueError, as JAX's tests expect);
    0.10.2 and 0.11.2 lower one into HBM too, and it adds."""
    table, rows = operands(jnp.float32, (128,))

    def into_hbm(t: Any, r: Any, i: Any, o: Any, scratch: Any) -> None:
        v, _ = scratch
        pltpu.sync_copy(t, o)
        pltpu.sync_copy(r, v)
        pltpu.sync_copy(v, o.at[i], add=True)

    with simulate("v5p", devices=1) as sim:
        if SCATTER_ADD_TO_SHARED_ONLY:
            with pytest.raises(ValueError, match="only supported when the destination is in"):
                run_one_subcore(sim, into_hbm, table, rows, table.shape)
            return
        got = run_one_subcore(sim, into_hbm, table, rows, table.shape)
    want = np.asarray(table).copy()
    np.add.at(want, IDX, np.asarray(rows))
    np.testing.assert_array_equal(got, want)


def test_an_add_without_indices_is_refused_as_mosaic_refuses_it() -> None:
    table, rows = operands(jnp.float32, (128,))

    def whole(t: Any, r: Any, i: Any, o: Any, scratch: Any) -> None:
        v, shared = scratch
        pltpu.sync_copy(r, v)
        pltpu.sync_copy(v, shared, add=True)

    with (
        simulate("v5p", devices=1) as sim,
        pytest.raises(UnsupportedOnChipError, match=r"must \(for now\) specify offsets"),
    ):
        run_one_subcore(sim, whole, table, rows, table.shape)


def test_an_add_between_vmem_refs_is_refused_as_mosaic_refuses_it() -> None:
    table, rows = operands(jnp.float32, (128,))

    def vmem_to_vmem(t: Any, r: Any, i: Any, o: Any, scratch: Any) -> None:
        v, _ = scratch
        pltpu.sync_copy(r, v)
        pltpu.sync_copy(v, v, add=True)

    with (
        simulate("v5p", devices=1) as sim,
        pytest.raises(ValueError, match=r"DMAs with `add=True` are only supported"),
    ):
        run_one_subcore(sim, vmem_to_vmem, table, rows, table.shape)


def tensorcore_add(interpret: Any = False) -> Callable[[Any, Any], Any]:
    """A TensorCore kernel that copies ``x`` onto ``y`` (aliased to the result) with
    ``add=True``."""

    def kernel(x: Any, y: Any, o: Any, sem: Any) -> None:
        del y
        pltpu.async_copy(x, o, sem, add=True).wait()

    f: Callable[[Any, Any], Any] = jax.jit(
        pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)] * 2,
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            scratch_shapes=[pltpu.SemaphoreType.DMA(())],
            input_output_aliases={1: 0},
            interpret=interpret,
        )
    )
    return f


def test_a_tensorcore_add_is_refused_as_mosaic_refuses_it() -> None:
    x = jnp.ones((8, 128), jnp.float32)
    with (
        simulate("v5p", devices=1) as sim,
        pytest.raises(UnsupportedOnChipError, match="DMA with add=True is not supported") as err,
    ):
        sim.run(tensorcore_add(), x, x)
    assert "test_dma_add.py" in str(err.value)  # the user's line


def test_with_the_patch_off_an_add_is_refused() -> None:
    table, rows = operands(jnp.float32, (128,))
    with (
        simulate("v5p", devices=1, disable_patches=["dma_add"]) as sim,
        pytest.raises(NotSimulatedError, match="add=True is not simulated"),
    ):
        run_one_subcore(sim, gather_add, table, rows, rows.shape)


def test_stock_interpreter_overwrites_instead_of_adding() -> None:
    """The upstream gap: jax's interpreter ignores add. When a jax release adds, this fails and
    the patch needs a ``fixed_in``."""
    x = jnp.full((8, 128), 2.0, jnp.float32)
    y = jnp.full((8, 128), 5.0, jnp.float32)
    got = np.asarray(tensorcore_add(pltpu.InterpretParams())(x, y))
    np.testing.assert_array_equal(got, np.asarray(x))  # the chip's SparseCore add: x + y
