"""races=True: the interpreter's race detector fails the run; ordered accesses pass."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.testing.sim import SimulationRaceError, simulate

pytestmark = pytest.mark.sim


def copy_kernel(variant: str) -> Any:
    def body(x_hbm: Any, o_hbm: Any, vmem: Any, sem: Any, rsem: Any) -> None:
        c = jax.lax.axis_index("core")
        own = pl.ds(c * 128, 128)
        pltpu.async_copy(x_hbm.at[:, own], vmem, sem).wait()
        vmem[...] = vmem[...] + 1
        if variant == "disjoint":
            pltpu.async_copy(vmem, o_hbm.at[:, own], sem).wait()
        elif variant == "same_block":  # both cores write columns 0..127: a write-write race
            pltpu.async_copy(vmem, o_hbm.at[:, pl.ds(0, 128)], sem).wait()
        else:  # core 0 writes slice 0; core 1 reads it, ordered by a semaphore or not

            @pl.when(c == 0)
            def _() -> None:
                pltpu.async_copy(vmem, o_hbm.at[:, pl.ds(0, 128)], sem).wait()
                if variant == "synced":
                    pl.semaphore_signal(rsem, 1, core_index=1)

            @pl.when(c == 1)
            def _() -> None:
                if variant == "synced":
                    pl.semaphore_wait(rsem, 1)
                pltpu.async_copy(o_hbm.at[:, pl.ds(0, 128)], vmem, sem).wait()
                pltpu.async_copy(vmem, o_hbm.at[:, pl.ds(128, 128)], sem).wait()

    return body


def run(variant: str, races: bool = True) -> np.ndarray:
    # An unordered reader may also read slice 0 before it is written; the race is the subject.
    with simulate(chip="v5p", devices=1, races=races, check_uninitialized=False) as sim:
        mesh = sim.mesh()
        spec = jax.P("device", None)

        @jax.jit
        @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
        def f(x: Any) -> Any:
            return pl.kernel(
                copy_kernel(variant),
                out_type=x,
                mesh=jax_compat.tensorcore_mesh("core"),
                scratch_types=[
                    pltpu.VMEM((x.shape[0], 128), jnp.float32),
                    pltpu.SemaphoreType.DMA,
                    pltpu.SemaphoreType.REGULAR,
                ],
            )(x)

        x = jnp.arange(16 * 256, dtype=jnp.float32).reshape(16, 256)
        return np.asarray(sim.run(f, jax.device_put(x, jax.NamedSharding(mesh, spec))))


def x_plus(n: int) -> np.ndarray:
    return np.arange(16 * 256, dtype=np.float32).reshape(16, 256) + n


def test_disjoint_slices_do_not_race() -> None:
    np.testing.assert_array_equal(run("disjoint"), x_plus(1))


def test_two_cores_writing_one_block_is_a_race() -> None:
    with pytest.raises(SimulationRaceError, match=r"data race\(s\) detected in 1 kernel run"):
        run("same_block")


def test_read_after_write_across_cores_without_sync_is_a_race() -> None:
    with pytest.raises(SimulationRaceError, match="no semaphore wait ordering them"):
        run("unsynced")


def test_semaphore_ordered_read_after_write_is_not_a_race() -> None:
    got = run("synced")
    np.testing.assert_array_equal(got[:, :128], x_plus(1)[:, :128])
    np.testing.assert_array_equal(got[:, 128:], x_plus(1)[:, :128])  # core 0's block, copied


def test_without_races_flag_a_racy_kernel_still_runs() -> None:
    got = run("same_block", races=False)
    assert got.shape == (16, 256)
