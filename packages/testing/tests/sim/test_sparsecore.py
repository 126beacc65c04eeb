"""SparseCore primitives on the simulator: simulated against numpy, or refused clearly."""

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

import coremesh.core as cc
from coremesh.core import jax_versions
from coremesh.testing.sim import NotSimulatedError, simulate

pytestmark = pytest.mark.sim

Body = Callable[[Any, Any, Any, Any], None]


def run_on_subcores(chip: str, body: Body) -> tuple[np.ndarray, np.ndarray, int]:
    """Each vector subcore w copies its L lanes of x to VMEM, runs body, copies back."""
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

    got, x, lanes = run_on_subcores("v5p", body)
    want = x * 2 + (np.arange(x.shape[0]) % 16)[:, None]
    want[:, 0] = sum(range(0, lanes, 4))
    np.testing.assert_array_equal(got, want)


def test_out_of_range_gather_index_raises() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        v_out[...] = plsc.load_gather(v_in, [reversed_lanes(lanes) + 1])

    with pytest.raises(IndexError, match=r"load_gather: lane 0 indexes 8 in dimension 0"):
        run_on_subcores("v5p", body)


@pytest.mark.parametrize(
    ("name", "body"),
    [("plsc.subcore_barrier", lambda vi, vo, w, n: plsc.subcore_barrier())],
)
def test_unsimulated_primitives_are_refused(name: str, body: Body) -> None:
    with pytest.raises(NotSimulatedError, match=f"{name} is not simulated") as info:
        run_on_subcores("v5p", body)
    assert "compile-only target" in str(info.value)


def test_bitcast() -> None:
    def body(v_in: Any, v_out: Any, w: Any, lanes: int) -> None:
        as_float = plsc.bitcast(v_in[...], jnp.float32)
        v_out[...] = plsc.bitcast(jnp.abs(as_float), jnp.int32)  # clears the sign bit

    if jax_versions.at_least("0.12.0"):
        # plsc.bitcast is pltpu.bitcast(dim=-1) from jax 0.12, which the interpreter runs.
        got, x, _ = run_on_subcores("v5p", body)
        np.testing.assert_array_equal(got, x & 0x7FFFFFFF)
    else:  # its own SparseCore primitive, with no interpreter rule
        with pytest.raises(NotSimulatedError, match=r"plsc\.bitcast is not simulated"):
            run_on_subcores("v5p", body)


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

        with pytest.raises(Exception, match="lane 3 indexes 16 in dimension 0"):
            indexed_dma(sim, gather, table, idx, 8)


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


def test_dma_with_add_is_refused() -> None:
    """The stock interpreter ignores add=True and overwrites: refused, never silently wrong."""
    with simulate(chip="v5p", devices=1) as sim:
        table = jnp.ones((16, 128), jnp.float32)
        idx = jnp.arange(8, dtype=jnp.int32)

        def add(t: Any, i: Any, o: Any, rows: Any, sem: Any, n: int) -> None:
            pltpu.sync_copy(t.at[pl.ds(0, n)], rows)
            pltpu.async_copy(rows, o.at[pl.ds(0, n)], sem, add=True).wait()

        with pytest.raises(NotSimulatedError, match="add=True is not simulated"):
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
        v_out[...] = jnp.tile(plsc.all_reduce_ffs(v_in[...] > 0, reduce=2), 2)

    with pytest.raises(NotSimulatedError, match="reduce=2"):
        run_on_subcores("v5p", body)
