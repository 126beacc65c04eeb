"""Each core of a SparseCore mesh has its own scratch semaphores, though the simulator runs the
cores one after the other as grid steps of one kernel: a copy between devices per core lands
before its core reads it (against numpy, in both DMA modes), and a core waiting for a signal only
another core gave itself waits forever, as on the chip."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import tpu_sc as plsc

from coremesh.testing.sim import SimulationDeadlock, Simulator, simulate
from coremesh.testing.sim.simulator import DmaMode

pytestmark = pytest.mark.sim


def ring_shift(sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    """JAX's test_scs_remote_dma_spmem (HBM source): each SparseCore sends its block to the same
    core of the next device through shared VMEM, one send and one receive semaphore per core."""
    info = pltpu.get_tpu_info().sparse_core
    assert info is not None
    mesh = plsc.ScalarSubcoreMesh(axis_name="core", num_cores=info.num_cores)
    shape = (info.num_cores, info.num_subcores, info.num_lanes)

    @functools.partial(
        pl.kernel,
        mesh=mesh,
        out_type=jax.ShapeDtypeStruct((1, *shape), jnp.int32),
        scratch_types={
            "send": pltpu.SemaphoreType.DMA(()) @ mesh,
            "recv": pltpu.SemaphoreType.DMA(()) @ mesh,
            "landing": pltpu.VMEM_SHARED(shape, jnp.int32),
        },
    )
    def kernel(x_hbm: Any, o_hbm: Any, *, send: Any, recv: Any, landing: Any) -> None:
        me, n = jax.lax.axis_index("device"), jax.lax.axis_size("device")
        core = jax.lax.axis_index("core")
        pltpu.async_remote_copy(
            x_hbm.at[0, core],
            landing.at[core],
            send,
            recv,
            device_id={"device": jax.lax.rem(me + 1, n)},
        ).wait()
        pltpu.async_copy(landing.at[core], o_hbm.at[0, core], send).wait()

    spec = jax.P("device")

    @jax.jit
    @functools.partial(
        jax.shard_map, mesh=sim.mesh(), in_specs=spec, out_specs=spec, check_vma=False
    )
    def f(x: Any) -> Any:
        return kernel(jax.new_ref(x, memory_space=pltpu.HBM))

    size = sim.num_devices * int(np.prod(shape))
    x = np.arange(size, dtype=np.int32).reshape(sim.num_devices, *shape)
    y = sim.run(f, jax.device_put(x, jax.NamedSharding(sim.mesh(), spec)))
    return x, np.asarray(y)


@pytest.mark.parametrize("mode", ["on_wait", "eager"])
def test_copies_between_devices_land_per_core(mode: DmaMode) -> None:
    for _ in range(3):  # the shared semaphore failed when a device ran a core ahead
        with simulate("v5p", 4, dma_execution_mode=mode) as sim:
            x, y = ring_shift(sim)
        np.testing.assert_array_equal(y, np.roll(x, 1, axis=0))


def test_a_core_does_not_take_another_cores_signal() -> None:
    def kernel(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        core = jax.lax.axis_index("core")

        @pl.when(core == 0)
        def _() -> None:
            pl.semaphore_signal(sem, 1)  # core 0's own semaphore

        @pl.when(core == 1)
        def _() -> None:
            pl.semaphore_wait(sem, 1)  # core 1's: nobody signals it

    with simulate("v5p", 1, deadline=3) as sim:
        f = pl.kernel(
            kernel,
            out_type=jax.ShapeDtypeStruct((8,), jnp.int32),
            mesh=plsc.ScalarSubcoreMesh(axis_name="core", num_cores=2),
            scratch_types=[pltpu.SemaphoreType.REGULAR],
        )
        with pytest.raises(SimulationDeadlock):
            sim.run(jax.jit(f), jnp.zeros((8,), jnp.int32))
