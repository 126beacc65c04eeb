"""SparseCore primitives on the simulator: simulated against numpy, or refused clearly."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

import coremesh.core as cc
from coremesh.core import jax_versions
from coremesh.testing.aot.topology import CompileTarget
from coremesh.testing.sim import NotSimulatedError, SimulationFault, simulate

pytestmark = pytest.mark.sim

Body = Callable[[Any, Any, Any, Any], None]


def run_on_subcores(
    chip: str, body: Body, *, layout_passes: bool = False
) -> tuple[np.ndarray, np.ndarray, int]:
    """Each vector subcore w copies its L lanes of x to VMEM, runs body, copies back. Without
    Mosaic's layout passes unless asked, as JAX's own SparseCore tests: they refuse scans,
    all-reduces and (before jax 0.12) masked loads and stores (sim/sc_ops.py)."""
    with simulate(chip=chip, devices=1) as sim:
        info = pltpu.get_tpu_info().sparse_core
        lanes, subcores = info.num_lanes, info.num_subcores
        workers = info.num_cores * subcores
        x = jnp.arange(workers * lanes, dtype=jnp.int32) * 3 - 7

        def kernel(x_hbm: Any, o_hbm: Any, v_in: Any, v_out: Any) -> None:
            w = jax.lax.axis_index("core") * subcores + jax.lax.axis_index("subcore")
            pltpu.sync_copy(x_hbm.at[pl.ds(w * lanes, lanes)], v_in)
            body(v_in, v_out, w, lanes)
            pltpu.sync_copy(v_out, o_hbm.at[pl.ds(w * lanes, lanes)])

        mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")
        f = jax.jit(
            pl.kernel(
                kernel,
                out_type=x,
                mesh=mesh,
                scratch_types=[pltpu.VMEM((lanes,), jnp.int32)] * 2,
                compiler_params=pltpu.CompilerParams(needs_layout_passes=layout_passes),
            )
        )
        got = np.asarray(sim.run(f, x)).reshape(workers, lanes)
        return got, np.asarray(x).reshape(workers, lanes), lanes


def reversed_lanes(lanes: int) -> Any:
    return jnp.arange(lanes, dtype=jnp.int32)[::-1]


@pytest.mark.parametrize("chip", ["v5p", "TPU7x"])
def test_axis_indices_name_every_subcore(chip: str) -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = jnp.full((lanes,), w, jnp.int32)

    got, _, lanes = run_on_subcores(chip, body)
    np.testing.assert_array_equal(got, np.repeat(np.arange(got.shape[0]), lanes).reshape(got.shape))


def test_load_gather() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = plsc.load_gather(v_in, [reversed_lanes(lanes)])

    got, x, _ = run_on_subcores("v5p", body)
    np.testing.assert_array_equal(got, x[:, ::-1])


def test_masked_load_gather_leaves_masked_lanes_uninitialised() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        idx = reversed_lanes(lanes)
        v_out[...] = plsc.load_gather(v_in, [idx], mask=idx % 2 == 0)

    got, x, lanes = run_on_subcores("v5p", body)
    rev = x[:, ::-1]
    even_index = (np.arange(lanes)[::-1] % 2) == 0
    np.testing.assert_array_equal(got[:, even_index], rev[:, even_index])
    assert (got[:, ~even_index] == np.iinfo(np.int32).max).all()


def test_store_scatter_with_mask_keeps_unselected_lanes() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = jnp.zeros((lanes,), jnp.int32)
        idx = reversed_lanes(lanes)
        plsc.store_scatter(v_out, [idx], v_in[...], mask=jnp.arange(lanes) < lanes // 2)

    got, x, lanes = run_on_subcores("v5p", body)
    want = np.zeros_like(x)
    half = lanes // 2
    want[:, lanes - half :] = x[:, :half][:, ::-1]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("nested", [False, True])
def test_a_scatter_that_writes_every_lane_of_fresh_memory_is_no_read_of_it(nested: bool) -> None:
    """JAX's test_store_scatter: int32 lanes scattered by a permutation into unwritten VMEM. The
    rule reads the whole ref to keep what it does not store; that read is no use of unwritten
    memory, also inside a loop, where the rule's equations carry the user's traceback (it was
    an UninitializedReadError there)."""

    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        def scatter() -> None:
            plsc.store_scatter(v_out, [reversed_lanes(lanes)], v_in[...])

        if nested:
            pl.loop(0, 1)(lambda _: scatter())
        else:
            scatter()

    got, x, _ = run_on_subcores("v5p", body)
    np.testing.assert_array_equal(got, x[:, ::-1])


def test_addupdate_scatter_accumulates_duplicate_indices() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = jnp.zeros((lanes,), jnp.int32)
        idx = reversed_lanes(lanes)
        plsc.addupdate_scatter(v_out, [idx], v_in[...])
        plsc.addupdate_scatter(v_out, [idx // 2], v_in[...])

    got, x, lanes = run_on_subcores("v5p", body)
    want = x[:, ::-1].copy()
    for lane in range(lanes):  # hand count of the second scatter
        want[:, (lanes - 1 - lane) // 2] += x[:, lane]
    np.testing.assert_array_equal(got, want)


def test_parallel_loop_with_a_carry() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        @plsc.parallel_loop(0, lanes, step=4, carry=jnp.int32(0))
        def total(i: Any, c: Any) -> Any:
            v_out[pl.ds(i, 4)] = v_in[pl.ds(i, 4)] * 2 + jax.lax.axis_index("subcore")
            return c + i

        v_out[pl.ds(0, 1)] = jnp.full((1,), total, jnp.int32)

    # Four-lane loads and stores: only the layout passes take less than a whole register.
    got, x, lanes = run_on_subcores("v5p", body, layout_passes=True)
    want = x * 2 + (np.arange(x.shape[0]) % 16)[:, None]
    want[:, 0] = sum(range(0, lanes, 4))
    np.testing.assert_array_equal(got, want)


def test_out_of_range_gather_index_raises() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = plsc.load_gather(v_in, [reversed_lanes(lanes) + 1])  # the line named

    with pytest.raises(SimulationFault) as caught:
        run_on_subcores("v5p", body)
    fault = caught.value
    assert "load_gather: lane 0 indexes 8 in dimension 0" in str(fault)
    assert isinstance(fault.__cause__, IndexError)
    line = body.__code__.co_firstlineno + 1
    assert fault.location is not None and f"test_sparsecore.py:{line} " in fault.location
    assert "subcore" in str(fault) and fault.kernel is not None


def test_bitcast() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        as_float = plsc.bitcast(v_in[...], jnp.float32)
        v_out[...] = plsc.bitcast(jnp.abs(as_float), jnp.int32)  # clears the sign bit

    # plsc.bitcast is pltpu.bitcast(dim=-1) from jax 0.12, which the interpreter runs; before
    # it, patch sparsecore_bitcast runs it as that rule does (tests/sim/test_sparsecore_bitcast.py).
    got, x, _ = run_on_subcores("v5p", body)
    np.testing.assert_array_equal(got, x & 0x7FFFFFFF)


def indexed_dma(
    sim: Any,
    body: Callable[[Any, Any, Any, Any, Any, Any], None],
    table: Any,
    idx: Any,
    out_rows: int,
) -> np.ndarray:
    """Run ``body(t_hbm, i_vmem, o_hbm, rows, sem, lanes)`` on one vector subcore, the indices
    already in VMEM and the table copied to the output first (so a scatter shows what it left)."""
    n, cols = idx.shape[0], table.shape[1]

    def kernel(t_hbm: Any, i_hbm: Any, o_hbm: Any, i_vmem: Any, rows: Any, sem: Any) -> None:
        pltpu.sync_copy(i_hbm, i_vmem)
        body(t_hbm, i_vmem, o_hbm, rows, sem, n)

    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
    )
    f = jax.jit(
        pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct((out_rows, cols), table.dtype),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((2, n), jnp.int32),
                pltpu.VMEM((n, cols), table.dtype),
                pltpu.SemaphoreType.DMA(()),
            ],
        )
    )
    return np.asarray(sim.run(f, table, jnp.stack([idx, idx[::-1]])))


def test_indexed_dma_gathers_rows() -> None:
    """sync_copy(table.at[idx_ref], rows), async with its own wait, from a view of the index
    buffer, and with a column window: the rows numpy picks."""
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.arange(64 * 256, dtype=jnp.float32).reshape(64, 256)
        idx = jnp.asarray([5, 0, 63, 5, 17, 2, 40, 9, 33, 1, 62, 8, 8, 30, 3, 11], jnp.int32)

        def whole(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[i.at[0]], rows)
            pltpu.sync_copy(rows, o)

        got = indexed_dma(sim, whole, table, idx, 16)
        np.testing.assert_array_equal(got, np.asarray(table)[np.asarray(idx)])

        def waited(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            window = pl.ds(128, 128)
            copy = pltpu.make_async_copy(t.at[i.at[1], window], rows.at[:, pl.ds(0, 128)], sem)
            copy.start()
            copy.wait()
            pltpu.sync_copy(t.at[pl.ds(0, n)], o)  # the whole output is written
            pltpu.sync_copy(rows.at[:, pl.ds(0, 128)], o.at[:, pl.ds(0, 128)])

        got = indexed_dma(sim, waited, table, idx, 16)
        want = np.asarray(table)[np.asarray(idx)[::-1], 128:]
        np.testing.assert_array_equal(got[:, :128], want)
        np.testing.assert_array_equal(got[:, 128:], np.asarray(table)[:16, 128:])


def test_indexed_dma_scatters_rows() -> None:
    """sync_copy(rows, out.at[idx_ref]): row k lands at idx[k], the rest is untouched."""
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.arange(32 * 128, dtype=jnp.int32).reshape(32, 128)
        idx = jnp.asarray([31, 4, 0, 17, 9, 22, 3, 12], jnp.int32)

        def scatter(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t, o)
            pltpu.sync_copy(t.at[pl.ds(0, n)], rows)
            pltpu.sync_copy(rows, o.at[i.at[0]])

        got = indexed_dma(sim, scatter, table, idx, 32)
        want = np.asarray(table).copy()
        want[np.asarray(idx)] = np.asarray(table)[:8]
        np.testing.assert_array_equal(got, want)


def test_indexed_dma_out_of_range_raises() -> None:
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.zeros((16, 128), jnp.float32)
        idx = jnp.asarray([0, 1, 2, 16, 4, 5, 6, 7], jnp.int32)

        def gather(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[i.at[0]], rows)
            pltpu.sync_copy(rows, o)

        with pytest.raises(SimulationFault, match="lane 3 indexes 16 in dimension 0") as caught:
            indexed_dma(sim, gather, table, idx, 8)
    # pltpu.sync_copy's helpers use up the 10 frames jax keeps of a traceback before the
    # user's line: the fault names the kernel's body instead
    assert caught.value.location is not None
    assert "the kernel's body" in caught.value.location
    assert "test_sparsecore.py:" in caught.value.location


@pytest.mark.parametrize(
    ("dtype", "cols", "error", "match"),
    [
        (jnp.bfloat16, 256, cc.UnsupportedOnChipError, "moves 32-bit elements only"),
        (jnp.float32, 64, cc.LayoutError, "rows of 64 elements"),
    ],
)
def test_indexed_dma_mosaic_refuses_is_refused(
    dtype: Any, cols: int, error: type[Exception], match: str
) -> None:
    """Mosaic takes indexed DMAs of 32-bit rows of whole 128-word tiles only; neither a bfloat16
    table nor 64-element rows run in the simulator either."""
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.zeros((16, cols), dtype)
        idx = jnp.arange(8, dtype=jnp.int32)

        def gather(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[i.at[0]], rows)
            pltpu.sync_copy(rows, o)

        with pytest.raises(error, match=match) as info:
            indexed_dma(sim, gather, table, idx, 8)
        assert info.value.chip == "v5p"  # type: ignore[attr-defined]


def test_a_transform_after_the_indexer_is_refused_as_mosaic_refuses_it() -> None:
    """JAX's test_invalid_gather_1d_with_extra_transforms: Mosaic refuses a view of the gathered
    rows (NotImplementedError); the interpreter crashed on it ('ReshapeTransform' ... 'indices')."""
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.zeros((16, 128), jnp.float32)
        idx = jnp.arange(8, dtype=jnp.int32)

        def reshaped(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[i.at[0]].reshape(n * 128), rows.reshape(n * 128))
            pltpu.sync_copy(rows, o)

        with pytest.raises(NotImplementedError, match="cannot have any transforms following"):
            indexed_dma(sim, reshaped, table, idx, 8)


def test_dma_with_add_and_no_indices_is_refused_as_mosaic_refuses_it() -> None:
    """Mosaic adds in a gather or scatter only (patch dma_add, tests/sim/test_dma_add.py); jax
    0.12's scatter-adds into VMEM_SHARED only, so this one into HBM is refused before its lack of
    indices is."""
    refused = (
        "only supported when the destination is in VMEM_SHARED, got HBM"
        if jax_versions.at_least("0.12.0")
        else r"must \(for now\) specify offsets"
    )
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.ones((16, 128), jnp.float32)
        idx = jnp.arange(8, dtype=jnp.int32)

        def add(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[pl.ds(0, n)], rows)
            pltpu.async_copy(rows, o.at[pl.ds(0, n)], sem, add=True).wait()

        with pytest.raises(cc.UnsupportedOnChipError, match=refused):
            indexed_dma(sim, add, table, idx, 8)


def test_index_vector_on_another_dim_is_refused() -> None:
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.zeros((8, 128), jnp.float32)
        idx = jnp.arange(8, dtype=jnp.int32)

        def columns(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[pl.ds(0, 8), i.at[0]], rows)
            pltpu.sync_copy(rows, o)

        with pytest.raises(NotSimulatedError, match="only a 1-D vector of indices"):
            indexed_dma(sim, columns, table, idx, 8)


def test_row_by_row_gather_is_simulated() -> None:
    """The refusal's suggested rewrite: one DMA per row, indices read from SMEM."""
    with simulate(chip="v5p", devices=1) as sim:
        rows_n = 8
        table = jnp.arange(64 * 16, dtype=jnp.float32).reshape(64, 16)
        idx = jnp.asarray([5, 0, 63, 5, 17, 2, 40, 9], jnp.int32)

        def kernel(t_hbm: Any, i_hbm: Any, o_hbm: Any, i_smem: Any, rows: Any) -> None:
            pltpu.sync_copy(i_hbm, i_smem)

            @pl.loop(0, rows_n)
            def _(r: Any) -> None:
                pltpu.sync_copy(t_hbm.at[pl.ds(i_smem[r], 1)], rows.at[pl.ds(r, 1)])

            pltpu.sync_copy(rows, o_hbm)

        mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=1)
        f = jax.jit(
            pl.kernel(
                kernel,
                out_type=jax.ShapeDtypeStruct((rows_n, 16), jnp.float32),
                mesh=mesh,
                scratch_types=[
                    pltpu.SMEM((rows_n,), jnp.int32),
                    pltpu.VMEM((rows_n, 16), jnp.float32),
                ],
            )
        )
        got = np.asarray(sim.run(f, table, idx))
        np.testing.assert_array_equal(got, np.asarray(table)[np.asarray(idx)])


