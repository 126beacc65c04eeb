"""Patch ``semaphore_read`` on every supported jax line: ``pl.semaphore_read`` returns the count
the semaphore holds for the reading core (hand counts); a DMA semaphore reads 0 once its copies
are waited for, and reading one with a copy in flight is a SimulationFault at the user's line.
Stock (the patch off), no interpreter rule exists and the kernel is refused by name."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.core import jax_compat
from coremesh.testing.sim import NotSimulatedError, SimulationFault, simulate

pytestmark = pytest.mark.sim

ROWS, COLS = 2, 3
X = np.arange(8 * 128, dtype=np.int32).reshape(8, 128)


def read_regular() -> Any:
    """Signal each semaphore of a (2, 3) array by 10 + its flat index, read it, then wait."""

    def kernel(y_ref: Any) -> None:
        def body(sems: Any) -> None:
            for r in range(ROWS):
                for c in range(COLS):
                    v = 10 + r * COLS + c
                    pl.semaphore_signal(sems.at[r, c], v)
                    y_ref[r, c] = pl.semaphore_read(sems.at[r, c])
                    pl.semaphore_wait(sems.at[r, c], v)

        pl.run_scoped(body, pltpu.SemaphoreType.REGULAR((ROWS, COLS)))

    return pl.pallas_call(
        kernel,
        out_specs=pl.BlockSpec(memory_space=pltpu.SMEM),
        out_shape=jax.ShapeDtypeStruct((ROWS, COLS), jnp.int32),
    )()


def dma_then_read(kernel: Any) -> tuple[Any, Any]:
    """``kernel(x_hbm, y_hbm, value_smem, dma_sem)`` on ``X``: (y, value)."""
    return pl.pallas_call(  # type: ignore[no-any-return]
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pltpu.SMEM)],
            scratch_shapes=[pltpu.SemaphoreType.DMA],
        ),
        out_shape=[
            jax.ShapeDtypeStruct(X.shape, jnp.int32),
            jax.ShapeDtypeStruct((1, 1), jnp.int32),
        ],
    )(jnp.asarray(X))


def read_after_wait(x_hbm: Any, y_hbm: Any, value: Any, sem: Any) -> None:
    value[0, 0] = 123
    pltpu.async_copy(x_hbm, y_hbm, sem).wait()
    value[0, 0] = pl.semaphore_read(sem)


def read_in_flight(x_hbm: Any, y_hbm: Any, value: Any, sem: Any) -> None:
    copy = pltpu.async_copy(x_hbm, y_hbm, sem)
    value[0, 0] = pl.semaphore_read(sem)  # the chip's DMA progress, in its own units
    copy.wait()


def test_a_regular_semaphore_reads_its_count() -> None:
    with simulate("v5p", devices=1):
        y = read_regular()
    np.testing.assert_array_equal(np.asarray(y), 10 + np.arange(ROWS * COLS).reshape(ROWS, COLS))


def test_a_dma_semaphore_reads_zero_once_its_copy_is_waited_for() -> None:
    with simulate("v5p", devices=1):
        y, value = dma_then_read(read_after_wait)
    np.testing.assert_array_equal(np.asarray(y), X)
    np.testing.assert_array_equal(np.asarray(value), [[0]])


def test_a_dma_semaphore_read_with_its_copy_in_flight_is_a_fault_at_the_line() -> None:
    with (
        simulate("v5p", devices=1),
        pytest.raises(SimulationFault, match=r"pl\.semaphore_read of a DMA semaphore") as caught,
    ):
        dma_then_read(read_in_flight)
    err = caught.value
    assert err.location is not None and re.search(r"test_semaphore_read\.py:\d+", err.location)
    assert "copy.wait()" in str(err)


@pytest.mark.parametrize("fast_path", [True, False])
def test_each_core_reads_its_own_count(fast_path: bool) -> None:
    """On v5p's two TensorCores each core signals its own semaphore by 3 + its index, reads it
    (3 and 4), waits, copies its row in and writes the count plus its DMA semaphore's (0)."""

    def kernel(x_hbm: Any, o_hbm: Any, sem: Any, dma_sem: Any, buf: Any) -> None:
        core = jax.lax.axis_index("core")
        pl.semaphore_signal(sem, core + 3)
        count = pl.semaphore_read(sem)
        pl.semaphore_wait(sem, core + 3)
        pltpu.async_copy(x_hbm.at[core], buf, dma_sem).wait()
        buf[...] = buf[...] + count + pl.semaphore_read(dma_sem)
        pltpu.async_copy(buf, o_hbm.at[core], dma_sem).wait()

    xs = np.arange(2 * 8 * 128, dtype=np.int32).reshape(2, 8, 128)
    with simulate("v5p", devices=1, fast_path=fast_path):
        mesh = jax_compat.tensorcore_mesh("core")
        run = pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct(xs.shape, jnp.int32),
            mesh=mesh,
            scratch_types=[
                pltpu.SemaphoreType.REGULAR(()),
                pltpu.SemaphoreType.DMA(()),
                pltpu.VMEM((8, 128), jnp.int32),
            ],
        )
        y = jax.jit(run)(jnp.asarray(xs))
    np.testing.assert_array_equal(np.asarray(y), xs + np.array([3, 4])[:, None, None])


def test_each_vector_subcore_reads_its_own_count() -> None:
    """The 16 vector subcores of a SparseCore run as grid steps of one interpreter core, each
    with its own scratch semaphore: subcore s signals 5 + s and reads 5 + s."""

    def body(o_hbm: Any, sem: Any, buf: Any) -> None:
        s = jax.lax.axis_index("subcore")
        pl.semaphore_signal(sem, s + 5)
        count = pl.semaphore_read(sem)
        pl.semaphore_wait(sem, s + 5)
        buf[...] = jnp.full(buf.shape, count, jnp.int32)
        pltpu.sync_copy(buf, o_hbm.at[s])

    with simulate("v5p", devices=1):
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        n, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes
        run = pl.kernel(
            body,
            out_type=jax.ShapeDtypeStruct((n, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.SemaphoreType.REGULAR(()), pltpu.VMEM((lanes,), jnp.int32)],
        )
        y = jax.jit(run)()
    np.testing.assert_array_equal(
        np.asarray(y), np.broadcast_to((5 + np.arange(n))[:, None], (n, lanes))
    )


def test_stock_has_no_rule_for_semaphore_read() -> None:
    # Without the patch the interpreter's fallback binds semaphore_read on the semaphore's id,
    # which XLA:CPU cannot lower: the simulator names the primitive where it compiles a core's
    # program (both of v5p's cores run the kernel without patch idle_cores).
    with (
        simulate("v5p", devices=1, disable_patches=["semaphore_read", "idle_cores"]),
        pytest.raises(NotSimulatedError, match="'semaphore_read' in this kernel is not simulated"),
    ):
        read_regular()
