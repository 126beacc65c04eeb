"""A kernel that waits for a signal nobody sends fails with SimulationDeadlock, then runs go on."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from coremesh.core import jax_compat
from coremesh.core.errors import DeadlockError
from coremesh.testing.guide import PROGRAMS
from coremesh.testing.sim import SimulationDeadlock, simulate

pytestmark = pytest.mark.sim

DEADLINE = 2.0


def waits_on_core_1(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    @pl.when(jax.lax.axis_index("core") == 1)
    def _() -> None:
        pl.semaphore_wait(sem, 1)


def signals_wrong_device(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    """Every device signals itself, but waits for 2 signals: a classic miscount."""
    me = jax.lax.axis_index("device")
    pl.semaphore_signal(sem, 1, device_id={"device": me})
    pl.semaphore_wait(sem, 2)


def build(mesh: jax.sharding.Mesh, body: Any) -> Any:
    spec = jax.P("device", None)

    @jax.jit
    @partial(jax.shard_map, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)
    def f(x: Any) -> Any:
        return pl.kernel(
            body,
            out_type=x,
            mesh=jax_compat.tensorcore_mesh("core"),
            scratch_types=[pltpu.SemaphoreType.REGULAR],
        )(x)

    return f


def zeros(mesh: jax.sharding.Mesh) -> jax.Array:
    x = jnp.zeros((8 * mesh.size, 128), jnp.float32)
    return jax.device_put(x, jax.NamedSharding(mesh, jax.P("device", None)))


@pytest.mark.parametrize("devices", [1, 4])
def test_unsignalled_wait_raises_naming_device_core_and_semaphore(devices: int) -> None:
    with simulate(chip="v5p", devices=devices, deadline=DEADLINE) as sim:
        mesh = sim.mesh()
        f = build(mesh, waits_on_core_1)
        start = time.monotonic()
        with pytest.raises(SimulationDeadlock) as info:
            f(zeros(mesh))
        elapsed = time.monotonic() - start
        err = info.value
        assert isinstance(err, DeadlockError)
        assert elapsed >= DEADLINE  # no upper bound: a loaded machine may take any time
        assert err.core == 1
        assert 0 <= err.device < devices
        assert (err.count, err.needed) == (0, 1)
        assert "semaphore #0 of the kernel" in err.semaphore
        assert f"device {err.device}, core 1 waits on semaphore #0" in str(err)
        # Every other device's core 1 is stuck the same way, and the error says so.
        assert len(err.blocked) == devices - 1
        assert err.chip == "v5p"

        # The interpreter was reset: the guide's swap runs right after, in the same context.
        program = PROGRAMS["swap_kernel"]
        inputs = program.make_inputs(mesh)
        got = np.asarray(program.build(mesh)(*inputs))
        np.testing.assert_array_equal(got, program.expected(*map(np.asarray, inputs)))


def test_miscounted_signals_deadlock_on_every_device() -> None:
    with simulate(chip="v5e", devices=2, deadline=DEADLINE) as sim:
        mesh = sim.mesh()
        with pytest.raises(SimulationDeadlock) as info:
            build(mesh, signals_wrong_device)(zeros(mesh))
        assert (info.value.count, info.value.needed) == (1, 2)
        assert info.value.core == 0


def waits_but_device_0(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
    @pl.when(jax.lax.axis_index("device") != 0)
    def _() -> None:
        pl.semaphore_wait(sem, 1)


def test_a_deadlock_beside_a_device_that_finished_is_reported_not_hung() -> None:
    # Device 0 ends its kernel; devices 1-3 deadlock. Each failing device must reach the
    # interpreter's clean-up barrier exactly once: a failure reported twice by stacked wrappers
    # of one callback (fixed in patch kernel_semaphores' wait) left this waiting forever.
    with simulate(chip="v5e", devices=4, deadline=DEADLINE) as sim:
        mesh = sim.mesh()
        with pytest.raises(SimulationDeadlock) as info:
            build(mesh, waits_but_device_0)(zeros(mesh))
        assert info.value.device != 0
        assert len(info.value.blocked) == 2


def deadlock_in_a_context() -> None:
    with simulate(chip="v5p", devices=2, deadline=DEADLINE) as sim:
        mesh = sim.mesh()
        build(mesh, waits_on_core_1)(zeros(mesh))


def test_a_deadlock_leaves_the_context_as_itself_and_the_next_context_works() -> None:
    with pytest.raises(SimulationDeadlock):
        deadlock_in_a_context()
    with simulate(chip="v5p", devices=2) as sim:  # and the next context works
        mesh = sim.mesh()
        program = PROGRAMS["swap_core_map"]
        inputs = program.make_inputs(mesh)
        got = np.asarray(sim.run(program.build(mesh), *inputs))
        np.testing.assert_array_equal(got, program.expected(*map(np.asarray, inputs)))


def test_a_slow_but_live_kernel_is_not_a_deadlock() -> None:
    """Core 1 waits for core 0, which works for 5 x 0.2 s first (a host callback standing in
    for a long computation). The wait lasts twice the deadline, but core 0 keeps making
    progress, so it is not a deadlock."""

    def slow_step(v: np.ndarray) -> np.ndarray:
        time.sleep(0.2)
        return np.asarray(v, np.int32)

    def body(x_hbm: Any, o_hbm: Any, sem: Any) -> None:
        core = jax.lax.axis_index("core")

        @pl.when(core == 0)
        def _() -> None:
            def step(i: Any, v: Any) -> Any:
                return io_callback(slow_step, jax.ShapeDtypeStruct((), jnp.int32), v)

            done = jax.lax.fori_loop(0, 5, step, jnp.int32(0))
            pltpu.sync_copy(x_hbm, o_hbm)
            pl.semaphore_signal(sem, 1 + 0 * done, core_index=1)  # after the last step

        @pl.when(core == 1)
        def _() -> None:
            pl.semaphore_wait(sem, 1)

    with simulate(chip="v5p", devices=1, deadline=0.5) as sim:
        mesh = sim.mesh()
        x = jax.device_put(
            jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128),
            jax.NamedSharding(mesh, jax.P("device", None)),
        )
        start = time.monotonic()
        got = np.asarray(sim.run(build(mesh, body), x))
        assert time.monotonic() - start >= 1.0  # by construction: 5 sleeps of 0.2 s
        np.testing.assert_array_equal(got, np.asarray(x))