def one_subcore() -> Any:
    return plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
    )


def test_indexed_dma_with_a_count_known_at_run_time() -> None:
    """JAX's test_gather_1d_with_dynamically_sized_ref: an index view idx_ref.at[pl.ds(0, n)]
    with n traced, gathering into and scattering from rows.at[pl.ds(0, n)] (each index read in
    its turn); the interpreter crashed on the dynamically shaped index vector (DShapedArray)."""
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.arange(32 * 128, dtype=jnp.int32).reshape(32, 128)
        idx = jnp.asarray([31, 4, 0, 17, 9, 22, 3, 12], jnp.int32)
        count = 5  # the kernel computes it from its core index: known when it runs

        def gather(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            m = jax.lax.axis_index("core") + count
            pltpu.sync_copy(t.at[pl.ds(0, n)], rows)  # every row written before the gather
            pltpu.sync_copy(t.at[i.at[0, pl.ds(0, m)]], rows.at[pl.ds(0, m)])
            pltpu.sync_copy(rows, o)

        got = indexed_dma(sim, gather, table, idx, 8)
        want = np.asarray(table)[:8].copy()
        want[:count] = np.asarray(table)[np.asarray(idx)[:count]]
        np.testing.assert_array_equal(got, want)

        def scatter(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            m = jax.lax.axis_index("core") + count
            pltpu.sync_copy(t, o)
            pltpu.sync_copy(t.at[pl.ds(0, n)], rows)
            pltpu.sync_copy(rows.at[pl.ds(0, m)], o.at[i.at[0, pl.ds(0, m)]])

        got = indexed_dma(sim, scatter, table, idx, 32)
        want = np.asarray(table).copy()
        want[np.asarray(idx)[:count]] = np.asarray(table)[:count]
        np.testing.assert_array_equal(got, want)


def filtered_dma(kind: str, ignored: int, rows: int) -> Any:
    """One vector subcore's indexed DMA by ``plsc.Indices(idx, ignored_value=ignored)``: a
    ``gather`` (async, with its wait) or ``gather_add`` of ``table[idx]`` into VMEM rows that
    start as the table's first rows, or a ``scatter`` of those rows into a copy of the table."""

    def kernel(t_hbm: Any, i_hbm: Any, o_hbm: Any, i_vmem: Any, buf: Any, sem: Any) -> None:
        pltpu.sync_copy(i_hbm, i_vmem)
        idx = plsc.Indices(i_vmem, ignored_value=ignored)
        pltpu.sync_copy(t_hbm.at[pl.ds(0, rows)], buf)
        if kind == "scatter":
            pltpu.sync_copy(t_hbm, o_hbm)
            pltpu.sync_copy(buf, o_hbm.at[idx])
            return
        if kind == "gather":
            pltpu.async_copy(t_hbm.at[idx], buf, sem).wait()
        else:
            pltpu.sync_copy(t_hbm.at[idx], buf, add=True)
        pltpu.sync_copy(buf, o_hbm)

    def run(table: Any, idx: Any) -> Any:
        out = table.shape if kind == "scatter" else (rows, table.shape[1])
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        return pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct(out, table.dtype),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((rows,), jnp.int32),
                pltpu.VMEM((rows, table.shape[1]), table.dtype),
                pltpu.SemaphoreType.DMA(()),
            ],
        )(table, idx)

    return run


