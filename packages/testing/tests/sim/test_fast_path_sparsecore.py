"""SparseCore vector subcore kernels on the compiled fast path: each subcore a point of the
kernel's named grid, its indexed DMAs (gathers and scatters) one XLA gather or scatter each;
where the order of the rows could show, or a check has something to say, the interpreter's run in
the same program gives the result or the error, so both paths agree."""

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

from coremesh.testing.sim import SimulationFault, Simulator, simulate

pytestmark = pytest.mark.sim

WINDOW = 16  # rows per gather or scatter
TABLE_ROWS, DIM = 64, 128
THEN_INTERPRETED = "compiled, then interpreted: "


def only_path(sim: Simulator) -> str:
    (path,) = set(sim.paths.values())
    return path


def subcores() -> int:
    info = pltpu.get_tpu_info().sparse_core
    return int(info.num_cores * info.num_subcores)


def gather(table: Any, indices: Any) -> Any:
    """JAX's SparseCore guide's gather: each subcore pipelines windows of indices into its VMEM
    and gathers their rows from HBM with one indexed DMA per window."""
    n = indices.shape[0]
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")

    @pl.kernel(out_type=jax.ShapeDtypeStruct((n, DIM), table.dtype), mesh=mesh)
    def kernel(x_hbm: Any, i_hbm: Any, o_hbm: Any) -> None:
        def body(i_vmem: Any, o_vmem: Any) -> None:
            pltpu.sync_copy(x_hbm.at[i_vmem.at[0]], o_vmem)

        pltpu.emit_pipeline(
            body,
            grid=(n // WINDOW,),
            in_specs=[pl.BlockSpec((1, WINDOW), index_map=lambda i: (0, i))],
            out_specs=[pl.BlockSpec((WINDOW, DIM), index_map=lambda i: (i, 0))],
            core_axis_name="subcore",
            dimension_semantics=(pltpu.PARALLEL,),
        )(i_hbm, o_hbm)

    return kernel(table, indices.reshape(1, n))


def scatter(rows: Any, indices: Any) -> Any:
    """The guide's scatter: each window of rows goes to HBM at its indices, one DMA each."""
    n = indices.shape[0]
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")

    @pl.kernel(out_type=jax.ShapeDtypeStruct((TABLE_ROWS, DIM), rows.dtype), mesh=mesh)
    def kernel(x_hbm: Any, i_hbm: Any, o_hbm: Any) -> None:
        def body(x_vmem: Any, i_vmem: Any) -> None:
            pltpu.sync_copy(x_vmem, o_hbm.at[i_vmem.at[0]])

        pltpu.emit_pipeline(
            body,
            grid=(n // WINDOW,),
            in_specs=[
                pl.BlockSpec((WINDOW, DIM), index_map=lambda i: (i, 0)),
                pl.BlockSpec((1, WINDOW), index_map=lambda i: (0, i)),
            ],
            out_specs=[],
            core_axis_name="subcore",
            dimension_semantics=(pltpu.PARALLEL,),
        )(x_hbm, i_hbm)

    return kernel(rows, indices.reshape(1, n))


def coordinates(out_shape: Any) -> Callable[..., Any]:
    """Each subcore writes (core, subcore, its flat index) into its own row by DMA."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore")

    @pl.kernel(out_type=out_shape, mesh=mesh)
    def kernel(o_hbm: Any) -> None:
        core = jax.lax.axis_index("core")
        sub = jax.lax.axis_index("subcore")
        flat = core * jax.lax.axis_size("subcore") + sub

        def body(buf: Any, sem: Any) -> None:
            lane = jax.lax.broadcasted_iota(jnp.int32, (1, 16), 1)
            buf[...] = jnp.where(lane == 0, core, jnp.where(lane == 1, sub, flat))
            copy = pltpu.make_async_copy(buf, o_hbm.at[pl.ds(flat, 1)], sem)
            copy.start()
            copy.wait()

        pl.run_scoped(body, pltpu.VMEM((1, 16), jnp.int32), pltpu.SemaphoreType.DMA(()))

    made: Callable[..., Any] = kernel
    return made


def run(chip: str, fn: Callable[..., Any], *args: Any, fast: bool) -> tuple[np.ndarray, Any]:
    with simulate(chip, 1, fast_path=fast) as sim:
        out = np.asarray(sim.run(jax.jit(fn), *args))
    return out, sim


def table(dtype: Any = jnp.float32) -> np.ndarray:
    return (np.arange(TABLE_ROWS * DIM).reshape(TABLE_ROWS, DIM) * 0.5).astype(dtype)


@pytest.mark.parametrize(("chip", "dtype"), [("TPU7x", jnp.float32), ("v5p", jnp.int32)])
def test_the_guides_gather_runs_compiled_and_matches_take_and_the_interpreter(
    chip: str, dtype: Any
) -> None:
    with simulate(chip, 1):
        n = 2 * WINDOW * subcores()  # two windows per subcore
    indices = np.random.default_rng(0).integers(0, TABLE_ROWS, n).astype(np.int32)
    x = table(dtype)
    fast, sim = run(chip, gather, x, indices, fast=True)
    assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(fast, np.take(x, indices, axis=0))
    slow, sim = run(chip, gather, x, indices, fast=False)
    assert only_path(sim).startswith("interpreted")
    np.testing.assert_array_equal(fast, slow)


def test_a_scatter_with_repeated_indices_of_the_same_rows_runs_compiled() -> None:
    # The guide's round trip: rows gathered by random (repeating) indices go back where they
    # came from; every copy of a row writes the same data, so no order can show.
    with simulate("TPU7x", 1):
        n = 4 * WINDOW * subcores()
    indices = np.random.default_rng(1).integers(0, TABLE_ROWS, n).astype(np.int32)
    assert len(set(indices.tolist())) == TABLE_ROWS  # every row of the table is written
    x = table()
    out, sim = run("TPU7x", scatter, np.take(x, indices, axis=0), indices, fast=True)
    assert only_path(sim) == "compiled"
    np.testing.assert_array_equal(out, x)


def test_a_scatter_whose_repeated_indices_carry_different_rows_is_the_interpreters() -> None:
    # Which of two rows one DMA sends to one place lands last is the order of its rows: the
    # compiled scatter does not vouch for it, and the interpreter's result is the call's.
    with simulate("TPU7x", 1):
        n = WINDOW * subcores()
    indices = np.arange(n, dtype=np.int32) % (WINDOW // 2)  # each index twice in a window
    rows = np.random.default_rng(2).standard_normal((n, DIM)).astype(np.float32)
    fast, sim = run("TPU7x", scatter, rows, indices, fast=True)
    path = only_path(sim)  # (the rows no index names are unwritten too)
    assert path.startswith(THEN_INTERPRETED)
    assert "an indexed DMA writing different data to one element" in path
    slow, _ = run("TPU7x", scatter, rows, indices, fast=False)
    np.testing.assert_array_equal(fast, slow)
    # each place holds one of the rows sent to it (which one is the interpreter's order)
    for r in range(WINDOW // 2):
        sent = rows[indices == r]
        assert any(np.array_equal(fast[r], row) for row in sent), r


def test_an_index_outside_the_table_is_the_same_error_on_both_paths() -> None:
    with simulate("TPU7x", 1):
        n = WINDOW * subcores()
    indices = np.zeros(n, np.int32)
    indices[5] = TABLE_ROWS  # one past the last row
    for fast in (True, False):
        with simulate("TPU7x", 1, fast_path=fast) as sim:
            with pytest.raises(SimulationFault, match="lane 5 indexes 64 in dimension 0"):
                sim.run(jax.jit(gather), table(), indices)
            if fast:
                (path,) = set(sim.paths.values())
                assert path == THEN_INTERPRETED + "an index outside its ref"


@pytest.mark.parametrize("chip", ["TPU7x", "v5p"])
def test_each_subcore_sees_its_own_core_and_subcore_index(chip: str) -> None:
    with simulate(chip, 1):
        info = pltpu.get_tpu_info().sparse_core
        cores, subs = int(info.num_cores), int(info.num_subcores)
    shape = jax.ShapeDtypeStruct((cores * subs, 16), jnp.int32)
    with simulate(chip, 1, fast_path=True) as sim:
        out = np.asarray(sim.run(jax.jit(coordinates(shape))))
    assert only_path(sim) == "compiled"
    flat = np.arange(cores * subs)
    expected = np.stack([flat // subs, flat % subs] + [flat] * 14, axis=1)
    np.testing.assert_array_equal(out, expected)
