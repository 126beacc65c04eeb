"""Patch ``subcore_barrier`` on every supported jax line: the vector subcores of a SparseCore
run at once, meet at ``plsc.subcore_barrier()``, share VMEM_SHARED and each keep their own VMEM;
results against numpy. A barrier some subcore never reaches is a named SimulationDeadlock;
stock (the patch off) the barrier is refused, since the subcores run one after the other."""

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

from coremesh.testing.sim import (
    NotSimulatedError,
    SimulationDeadlock,
    SimulationRaceError,
    Simulator,
    simulate,
)

pytestmark = pytest.mark.sim


def exchange(sim: Simulator, num_cores: int) -> tuple[np.ndarray, np.ndarray]:
    """Each subcore writes its id to its row of VMEM_SHARED, meets the others at a barrier, and
    reads its neighbour's row: (what came out, what numpy says)."""
    mesh = plsc.VectorSubcoreMesh(
        core_axis_name="core", subcore_axis_name="subcore", num_cores=num_cores
    )
    subcores, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes

    @pl.kernel(
        out_type=jax.ShapeDtypeStruct((num_cores, subcores, lanes), jnp.int32),
        mesh=mesh,
        scratch_types=[
            pltpu.VMEM((lanes,), jnp.int32),
            pltpu.VMEM_SHARED((subcores, lanes), jnp.int32),
        ],
    )
    def kernel(o_hbm: Any, vmem: Any, shared: Any) -> None:
        c, s = lax.axis_index("core"), lax.axis_index("subcore")
        vmem[...] = jnp.full((lanes,), c * 100 + s, jnp.int32)
        pltpu.sync_copy(vmem, shared.at[s])
        plsc.subcore_barrier()
        pltpu.sync_copy(shared.at[(s + 1) % subcores], vmem)
        plsc.subcore_barrier()  # the next SparseCore's writes wait for these reads
        pltpu.sync_copy(vmem, o_hbm.at[c, s])

    got = np.asarray(sim.run(jax.jit(kernel)))[..., 0]
    want = np.arange(num_cores)[:, None] * 100 + (np.arange(subcores)[None, :] + 1) % subcores
    return got, want


@pytest.mark.parametrize(("chip", "num_cores"), [("v5p", 1), ("v5p", 4), ("TPU7x", 2)])
def test_subcores_meet_at_the_barrier_and_share_vmem_shared(chip: str, num_cores: int) -> None:
    with simulate(chip, devices=1) as sim:
        got, want = exchange(sim, num_cores)
    np.testing.assert_array_equal(got, want)


def test_stock_refuses_the_barrier() -> None:
    # Without the patch the subcores take turns on one thread: the barrier is refused by name.
    with (
        simulate("v5p", devices=1, disable_patches=["subcore_barrier"]) as sim,
        pytest.raises(NotSimulatedError, match=r"plsc\.subcore_barrier is not simulated"),
    ):
        exchange(sim, 1)


def test_each_subcore_has_its_own_vmem() -> None:
    """Every subcore writes its id to the same VMEM scratch, meets the others, then reads it
    back: on the chip each subcore has a VMEM of its own, so each reads its own id."""
    with simulate("v5p", devices=1) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        subcores, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((subcores, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32)],
        )
        def kernel(o_hbm: Any, vmem: Any) -> None:
            s = lax.axis_index("subcore")
            vmem[...] = jnp.full((lanes,), s, jnp.int32)
            plsc.subcore_barrier()
            pltpu.sync_copy(vmem, o_hbm.at[s])

        got = np.asarray(sim.run(jax.jit(kernel)))
    np.testing.assert_array_equal(got, np.repeat(np.arange(subcores)[:, None], lanes, axis=1))