@pytest.mark.parametrize("kind", ["gather", "gather_add", "scatter"])
@pytest.mark.parametrize("ignored", [-1, 4])
def test_indices_with_an_ignored_value_move_nothing_for_it(kind: str, ignored: int) -> None:
    """JAX's test_gather_1d_with_filter, for rows and for the three kinds: an index equal to
    the ignored value leaves its row as it was (in range or not), the others move as numpy
    says, and the DMA's wait still ends. libtpu compiles each for v5p (Mosaic's
    ``enqueue_indirect_dma`` with an ``offset_filter``); the simulator refused them before
    2026-12-06."""
    table = jnp.arange(32 * 128, dtype=jnp.int32).reshape(32, 128)
    idx = jnp.asarray([31, ignored, 0, 17, ignored, 22, 3, 12], jnp.int32)
    with CompileTarget.for_chip("v5p", devices=1).activate():
        jax.jit(filtered_dma(kind, ignored, 8)).trace(
            jax.ShapeDtypeStruct(table.shape, table.dtype), jax.ShapeDtypeStruct((8,), jnp.int32)
        ).lower().compile()
    with simulate(chip="v5p", devices=1) as sim:
        got = np.asarray(sim.run(jax.jit(filtered_dma(kind, ignored, 8)), table, idx))
    t, i = np.asarray(table), np.asarray(idx)
    keep = i != ignored
    if kind == "scatter":
        want = t.copy()
        want[i[keep]] = t[:8][keep]
    else:
        want = t[:8].copy()
        picked = t[np.where(keep, i, 0)]
        want = np.where(keep[:, None], picked + want if kind == "gather_add" else picked, want)
    np.testing.assert_array_equal(got, want)


Copy = Callable[[Any, Any, Any, Any], None]


@pytest.mark.parametrize(
    ("copy", "idx_shape", "idx_in_vmem", "kind", "match"),
    [
        (
            lambda t, i, rows, o: pltpu.sync_copy(t.at[i], o),
            (8,),
            True,
            NotImplementedError,
            "Scatter/gather via `pltpu.async_copy` from HBM to HBM is not supported",
        ),
        (
            lambda t, i, rows, o: pltpu.sync_copy(t.at[i], rows),
            (8,),
            False,
            NotImplementedError,
            "Indices for scatter/gather via `pltpu.async_copy` must be in VMEM, got HBM",
        ),
        (
            lambda t, i, rows, o: pltpu.sync_copy(t.at[i], rows),
            (1, 8),
            True,
            NotImplementedError,
            "Only 1D indices are supported by scatter/gather via `pltpu.async_copy` on "
            "SparseCore, got rank 2",
        ),
        (
            lambda t, i, rows, o: pltpu.sync_copy(t.at[i], rows.at[i]),
            (8,),
            True,
            ValueError,
            "Only the source ref can be indexed when doing a gather",
        ),
    ],
    ids=["hbm_to_hbm", "indices_in_hbm", "2d_indices", "both_sides"],
)
def test_indexed_dmas_mosaic_refuses_are_refused_with_its_words(
    copy: Copy, idx_shape: tuple[int, ...], idx_in_vmem: bool, kind: type[Exception], match: str
) -> None:
    """JAX's test_invalid_gather_1d_memory_space, _offsets_memory_space, _nd_indices and
    _with_indexed_destination: Mosaic's SparseCore lowering refuses these (sc_lowering.py
    _prepare_dma_refs), with an error of the type JAX's tests expect. The simulator ran the
    first, read the HBM indices with a raw interpreter ValueError, and refused the others as
    unsimulated."""
    with simulate(chip="v5p", devices=1) as sim:
        rows_shape = (*idx_shape, 128)

        def kernel(t_hbm: Any, i_hbm: Any, o_hbm: Any, i_vmem: Any, rows: Any) -> None:
            index = i_hbm
            if idx_in_vmem:
                pltpu.sync_copy(i_hbm, i_vmem)
                index = i_vmem
            copy(t_hbm, index, rows, o_hbm)

        f = jax.jit(
            pl.kernel(
                kernel,
                out_type=jax.ShapeDtypeStruct(rows_shape, jnp.float32),
                mesh=one_subcore(),
                scratch_types=[
                    pltpu.VMEM(idx_shape, jnp.int32),
                    pltpu.VMEM(rows_shape, jnp.float32),
                ],
            )
        )
        table = jnp.zeros((16, 128), jnp.float32)
        with pytest.raises(cc.UnsupportedOnChipError, match=re.escape(match)) as info:
            sim.run(f, table, jnp.zeros(idx_shape, jnp.int32))
        assert isinstance(info.value, kind)
        assert info.value.chip == "v5p"