def test_a_barrier_in_a_loop_and_a_branch() -> None:
    """Barriers inside a loop body and a branch every subcore takes: a running sum, each round
    every subcore adding its neighbour's value from VMEM_SHARED."""
    rounds = 3
    with simulate("TPU7x", devices=1) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        subcores, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((subcores, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[
                pltpu.VMEM((lanes,), jnp.int32),
                pltpu.VMEM((lanes,), jnp.int32),
                pltpu.VMEM_SHARED((subcores, lanes), jnp.int32),
            ],
        )
        def kernel(o_hbm: Any, mine: Any, theirs: Any, shared: Any) -> None:
            s = lax.axis_index("subcore")
            mine[...] = jnp.full((lanes,), s, jnp.int32)

            @pl.loop(0, rounds)
            def _(i: Any) -> None:
                pltpu.sync_copy(mine, shared.at[s])
                plsc.subcore_barrier()
                pltpu.sync_copy(shared.at[(s + 1) % subcores], theirs)

                @pl.when(i >= 0)
                def _() -> None:
                    plsc.subcore_barrier()

                mine[...] = mine[...] + theirs[...]

            pltpu.sync_copy(mine, o_hbm.at[s])

        got = np.asarray(sim.run(jax.jit(kernel)))[:, 0]
    want = np.arange(subcores)
    for _ in range(rounds):
        want = want + np.roll(want, -1)
    np.testing.assert_array_equal(got, want)


def test_a_barrier_a_subcore_never_reaches_is_a_named_deadlock() -> None:
    with simulate("v5p", devices=1, deadline=2) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        lanes = pltpu.get_tpu_info().sparse_core.num_lanes

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((mesh.num_subcores, lanes), jnp.int32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((lanes,), jnp.int32)],
        )
        def kernel(o_hbm: Any, vmem: Any) -> None:
            s = lax.axis_index("subcore")

            @pl.when(s != 3)
            def _() -> None:
                plsc.subcore_barrier()

            vmem[...] = jnp.full((lanes,), s, jnp.int32)
            pltpu.sync_copy(vmem, o_hbm.at[s])

        with pytest.raises(SimulationDeadlock) as info:
            sim.run(jax.jit(kernel))
        err = info.value
        assert err.device == 0
        assert "plsc.subcore_barrier of SparseCore 0" in err.semaphore
        assert (err.count, err.needed) == (15, 16)
        # the process carries on: the same simulator runs a good kernel afterwards
        got, want = exchange(sim, 1)
    np.testing.assert_array_equal(got, want)


def test_a_race_after_the_barrier_is_named() -> None:
    """JAX's test_barrier reads its neighbour's output row after the barrier while the neighbour
    overwrites it, with nothing ordering the two (the chip's timing hides it): with races=True
    the simulator names the race."""
    with simulate("v5p", devices=1, races=True) as sim:
        mesh = plsc.VectorSubcoreMesh(
            core_axis_name="core", subcore_axis_name="subcore", num_cores=1
        )
        subcores, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes

        @pl.kernel(
            out_type=jax.ShapeDtypeStruct((subcores, lanes), jnp.uint32),
            mesh=mesh,
            scratch_types=[pltpu.VMEM((subcores, lanes), jnp.uint32)],
        )
        def kernel(o_ref: Any, vmem_ref: Any) -> None:
            s = lax.axis_index("subcore")
            vmem_ref[s] = jnp.full(lanes, s, dtype=jnp.uint32)
            pltpu.sync_copy(vmem_ref.at[s], o_ref.at[s])
            plsc.subcore_barrier()
            pltpu.sync_copy(o_ref.at[(s + 1) % subcores], vmem_ref.at[s])
            pltpu.sync_copy(vmem_ref.at[s], o_ref.at[s])

        with pytest.raises(SimulationRaceError):
            sim.run(jax.jit(kernel))


def on_devices(sim: Simulator) -> tuple[np.ndarray, np.ndarray]:
    """The exchange of :func:`exchange` (one SparseCore) on every device of ``sim`` at once."""
    mesh = plsc.VectorSubcoreMesh(core_axis_name="core", subcore_axis_name="subcore", num_cores=1)
    subcores, lanes = mesh.num_subcores, pltpu.get_tpu_info().sparse_core.num_lanes

    @pl.kernel(
        out_type=jax.ShapeDtypeStruct((subcores, lanes), jnp.int32),
        mesh=mesh,
        scratch_types=[
            pltpu.VMEM((lanes,), jnp.int32),
            pltpu.VMEM_SHARED((subcores, lanes), jnp.int32),
        ],
    )
    def kernel(o_hbm: Any, vmem: Any, shared: Any) -> None:
        s = lax.axis_index("subcore")
        vmem[...] = jnp.full((lanes,), s, jnp.int32)
        pltpu.sync_copy(vmem, shared.at[s])
        plsc.subcore_barrier()
        pltpu.sync_copy(shared.at[(s + 1) % subcores], vmem)
        pltpu.sync_copy(vmem, o_hbm.at[s])

    spec = jax.sharding.PartitionSpec("device")
    f = jax.jit(
        jax.shard_map(kernel, mesh=sim.mesh(), in_specs=(), out_specs=spec, check_vma=False)
    )
    got = np.asarray(sim.run(f))[:, 0]
    return got, np.tile((np.arange(subcores) + 1) % subcores, len(sim.devices))


def test_two_devices_at_once() -> None:
    with simulate("v5p", devices=2) as sim:
        got, want = on_devices(sim)
    np.testing.assert_array_equal(got, want)


def test_more_devices_than_blocked_callbacks_allow_are_refused() -> None:
    # 4 devices x 17 threads would stall XLA:CPU's blocked host callbacks (a false deadlock).
    with (
        simulate("v5p", devices=4) as sim,
        pytest.raises(NotSimulatedError, match="on 4 devices at once is not simulated"),
    ):
        on_devices(sim)