def test_select_ref_dmas_copy_from_the_chosen_ref() -> None:
    """JAX's test_select_ref: pl.select_ref(k, ...) as a DMA's source and its semaphore, k traced:
    the copy of the k-th ref, on the k-th semaphore (the interpreter raised NotImplementedError
    on SelectTransform). An index outside the first n-1 takes the last ref, as Mosaic's nested
    scf.if does (JAX's test picks among 2 semaphores with k up to 3): it raised IndexError."""
    with simulate(chip="v5p", devices=1) as sim:
        base = jnp.arange(8 * 128, dtype=jnp.int32).reshape(8, 128)
        parts = [base + 10_000 * k for k in range(3)]

        def kernel(last: int) -> Any:
            def body(a: Any, b: Any, c: Any, o: Any, sems: Any) -> None:
                @pl.loop(0, last)
                def _(k: Any) -> None:
                    pltpu.async_copy(
                        pl.select_ref(k, a, b, c),
                        o.at[pl.ds(8 * (2 - k), 8)],
                        pl.select_ref(k % 2, sems.at[0], sems.at[1]),
                    ).wait()

            return jax.jit(
                pl.kernel(
                    body,
                    out_type=jax.ShapeDtypeStruct((24, 128), jnp.int32),
                    mesh=one_subcore(),
                    scratch_types=[pltpu.SemaphoreType.DMA((2,))],
                )
            )

        got = np.asarray(sim.run(kernel(3), *parts))
        np.testing.assert_array_equal(got, np.concatenate([np.asarray(p) for p in parts[::-1]]))

        def past(a: Any, b: Any, o: Any, sems: Any) -> None:
            @pl.loop(0, 5)
            def _(k: Any) -> None:
                pltpu.async_copy(
                    pl.select_ref(k - 1, a, b),  # -1, 0, 1, 2, 3: b a b b b
                    o.at[pl.ds(8 * k, 8)],
                    pl.select_ref(k, sems.at[0], sems.at[1]),  # 0 1 1 1 1
                ).wait()

            pltpu.sync_copy(pl.select_ref(7, a, b), o.at[pl.ds(40, 8)])  # a static index: b

        f = jax.jit(
            pl.kernel(
                past,
                out_type=jax.ShapeDtypeStruct((48, 128), jnp.int32),
                mesh=one_subcore(),
                scratch_types=[pltpu.SemaphoreType.DMA((2,))],
            )
        )
        got = np.asarray(sim.run(f, parts[0], parts[1]))
        a, b = np.asarray(parts[0]), np.asarray(parts[1])
        np.testing.assert_array_equal(got, np.concatenate([b, a, b, b, b, b]))


def test_scratch_in_vmem_tied_to_the_kernel_mesh() -> None:
    """JAX's test_addupdate_scatter_core_memory_space: pltpu.VMEM(...) @ mesh, as a kernel's
    scratch and in run_scoped, is the subcore's VMEM (the interpreter raised KeyError:
    VMEM@SC_VECTOR_SUBCORE)."""
    with simulate(chip="v5p", devices=1) as sim:
        mesh = one_subcore()
        x = jnp.arange(8, dtype=jnp.int32) * 3 - 5

        def kernel(x_hbm: Any, o_hbm: Any, scratch: Any) -> None:
            pltpu.sync_copy(x_hbm, scratch)
            plsc.addupdate_scatter(scratch, [jnp.arange(8)[::-1]], jnp.arange(8, dtype=jnp.int32))

            def scoped(inner: Any) -> None:
                inner[...] = scratch[...] * 2
                pltpu.sync_copy(inner, o_hbm)

            pl.run_scoped(scoped, pltpu.VMEM((8,), jnp.int32) @ mesh)

        f = jax.jit(
            pl.kernel(
                kernel,
                out_type=x,
                mesh=mesh,
                scratch_types=[pltpu.VMEM((8,), jnp.int32) @ mesh],
                compiler_params=pltpu.CompilerParams(needs_layout_passes=False),
            )
        )
        got = np.asarray(sim.run(f, x))
        np.testing.assert_array_equal(got, (np.asarray(x) + np.arange(8)[::-1]) * 2)


def test_a_row_load_through_a_bitcast_view() -> None:
    """JAX's test_load_from_bitcast: an integer index on the second-minor axis after
    ref.bitcast (refused before: 'an index on the second-minor axis after ref.bitcast'). The
    same width reinterprets the row; int16 rows 2 and 3 make int32 row 1, row 2 in the low
    bits."""
    with simulate(chip="v5p", devices=1) as sim:
        x = jnp.arange(16, dtype=jnp.float32).reshape(2, 8) - 3.5
        p = (jnp.arange(32, dtype=jnp.int32) * 2999 - 40000).astype(jnp.int16).reshape(4, 8)

        def kernel(x_hbm: Any, p_hbm: Any, o_hbm: Any, w_hbm: Any, *v: Any) -> None:
            xv, pv, ov, wv = v
            pltpu.sync_copy(x_hbm, xv)
            pltpu.sync_copy(p_hbm, pv)
            ov[...] = xv.bitcast(jnp.uint32)[1]
            wv[...] = pv.bitcast(jnp.int32)[1]
            pltpu.sync_copy(ov, o_hbm)
            pltpu.sync_copy(wv, w_hbm)

        out = (jax.ShapeDtypeStruct((8,), jnp.uint32), jax.ShapeDtypeStruct((8,), jnp.int32))
        f = jax.jit(
            pl.kernel(
                kernel,
                out_type=out,
                mesh=one_subcore(),
                scratch_types=[
                    pltpu.VMEM((2, 8), jnp.float32),
                    pltpu.VMEM((4, 8), jnp.int16),
                    pltpu.VMEM((8,), jnp.uint32),
                    pltpu.VMEM((8,), jnp.int32),
                ],
            )
        )
        got_x, got_p = (np.asarray(a) for a in sim.run(f, x, p))
        np.testing.assert_array_equal(got_x, np.asarray(x)[1].view(np.uint32))
        low, high = (np.asarray(p)[r].view(np.uint16).astype(np.uint32) for r in (2, 3))
        np.testing.assert_array_equal(got_p, (low | (high << 16)).view(np.int32))


def lane_keys(v: Any) -> Any:
    """Each subcore's lanes as small keys with duplicates and negatives (numpy: ``keys_of``)."""
    return (v * 7919) % 13 - 6


def keys_of(x: np.ndarray) -> np.ndarray:
    return (x * 7919) % 13 - 6


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_sort_key_val_is_stable_with_invalid_lanes_last(masked: bool, descending: bool) -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        keys = lane_keys(v_in[...])
        values = jnp.arange(lanes, dtype=jnp.int32)
        mask = keys % 3 != 0 if masked else None
        out = plsc.sort_key_val(keys, values, mask=mask, descending=descending)
        valid = out[2].astype(jnp.int32) if masked else 0
        v_out[...] = (out[0] * 64 + out[1]) * 2 + valid

    got, x, lanes = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        keys = keys_of(row)
        mask = keys % 3 != 0 if masked else np.ones(lanes, bool)
        order_key = np.where(mask, -keys if descending else keys, 0)
        order = np.lexsort((np.arange(lanes), order_key, ~mask))  # last key sorts first
        want = (keys[order] * 64 + order) * 2 + (np.arange(lanes) < mask.sum() if masked else 0)
        np.testing.assert_array_equal(got_row, want)


@pytest.mark.parametrize("op", ["cumsum", "cummax", "cummin"])
def test_masked_scans_run_over_the_valid_lanes(op: str) -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        keys = lane_keys(v_in[...])
        mask = keys % 2 == 0
        if op == "cummin":  # no public plsc.cummin; its primitive is jax's own
            from jax._src.pallas.mosaic import sc_primitives

            v_out[...] = sc_primitives.masked_cummin_p.bind(keys, mask)
        else:
            v_out[...] = getattr(plsc, op)(keys, mask=mask)

    got, x, _ = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        keys, mask = keys_of(row), keys_of(row) % 2 == 0
        if op == "cumsum":
            want = np.cumsum(np.where(mask, keys, 0))
        else:
            pick = np.maximum if op == "cummax" else np.minimum
            fill = np.iinfo(np.int32).min if op == "cummax" else np.iinfo(np.int32).max
            running = pick.accumulate(np.where(mask, keys, fill))
            want = np.where(np.cumsum(mask) > 0, running, keys)  # before a valid lane: itself
        np.testing.assert_array_equal(got_row, want)


def test_a_cumsum_over_two_axes_is_refused_as_mosaic_refuses_it() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = jnp.cumsum(v_in[...].reshape(2, lanes // 2), axis=0).reshape(-1)

    with pytest.raises(cc.UnsupportedOnChipError, match="must be rank 1"):
        run_on_subcores("v5p", body)


@pytest.mark.parametrize("op", ["all_reduce_population_count", "all_reduce_ffs"])
def test_mask_all_reduce_fills_every_lane(op: str) -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = getattr(plsc, op)(lane_keys(v_in[...]) > 3)

    got, x, lanes = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        mask = keys_of(row) > 3
        want = (
            np.count_nonzero(mask)
            if op == "all_reduce_population_count"
            else (int(np.argmax(mask)) if mask.any() else lanes)
        )
        np.testing.assert_array_equal(got_row, np.full(lanes, want))


def test_mask_all_reduce_with_a_packed_reduce_is_refused() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        # A mask of 2 x lanes 16-bit values, reduced by 2 to one int32 register.
        halves = plsc.bitcast(v_in[...], jnp.int16)
        v_out[...] = plsc.all_reduce_ffs(halves > 0, reduce=2)

    with pytest.raises(NotSimulatedError, match="reduce=2"):
        run_on_subcores("v5p", body)


def test_store_compressed_writes_the_true_lanes_first_and_nothing_else() -> None:
    """The true lanes of x, in lane order, go to v_out[0], v_out[1], ...; the rest of the ref
    keeps what it held."""

    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        x = v_in[...]
        v_out[...] = jnp.full((lanes,), -1, jnp.int32)
        plsc.store_compressed(v_out.at[...], x, mask=lane_keys(x) > 0)

    got, x, lanes = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        kept = row[keys_of(row) > 0]
        want = np.full(lanes, -1)
        want[: kept.size] = kept
        np.testing.assert_array_equal(got_row, want)


def test_addupdate_compressed_reads_and_adds_only_the_first_count_lanes() -> None:
    """Only the first count(mask) elements are read: the others were never written (on the
    first subcore: the interpreter's scratch then holds what the subcore before left), and an
    integer read of them would raise."""

    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        x = v_in[...]
        lane = jnp.arange(lanes)
        plsc.store_compressed(v_out.at[...], x * 10, mask=lane < 3)
        plsc.addupdate_compressed(v_out.at[...], x, mask=(lane == 1) | (lane >= lanes - 2))

    got, x, lanes = run_on_subcores("v5p", body)
    np.testing.assert_array_equal(got[:, :3], x[:, :3] * 10 + x[:, [1, lanes - 2, lanes - 1]])


def test_addupdate_adds_to_every_lane_of_a_view() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = v_in[...]
        half = pl.ds(lanes // 2, lanes // 2)
        plsc.addupdate(v_out.at[...], v_in[...] * 2)
        plsc.addupdate(v_out.at[half], jnp.full((lanes // 2,), 1000, jnp.int32))

    # Half a register: only the layout passes take less than a whole one.
    got, x, lanes = run_on_subcores("v5p", body, layout_passes=True)
    want = x * 3
    want[:, lanes // 2 :] += 1000
    np.testing.assert_array_equal(got, want)


def test_load_expanded_puts_the_ith_element_in_the_ith_true_lane() -> None:
    """Lane j gets ref[number of true lanes before j] where the mask is true; false lanes hold
    the uninitialised value. Only the first count(mask) elements are read: the rest of the
    scratch read from was never written (an integer read of it would raise). The view is a
    whole register: without the layout passes Mosaic loads no less, and with them it refuses
    the count's reduction."""

    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        lane = jnp.arange(lanes)
        mask = lane_keys(v_in[...]) % 2 == 0
        count = plsc.all_reduce_population_count(mask)
        src = v_out.at[pl.ds(0, lanes)]
        plsc.store_compressed(src, v_in[...], mask=lane < count)
        v_out[...] = plsc.load_expanded(src, mask=mask)

    got, x, lanes = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        mask = keys_of(row) % 2 == 0
        want = np.full(lanes, np.iinfo(np.int32).max)  # the interpreter's uninitialised int
        want[mask] = row[: mask.sum()]
        np.testing.assert_array_equal(got_row, want)


def test_store_compressed_to_hbm_is_refused_as_mosaic_refuses_it() -> None:
    with simulate(chip="v5p", devices=1) as sim:

        def kernel(o_hbm: Any) -> None:
            plsc.addupdate(o_hbm.at[...], jnp.ones((8,), jnp.int32))

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        f = jax.jit(pl.kernel(kernel, out_type=jnp.zeros(8, jnp.int32), mesh=mesh))
        with pytest.raises(cc.UnsupportedOnChipError, match="Swap does not support storing to HBM"):
            sim.run(f)


def run_vector(
    body: Callable[..., Any], *inputs: Any, out: Any, layout_passes: bool = False
) -> Any:
    """``body(*input values)`` on one vector subcore; its results (shapes of ``out``) back.
    ``plsc.pack`` needs ``needs_layout_passes=False`` (from jax 0.11: Mosaic refuses it else)."""
    with simulate(chip="v5p", devices=1) as sim:
        outs = jax.tree.leaves(out)
        n_in = len(inputs)

        def kernel(*refs: Any) -> None:
            hbm_in, hbm_out = refs[:n_in], refs[n_in : n_in + len(outs)]
            vmem_in, vmem_out = refs[n_in + len(outs) : 2 * n_in + len(outs)], refs[-len(outs) :]
            for h, v in zip(hbm_in, vmem_in, strict=True):
                pltpu.sync_copy(h, v)
            results = jax.tree.leaves(body(*(v[...] for v in vmem_in)))
            for r, v, h in zip(results, vmem_out, hbm_out, strict=True):
                v[...] = r
                pltpu.sync_copy(v, h)

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        scratch = [pltpu.VMEM(a.shape, a.dtype) for a in (*inputs, *outs)]
        f = jax.jit(
            pl.kernel(
                kernel,
                out_type=tuple(outs),
                mesh=mesh,
                scratch_types=scratch,
                compiler_params=pltpu.CompilerParams(needs_layout_passes=layout_passes),
            )
        )
        return [np.asarray(o) for o in sim.run(f, *inputs)]


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_pack_layouts_and_conversions(dtype: Any) -> None:
    """INTERLEAVED is [a0, b0, a1, b1, ...], COMPRESSED is a then b; float32 rounds to the
    nearest even bfloat16, int32 keeps its low 16 bits (unpack sign-extends them)."""
    import ml_dtypes

    lanes = 8
    a: np.ndarray
    b: np.ndarray
    narrow: Any
    wide: Any
    if dtype == np.float32:
        a = np.arange(lanes, dtype=np.float32) * np.float32(1.00390625 + 2.0**-9) - 3
        b = np.float32(1 + 2.0**-8) * np.arange(1, lanes + 1, dtype=np.float32) * 100
        narrow, wide = ml_dtypes.bfloat16, np.float32
    else:
        a = np.arange(lanes, dtype=np.int32) * 40000 - 70000
        b = -np.arange(lanes, dtype=np.int32) * 123457
        narrow, wide = np.int16, np.int32
    a16 = a.astype(narrow).astype(wide)
    b16 = b.astype(narrow).astype(wide)
    assert (a16 != a).any() and (b16 != b).any()  # the data needs rounding or truncating
    inter, comp = plsc.PackFormat.INTERLEAVED, plsc.PackFormat.COMPRESSED

    def body(x: Any, y: Any) -> Any:
        inter_ab = plsc.pack(x, y, format=inter)
        comp_ab = plsc.pack(x, y, format=comp)
        # Unpacking in the other format shows where pack put each value.
        return (
            *plsc.unpack(inter_ab.reshape(lanes, 2), format=comp),
            *plsc.unpack(comp_ab, format=comp),
        )

    spec = jax.ShapeDtypeStruct((lanes,), wide)
    got = run_vector(body, jnp.asarray(a), jnp.asarray(b), out=(spec,) * 4)
    interleaved = np.stack([a16, b16], axis=1).reshape(-1)
    np.testing.assert_array_equal(got[0], interleaved[:lanes])
    np.testing.assert_array_equal(got[1], interleaved[lanes:])
    np.testing.assert_array_equal(got[2], a16)
    np.testing.assert_array_equal(got[3], b16)


def test_pack_to_another_type_is_refused() -> None:
    def body(x: Any) -> Any:
        ab = plsc.pack(x, x, format=plsc.PackFormat.INTERLEAVED, preferred_element_type=jnp.int16)
        return plsc.unpack(ab, format=plsc.PackFormat.INTERLEAVED)

    x = jnp.arange(8, dtype=jnp.float32)
    spec = jax.ShapeDtypeStruct((8,), jnp.int32)
    with pytest.raises(NotSimulatedError, match=r"plsc\.pack from float32 to int16"):
        run_vector(body, x, out=(spec, spec))


def scan_count_reference(x: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts, last = np.ones(x.size, np.int32), np.zeros(x.size, bool)
    for i in range(x.size):
        if mask[i]:
            counts[i] = np.sum(mask[: i + 1] & (x[: i + 1] == x[i]))
            last[i] = not np.any(mask[i + 1 :] & (x[i + 1 :] == x[i]))
    return counts, last


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_scan_count_counts_duplicates_up_to_each_lane(dtype: Any) -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        counts, last = plsc.scan_count((lane_keys(v_in[...]) % 3).astype(dtype))
        v_out[...] = counts * 2 + last.astype(jnp.int32)

    got, x, lanes = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        counts, last = scan_count_reference(keys_of(row) % 3, np.ones(lanes, bool))
        np.testing.assert_array_equal(got_row, counts * 2 + last)


def test_masked_scan_count_counts_only_valid_lanes() -> None:
    """An invalid lane counts 1 and is not counted; the output mask is left unused (what it
    holds in an invalid lane is not specified)."""

    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        keys = lane_keys(v_in[...])
        counts, _ = plsc.scan_count(keys % 3, mask=keys > -2)
        v_out[...] = counts

    got, x, _ = run_on_subcores("v5p", body)
    for row, got_row in zip(x, got, strict=True):
        keys = keys_of(row)
        np.testing.assert_array_equal(got_row, scan_count_reference(keys % 3, keys > -2)[0])


@pytest.mark.parametrize(
    ("values", "masked", "match"),
    [
        ("ints", True, "output mask where the input mask has a false lane"),
        ("nan", False, "holding a NaN, or both"),
        ("zeros", False, "holding a NaN, or both"),
    ],
)
def test_scan_count_cases_the_docs_leave_open_raise(values: str, masked: bool, match: str) -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        x = v_in[...]
        if values == "nan":
            x = jnp.where(x > 0, jnp.nan, 1.0)
        elif values == "zeros":
            x = jnp.where(x > 0, 0.0, -0.0)
        counts, last = plsc.scan_count(x, mask=x != 2 if masked else None)
        v_out[...] = counts + last.astype(jnp.int32)

    with pytest.raises(NotSimulatedError, match=match):
        run_on_subcores("v5p", body)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("scalar load", "To load a scalar from VMEM"),
        ("scalar store", "Trying to swap a scalar in VMEM"),
        ("column store", "Integer indexing of refs that follows a non-trivial slice"),
        ("strided load", "only supports slices with stride 1"),
    ],
)
def test_loads_and_stores_mosaic_refuses_on_a_vector_subcore_are_refused(
    case: str, match: str
) -> None:
    """sc_lowering.py refuses these in a vector subcore kernel; the interpreter would run them."""
    with simulate(chip="v5p", devices=1) as sim:

        def kernel(x_hbm: Any, o_hbm: Any, v: Any, grid: Any) -> None:
            pltpu.sync_copy(x_hbm, v)
            if case == "scalar load":
                v[...] = jnp.full((8,), v[3])
            elif case == "scalar store":
                v[3] = 1
            elif case == "column store":
                grid[:, 1] = v[...]
            else:
                v[pl.ds(0, 4)] = v[pl.ds(0, 4, stride=2)]
            pltpu.sync_copy(v, o_hbm)

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        x = jnp.arange(8, dtype=jnp.int32)
        scratch = [pltpu.VMEM((8,), jnp.int32), pltpu.VMEM((8, 4), jnp.int32)]
        f = jax.jit(pl.kernel(kernel, out_type=x, mesh=mesh, scratch_types=scratch))
        with pytest.raises(cc.UnsupportedOnChipError, match=match) as info:
            sim.run(f, x)
        assert info.value.chip == "v5p"


def test_row_stores_and_vector_loads_on_a_vector_subcore_run() -> None:
    """What Mosaic takes: whole vectors at a dynamic offset, a row of a 2-D buffer, scalars in
    SMEM."""
    with simulate(chip="v5p", devices=1) as sim:

        def kernel(x_hbm: Any, o_hbm: Any, v: Any, grid: Any, s: Any) -> None:
            pltpu.sync_copy(x_hbm, v.at[pl.ds(0, 8)])
            s[0] = 5
            grid[1, :] = v[pl.ds(s[0] - 5, 8)] * 2
            pltpu.sync_copy(grid.at[1], o_hbm)

        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1, num_subcores=1
        )
        x = jnp.arange(8, dtype=jnp.int32)
        scratch = [
            pltpu.VMEM((16,), jnp.int32),
            pltpu.VMEM((4, 8), jnp.int32),
            pltpu.SMEM((1,), jnp.int32),
        ]
        f = jax.jit(pl.kernel(kernel, out_type=x, mesh=mesh, scratch_types=scratch))
        np.testing.assert_array_equal(np.asarray(sim.run(f, x)), np.arange(8) * 2)


def test_pack_with_the_layout_passes_is_refused_where_mosaic_refuses_it() -> None:
    from jax._src.pallas.mosaic import sc_primitives

    def body(x: Any) -> Any:
        return plsc.unpack(
            plsc.pack(x, x, format=plsc.PackFormat.INTERLEAVED), format=plsc.PackFormat.INTERLEAVED
        )

    x = jnp.arange(8, dtype=jnp.float32)
    spec = jax.ShapeDtypeStruct((8,), jnp.float32)
    import inspect

    if "needs_layout_passes" in inspect.getsource(sc_primitives._pack_lowering_rule):
        # jax >= 0.11: "plsc.pack is not supported with needs_layout_passes=True"
        with pytest.raises(cc.UnsupportedOnChipError, match="needs_layout_passes=True"):
            run_vector(body, x, out=(spec, spec), layout_passes=True)
    else:  # jax 0.10.2's lowering takes it
        got = run_vector(body, x, out=(spec, spec), layout_passes=True)
        np.testing.assert_array_equal(got[0], np.arange(8))
